"""Group-wise codebook types CB2 and CB3 (the Arm paper's fine-grained codebooks).

The bytes (docs/formats/codebooks.md): blocks of 256 weights, an fp16 super-scale ``d``, 16
sub-groups of 16 weights each with a 4-bit local scale ``l`` and a 2-bit codebook index ``c``,
and a 2-bit (CB2, 78 bytes, 2.4375 bpw) or 3-bit (CB3, 110 bytes, 3.4375 bpw) code ``q`` per
weight: ``w = d * (l + 1) * table[c][q]``. The tables are the built-in ones
(``codebooks_tables.h``), found by :mod:`ggml_ext.codebooks.discover` on real weights.

Quantize and dequantize run the scalar C reference in our libggml-base (ctypes);
:func:`dequantize_numpy` is its independent numpy twin (the tests hold them bit-exact).
As ggml types they are rows of ggml-ext's registry (:func:`ggml_ext.formats.family` ``("codebooks")``),
which the converter writes and our llama.cpp runs (docs/formats/codebooks.md).

    >>> import numpy as np
    >>> from ggml_ext import codebooks
    >>> x = np.random.default_rng(0).standard_normal((2, 512)).astype(np.float32)
    >>> q = codebooks.quantize(x, 2)           # uint8, shape (2, 2 * 78)
    >>> codebooks.dequantize(q, 2).shape
    (2, 512)
"""
from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

__all__ = ["CodebookError", "QK", "GROUP", "BLOCK_BYTES", "bits_per_weight", "tables", "tables_version",
           "quantize", "dequantize", "dequantize_numpy", "fake_quantize", "WEIGHTINGS"]

QK = 256
GROUP = 16
#: bytes per 256-weight block, per code width
BLOCK_BYTES = {2: 78, 3: 110}
#: error weightings of the quantizer: weight j's squared error counts importance[j] ("importance",
#: the C function's own), or importance[j] * sqrt(sigma2 + x_j^2) with sigma2 the block's mean x^2
#: ("sqrt_s2x2", ggml's Q2_K/Q3_K weighting with an imatrix; done here by handing the C function
#: each row's own importance vector, one row per call)
WEIGHTINGS = ("importance", "sqrt_s2x2")


class CodebookError(ValueError):
    """Rows or importance that the codebook types cannot take (names the tensor when given one)."""


def bits_per_weight(bits: int) -> float:
    return BLOCK_BYTES[_bits(bits)] * 8 / QK


def _bits(bits: int) -> int:
    if bits not in BLOCK_BYTES:
        raise CodebookError(f"codebook types have 2-bit (CB2) or 3-bit (CB3) codes, not {bits}")
    return bits


@lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    from .. import quants
    lib = quants.library()
    lib.ggml_ext_codebooks_tables_version.argtypes = []
    lib.ggml_ext_codebooks_tables_version.restype = ctypes.c_int
    lib.ggml_ext_codebooks_tables.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_ext_codebooks_tables.restype = ctypes.c_int
    lib.ggml_ext_codebooks_block_size.argtypes = [ctypes.c_int]
    lib.ggml_ext_codebooks_block_size.restype = ctypes.c_size_t
    lib.ggml_ext_codebooks_quantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_ext_codebooks_quantize.restype = ctypes.c_size_t
    lib.ggml_ext_codebooks_dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.ggml_ext_codebooks_dequantize.restype = ctypes.c_int
    return lib


def tables_version() -> int:
    """The version of the library's built-in tables."""
    return int(_lib().ggml_ext_codebooks_tables_version())


def tables(bits: int) -> np.ndarray:
    """The library's built-in tables: int8, shape (4 codebooks, 4 or 8 entries)."""
    n_e = 4 if _bits(bits) == 2 else 8
    out = np.zeros(4 * n_e, dtype=np.int8)
    if _lib().ggml_ext_codebooks_tables(bits, out.ctypes.data, out.size) != out.size:
        raise CodebookError(f"the library has no CB{bits} tables")
    return out.reshape(4, n_e)


def _check(rows: np.ndarray, importance: np.ndarray | None, name: str) -> None:
    where = f"tensor {name}: " if name else ""
    if rows.shape[-1] % QK:
        raise CodebookError(f"{where}rows of {rows.shape[-1]} weights are not a whole number of {QK}-weight blocks")
    if not np.isfinite(rows).all():
        r, c = (int(v) for v in np.argwhere(~np.isfinite(rows))[0])
        raise CodebookError(f"{where}{int((~np.isfinite(rows)).sum())} NaN or infinite values "
                            f"(first at row {r}, column {c}); refusing to quantize")
    if importance is not None:
        if importance.shape != (rows.shape[-1],):
            raise CodebookError(f"{where}importance has shape {importance.shape}, expected ({rows.shape[-1]},)")
        if not (np.isfinite(importance).all() and (importance >= 0).all()):
            raise CodebookError(f"{where}importance holds NaN, infinite or negative values; refusing to quantize")


