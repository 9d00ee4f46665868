"""Any-precision bitplanes (Any-Precision LLM): the C quantizer and bytes through ctypes.

One matrix is quantized per output row to a *parent* precision P (default 8) whose codes nest: the top
b bits of a weight's P-bit code are its b-bit code, for every b from the *seed* precision S (default 3)
up to P, and every precision has its own table of 2^b centroids per row. So one file serves S..P bits.

* :func:`quantize`: seed (Fisher-weighted 1-D k-means of each row to 2^S centroids, the exact optimum)
  + incremental upscaling (each cluster split by its optimal weighted 2-means, one bit at a time), in
  our libggml-base (``formats/anyprec/anyprec.c``), rows split over threads;
* :func:`pack` / :func:`pack_tables`: the file's bytes, bitplanes plane-major over the whole tensor
  (precision b reads the first b planes: one contiguous prefix) and fp16 tables precision-major
  (docs/formats/anyprec.md);
* :func:`dequantize`, :func:`gemv_ref`: precision b from those bytes (the C reference).

:func:`unpack_numpy` and :func:`dequantize_numpy` are independent numpy twins the tests hold the C
code against.

    >>> import numpy as np
    >>> from ggml_ext import anyprec
    >>> x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    >>> codes, tables = anyprec.quantize(x)                  # 8-bit codes, tables for 3..8 bits
    >>> planes, t16 = anyprec.pack(codes), anyprec.pack_tables(tables)
    >>> anyprec.dequantize(planes, t16, 64, bits=4).shape
    (4, 64)
"""
from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from .. import formats

__all__ = ["AnyPrecError", "QK", "SEED_BITS", "PARENT_BITS", "REFINE", "quantize", "row_table_len", "table", "sse",
           "pack", "pack_tables", "table_offset", "dequantize", "gemv_ref", "unpack_numpy", "dequantize_numpy",
           "planes_bytes", "tables_bytes", "parse_bits", "planes_type"]


def planes_type(parent: int) -> str | None:
    """The registered type holding ``parent`` bitplanes (``APQ`` for 8), None when there is none."""
    return next((t.name for t in formats.family("anyprec") if t.layout == parent), None)


QK = 32            # n_per_row must be a multiple of this (whole 32-bit words per plane row)
SEED_BITS = 3
PARENT_BITS = 8
#: precisions above the seed refined jointly with it (GGML_EXT_ANYPREC_REFINE; 0: the paper's greedy upscaling)
REFINE = 2
#: extra starts of the refinement: also from the optimal partition at seed+1 .. seed+STARTS bits
#: (GGML_EXT_ANYPREC_STARTS); the start with the lowest joint objective wins
STARTS = 0
#: precision seed+i weighs GAIN**i in the refinement's joint objective (GGML_EXT_ANYPREC_GAIN; 1: plain sum)
GAIN = 1.0


class AnyPrecError(ValueError):
    """Rows, sensitivities or precisions the any-precision quantizer cannot take (names the tensor)."""


@lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    from .. import quants
    lib = quants.library()
    P, I64, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    sigs = {
        "ggml_ext_anyprec_quantize": ([P, P, I64, I64, I, I, P, P], I),
        "ggml_ext_anyprec_quantize_refined": ([P, P, I64, I64, I, I, I, P, P], I),
        "ggml_ext_anyprec_quantize_ex": ([P, P, I64, I64, I, I, I, I, ctypes.c_double, P, P], I),
        "ggml_ext_anyprec_row_table_len": ([I, I], I64),
        "ggml_ext_anyprec_planes_size": ([I, I64, I64], ctypes.c_size_t),
        "ggml_ext_anyprec_pack": ([P, I64, I64, I64, I64, I, P], I),
        "ggml_ext_anyprec_table_offset": ([I64, I, I], I64),
        "ggml_ext_anyprec_pack_tables": ([P, I64, I64, I64, I, I, P], I),
        "ggml_ext_anyprec_dequantize": ([P, P, I64, I64, I64, I64, I, I, I, P], I),
        "ggml_ext_anyprec_gemv_ref": ([P, P, I64, I64, I64, I64, I, I, P, P], I),
    }
    for name, (args, res) in sigs.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _check_bits(seed: int, parent: int) -> None:
    if not (1 <= seed <= parent <= 8):
        raise AnyPrecError(f"precisions must satisfy 1 <= seed ({seed}) <= parent ({parent}) <= 8")


def parse_bits(spec: str | int | tuple[int, int]) -> tuple[int, int]:
    """``"3-8"`` (or ``(3, 8)``, or ``8`` meaning seed 3) -> (seed, parent)."""
    if isinstance(spec, tuple):
        seed, parent = spec
    elif isinstance(spec, int):
        seed, parent = min(SEED_BITS, spec), spec
    else:
        try:
            lo, _, hi = str(spec).partition("-")
            seed, parent = (int(lo), int(hi)) if hi else (min(SEED_BITS, int(lo)), int(lo))
        except ValueError:
            raise AnyPrecError(f"--bits {spec!r}: write SEED-PARENT, e.g. 3-8") from None
    _check_bits(seed, parent)
    return seed, parent


def row_table_len(seed: int = SEED_BITS, parent: int = PARENT_BITS) -> int:
    """Floats per row of :func:`quantize`'s tables: 2^(P+1) - 2^S (504 for 3..8)."""
    return (1 << (parent + 1)) - (1 << seed)


def quantize(x: np.ndarray, w: np.ndarray | None = None, seed: int = SEED_BITS, parent: int = PARENT_BITS,
             threads: int | None = None, name: str = "rows", refine: int = REFINE, starts: int = STARTS,
             gain: float = GAIN) -> tuple[np.ndarray, np.ndarray]:
    """Seed + incremental upscaling of ``x`` (n_rows x n_per_row) with sensitivities ``w`` (same shape,
    non-negative, e.g. the Fisher diagonal; None: equal).

    ``refine`` R > 0 then adjusts the seed and the first R splits together (nesting kept) by coordinate
    descent on the summed weighted squared error of precisions seed..seed+R: the paper's greedy splits of
    the optimal seed land well above each precision's own optimum; the refinement gives up a fraction of
    a percent at the seed for several percent above it. ``refine=0`` is the paper's algorithm.
    ``starts`` T > 0 also starts the refinement from the optimal partitions at seed+1 .. seed+T bits (their
    coarser precisions by the nesting) and keeps the start of the lowest joint objective; ``gain`` g weighs
    precision seed+i by g**i in that objective (docs/formats/anyprec.md, step 3).

    Returns ``codes`` (uint8, n_rows x n_per_row, the parent-precision code of every weight) and
    ``tables`` (float32, n_rows x :func:`row_table_len`: per row the 2^b centroids of every precision b
    from seed to parent, precision-major; :func:`table` slices one precision)."""
    _check_bits(seed, parent)
    if int(refine) != refine or refine < 0:
        raise AnyPrecError(f"{name}: refine must be a non-negative integer, got {refine!r}")
    if int(starts) != starts or starts < 0:
        raise AnyPrecError(f"{name}: starts must be a non-negative integer, got {starts!r}")
    if not (np.isfinite(gain) and gain > 0):
        raise AnyPrecError(f"{name}: gain must be a positive number, got {gain!r}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] < 1:
        raise AnyPrecError(f"{name}: expected a non-empty 2-D matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise AnyPrecError(f"{name}: the weights hold NaN or infinite values")
    if w is not None:
        w = np.ascontiguousarray(w, dtype=np.float32)
        if w.shape != x.shape:
            raise AnyPrecError(f"{name}: sensitivities of shape {w.shape} for weights of shape {x.shape}")
        if not np.isfinite(w).all() or (w < 0).any():
            raise AnyPrecError(f"{name}: sensitivities must be finite and non-negative")
    n, k = x.shape
    codes = np.empty((n, k), dtype=np.uint8)
    tables = np.empty((n, row_table_len(seed, parent)), dtype=np.float32)
    lib = _lib()

    def run(lo: int, hi: int) -> None:
        if hi <= lo:
            return
        rc = lib.ggml_ext_anyprec_quantize_ex(_ptr(x[lo:]), None if w is None else _ptr(w[lo:]), hi - lo, k, seed,
                                          parent, int(refine), int(starts), float(gain), _ptr(codes[lo:]),
                                          _ptr(tables[lo:]))
        if rc != 0:
            raise AnyPrecError(f"{name}: the quantizer refused rows {lo}..{hi} (out of memory?)")

    threads = max(1, min(threads or os.cpu_count() or 1, n))
    if threads == 1:
        run(0, n)
    else:
        # more chunks than threads: rows of one matrix cost alike, but the pool then balances stragglers
        bounds = np.linspace(0, n, 4 * threads + 1).astype(int)
        with ThreadPoolExecutor(threads) as pool:  # ctypes releases the GIL during the C call
            list(pool.map(lambda i: run(bounds[i], bounds[i + 1]), range(len(bounds) - 1)))
    return codes, tables


def table(tables: np.ndarray, bits: int, seed: int = SEED_BITS) -> np.ndarray:
    """Precision ``bits``'s centroids (n_rows x 2^bits) out of :func:`quantize`'s float tables."""
    off = (1 << bits) - (1 << seed)
    return tables[:, off:off + (1 << bits)]


def sse(x: np.ndarray, w: np.ndarray | None, codes: np.ndarray, tables: np.ndarray, bits: int,
        seed: int = SEED_BITS, parent: int = PARENT_BITS) -> np.ndarray:
    """Per-row weighted squared error of precision ``bits`` (float64, n_rows)."""
    t = table(tables, bits, seed).astype(np.float64)
    deq = np.take_along_axis(t, (codes >> (parent - bits)).astype(np.int64), axis=1)
    e = (x.astype(np.float64) - deq) ** 2
    return (e if w is None else e * w).sum(axis=1)


def planes_bytes(n_rows: int, n_per_row: int, bits: int) -> int:
    """Bytes of the first ``bits`` planes of a tensor (what precision ``bits`` reads)."""
    return bits * n_rows * (n_per_row // 8)


def tables_bytes(n_rows: int, bits: int) -> int:
    """Bytes of precision ``bits``'s fp16 tables of a tensor."""
    return 2 * n_rows * (1 << bits)


def _check_row(n_per_row: int, name: str) -> None:
    if n_per_row % QK:
        raise AnyPrecError(f"{name}: rows of {n_per_row} weights; bitplanes need a multiple of {QK}")


def pack(codes: np.ndarray, parent: int = PARENT_BITS, name: str = "rows") -> np.ndarray:
    """Codes (n_rows x n_per_row) -> the tensor's bitplanes, uint8 (parent, n_rows, n_per_row / 8)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    n, k = codes.shape
    _check_row(k, name)
    planes = np.empty((parent, n, k // 8), dtype=np.uint8)
    if _lib().ggml_ext_anyprec_pack(_ptr(codes), 0, n, n, k, parent, _ptr(planes)) != 0:
        raise AnyPrecError(f"{name}: cannot pack {parent}-bit codes")
    return planes


def table_offset(n_rows: int, bits: int, seed: int = SEED_BITS) -> int:
    """Fp16 entries before precision ``bits``'s tables in the tensor's tables."""
    return n_rows * ((1 << bits) - (1 << seed))


def pack_tables(tables: np.ndarray, seed: int = SEED_BITS, parent: int = PARENT_BITS) -> np.ndarray:
    """Float tables of :func:`quantize` -> the tensor's fp16 tables, precision-major (1-D, uint16 bits)."""
    tables = np.ascontiguousarray(tables, dtype=np.float32)
    n = tables.shape[0]
    out = np.empty(n * row_table_len(seed, parent), dtype=np.uint16)
    if _lib().ggml_ext_anyprec_pack_tables(_ptr(tables), 0, n, n, seed, parent, _ptr(out)) != 0:
        raise AnyPrecError("cannot pack the tables")
    return out


def _shape(planes: np.ndarray, n_per_row: int) -> tuple[int, int]:
    """(planes held, n_rows) of a tensor's planes: (P, n_rows, n_per_row / 8) or a flat prefix of them."""
    _check_row(n_per_row, "planes")
    if planes.ndim == 3:
        return planes.shape[0], planes.shape[1]
    raise AnyPrecError("planes: pass the (planes, n_rows, n_per_row / 8) array")


def dequantize(planes: np.ndarray, tables16: np.ndarray, n_per_row: int, bits: int, seed: int = SEED_BITS
               ) -> np.ndarray:
    """Precision ``bits`` of a tensor as float32 (n_rows x n_per_row), from its first ``bits`` planes."""
    held, n = _shape(planes, n_per_row)
    if not (seed <= bits <= held):
        raise AnyPrecError(f"precision {bits}: the tensor holds {seed}..{held}")
    planes = np.ascontiguousarray(planes)
    tables16 = np.ascontiguousarray(tables16, dtype=np.uint16)
    y = np.empty((n, n_per_row), dtype=np.float32)
    if _lib().ggml_ext_anyprec_dequantize(_ptr(planes), _ptr(tables16), 0, n, n, n_per_row, seed, held, bits, _ptr(y)) != 0:
        raise AnyPrecError("cannot dequantize")
    return y


def gemv_ref(planes: np.ndarray, tables16: np.ndarray, x: np.ndarray, bits: int, seed: int = SEED_BITS
             ) -> np.ndarray:
    """y = W_b x with the C reference kernel (float32, n_rows)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    held, n = _shape(planes, x.shape[0])
    if not (seed <= bits <= held):
        raise AnyPrecError(f"precision {bits}: the tensor holds {seed}..{held}")
    planes = np.ascontiguousarray(planes)
    tables16 = np.ascontiguousarray(tables16, dtype=np.uint16)
    y = np.empty(n, dtype=np.float32)
    if _lib().ggml_ext_anyprec_gemv_ref(_ptr(planes), _ptr(tables16), 0, n, n, x.shape[0], seed, bits, _ptr(x), _ptr(y)) != 0:
        raise AnyPrecError("gemv refused its arguments")
    return y


def unpack_numpy(planes: np.ndarray, bits: int) -> np.ndarray:
    """numpy twin: the b-bit codes (n_rows x n_per_row) held in the first ``bits`` planes."""
    bitsarr = np.unpackbits(planes[:bits], axis=2, bitorder="little").astype(np.uint16)  # (b, n, k)
    codes = np.zeros(bitsarr.shape[1:], dtype=np.uint16)
    for k in range(bits):
        codes = (codes << 1) | bitsarr[k]
    return codes.astype(np.uint8)


def dequantize_numpy(planes: np.ndarray, tables16: np.ndarray, bits: int, seed: int = SEED_BITS) -> np.ndarray:
    """numpy twin of :func:`dequantize`."""
    n = planes.shape[1]
    off = table_offset(n, bits, seed)
    t = tables16[off:off + n * (1 << bits)].view(np.float16).astype(np.float32).reshape(n, 1 << bits)
    return np.take_along_axis(t, unpack_numpy(planes, bits).astype(np.int64), axis=1)