def quantize(x: np.ndarray, bits: int, importance: np.ndarray | None = None, threads: int | None = None,
             name: str = "", weighting: str = "importance") -> np.ndarray:
    """Float rows (..., n_per_row; n_per_row a multiple of 256) -> CB2/CB3 bytes, uint8 (rows, row bytes).

    ``importance``: one non-negative weight per input column (an imatrix row: the activations'
    per-channel sum of x^2), or None for equal weights. Rows are split over ``threads`` (default:
    all cores); the result does not depend on the split. ``weighting``: a key of :data:`WEIGHTINGS`."""
    bits = _bits(bits)
    if weighting not in WEIGHTINGS:
        raise CodebookError(f"unknown weighting {weighting!r} (one of {', '.join(WEIGHTINGS)})")
    rows = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1, np.shape(x)[-1]))
    imp = None if importance is None else np.ascontiguousarray(np.asarray(importance, dtype=np.float32))
    _check(rows, imp, name)
    n, k = rows.shape
    row_bytes = k // QK * BLOCK_BYTES[bits]
    out = np.empty((n, row_bytes), dtype=np.uint8)
    lib = _lib()
    imp_ptr = None if imp is None else imp.ctypes.data

    def run(lo: int, hi: int) -> None:
        if weighting == "importance":
            if hi > lo and lib.ggml_ext_codebooks_quantize(bits, rows[lo].ctypes.data, out[lo].ctypes.data, hi - lo, k,
                                                    imp_ptr) != (hi - lo) * row_bytes:
                raise CodebookError(f"tensor {name or '?'}: the C quantizer refused rows {lo}..{hi}")
            return
        base = np.ones(k, np.float32) if imp is None else imp
        for r in range(lo, hi):  # sqrt_s2x2: each row its own importance vector
            x = rows[r].reshape(-1, QK)
            w = np.ascontiguousarray((base.reshape(-1, QK) * np.sqrt((x * x).mean(1, keepdims=True) + x * x)).ravel(),
                                     dtype=np.float32)
            if lib.ggml_ext_codebooks_quantize(bits, rows[r].ctypes.data, out[r].ctypes.data, 1, k, w.ctypes.data) != row_bytes:
                raise CodebookError(f"tensor {name or '?'}: the C quantizer refused row {r}")

    threads = max(1, min(threads or os.cpu_count() or 1, n))
    bounds = np.linspace(0, n, threads + 1).astype(int)
    if threads == 1:
        run(0, n)
    else:
        with ThreadPoolExecutor(threads) as pool:  # ctypes releases the GIL during the C call
            list(pool.map(run, bounds[:-1], bounds[1:]))
    return out


def dequantize(q: np.ndarray, bits: int) -> np.ndarray:
    """CB2/CB3 bytes (rows, row bytes) -> float32 (rows, row bytes / block bytes * 256), by the C reference."""
    bits = _bits(bits)
    q = np.ascontiguousarray(np.asarray(q, dtype=np.uint8))
    q2 = q.reshape(-1, q.shape[-1])
    if q2.shape[-1] % BLOCK_BYTES[bits]:
        raise CodebookError(f"rows of {q2.shape[-1]} bytes are not whole CB{bits} blocks of {BLOCK_BYTES[bits]}")
    nb = q2.size // BLOCK_BYTES[bits]
    out = np.empty((q2.shape[0], q2.shape[-1] // BLOCK_BYTES[bits] * QK), dtype=np.float32)
    if _lib().ggml_ext_codebooks_dequantize(bits, q2.ctypes.data, out.ctypes.data, nb) != 0:
        raise CodebookError(f"the C dequantizer refused CB{bits}")
    return out


def dequantize_numpy(q: np.ndarray, bits: int, table: np.ndarray | None = None) -> np.ndarray:
    """The numpy twin of :func:`dequantize`, written from the layout in docs/formats/codebooks.md."""
    bits = _bits(bits)
    table = tables(bits) if table is None else np.asarray(table, dtype=np.int8)
    q2 = np.asarray(q, dtype=np.uint8).reshape(-1, q.shape[-1])
    n_rows = q2.shape[0]
    blocks = q2.reshape(-1, BLOCK_BYTES[bits])
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]           # (nb,)
    s = np.arange(16)
    scales = (blocks[:, 2 + (s >> 1)] >> (4 * (s & 1))) & 15                      # (nb, 16)
    cb = (blocks[:, 10 + (s >> 2)] >> (2 * (s & 3))) & 3                          # (nb, 16)
    j = np.arange(16)
    qs_idx = 14 + 16 * (s[:, None] >> 2) + j[None, :]                             # (16, 16)
    code = (blocks[:, qs_idx] >> (2 * (s[:, None] & 3))) & 3                      # (nb, 16, 16)
    if bits == 3:
        hm_idx = 78 + 16 * (s[:, None] >> 3) + j[None, :]
        code = code | (((blocks[:, hm_idx] >> (s[:, None] & 7)) & 1) << 2)
    values = table[cb[:, :, None], code].astype(np.float32)                       # (nb, 16, 16)
    m = (d[:, None] * (scales + 1).astype(np.float32))[:, :, None]                # float32 product, as in C
    return (m * values).reshape(n_rows, -1)


def fake_quantize(x: np.ndarray, bits: int, importance: np.ndarray | None = None, threads: int | None = None,
                  name: str = "", weighting: str = "importance") -> np.ndarray:
    """dequantize(quantize(x)): the float values a CB2/CB3 tensor decodes to, in x's shape."""
    x = np.asarray(x, dtype=np.float32)
    return dequantize(quantize(x, bits, importance, threads, name, weighting), bits).reshape(x.shape)
