"""ggml's own quantizers, called through ctypes on our ``libggml-base``.

The converter and every other writer produce tensor bytes with these functions,
so what we write is bit for bit what our llama.cpp (``llama-quantize``, the
runtime) would produce from the same float32 rows.

    >>> import numpy as np
    >>> from ggml_ext import quants
    >>> w = np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32)
    >>> q = quants.quantize(w, "Q8_0")            # bytes, shape (4, row_size)
    >>> q.shape == (4, quants.row_size("Q8_0", 64))
    True

Only the public API of ``ggml.h`` is used: ``ggml_quantize_chunk``,
``ggml_quantize_init``, ``ggml_quantize_requires_imatrix``, ``ggml_row_size``,
``ggml_blck_size``, ``ggml_type_size``, ``ggml_type_name``,
``ggml_validate_row_data``, ``ggml_get_type_traits`` (its ``to_float``, for :func:`dequantize`); plus ``ggml_ext_format_version``,
``ggml_ext_repack_q4_0``, ``ggml_ext_unpack_q4_0``, ``ggml_ext_repack_iq4_nl``,
``ggml_ext_unpack_iq4_nl`` and ``ggml_ext_quantize_iq4_nl_weighted`` of our own sources.
``ggml_quantize_chunk`` also converts to F16 and BF16 (ggml's rounding), and F32
rows are copied as they are.

The interleaved Q4_0 types (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) go through the same
``ggml_quantize_chunk`` (our patched ggml hands them to ggml-ext's quantizer);
their row count must be divisible by the interleave factor N.
:func:`repack_q4_0` / :func:`unpack_q4_0` turn Q4_0 tensor bytes into an
interleaved layout and back, losslessly (``ggml_ext_repack_q4_0``). The interleaved
IQ4_NL types (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8) likewise, with plain IQ4_NL as the
source (:func:`repack_iq4_nl` / :func:`unpack_iq4_nl`).

IQ4_NL is the exception to "ggml's own bytes": by default it goes through ggml-ext's
quantizer (``ggml_ext_quantize_iq4_nl_weighted``: per block the exact minimiser of the
importance-weighted squared error, same block layout), ``quantizer="ggml"`` picks
ggml's ``quantize_iq4_nl``. Rows with NaN or infinity are refused with
:class:`QuantError` on our path (ggml's would write garbage scales).
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from . import _locate, formats

__all__ = [
    "QuantError", "library", "type_id", "blck_size", "type_size", "row_size", "type_name",
    "requires_imatrix", "quantize_rows_into", "quantize", "dequantize", "validate", "format_version",
    "INTERLEAVED", "INTERLEAVED_IQ4_NL", "CODEBOOKS", "repack_q4_0", "unpack_q4_0", "repack_iq4_nl", "unpack_iq4_nl",
    "IQ4_NL_WEIGHTINGS",
]

#: ggml-ext IQ4_NL error weightings (enum ggml_ext_iq4_nl_weighting): each weight's error counts
#: imatrix[col] (1 without one) times 1, x^2, sqrt(sigma2 + x^2) or sigma2 + x^2 (sigma2: the
#: block's mean x^2); "default" is sqrt_s2x2 (docs/RESULTS.md, "IQ4_NL").
IQ4_NL_WEIGHTINGS = {"default": 0, "one": 1, "x2": 2, "sqrt_s2x2": 3, "s2x2": 4}
IQ4_NL_ID = 20

#: interleaved Q4_0 type name -> ggml-ext layout number (enum ggml_ext_interleaved4_layout), from the registry
INTERLEAVED = {t.name: t.layout for t in formats.family("interleaved4", "Q4_0")}
#: interleaved IQ4_NL type name -> the same layout numbers
INTERLEAVED_IQ4_NL = {t.name: t.layout for t in formats.family("interleaved4", "IQ4_NL")}
#: ggml-ext's codebook types (CB2, CB3) -> code bits: ggml_quantize_chunk makes them (with the
#: imatrix as the importance), ggml's to_float reads them back
CODEBOOKS = {t.name: t.layout for t in formats.family("codebooks")}


class QuantError(ValueError):
    """A type cannot be produced, or the rows do not fit it."""


class _TypeTraits(ctypes.Structure):
    """``struct ggml_type_traits`` of ggml.h (the fields up to ``to_float``)."""
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool),
                ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)),
                ("from_float_ref", ctypes.c_void_p)]


_init_lock = threading.Lock()
_initialised: set[int] = set()


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """Our libggml-base, with the argument and result types of the functions used here declared."""
    lib = ctypes.CDLL(str(_locate.library("ggml-base")), mode=ctypes.RTLD_GLOBAL)
    c_type = ctypes.c_int  # enum ggml_type
    lib.ggml_quantize_chunk.argtypes = [c_type, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_init.argtypes = [c_type]
    lib.ggml_quantize_init.restype = None
    lib.ggml_quantize_requires_imatrix.argtypes = [c_type]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_row_size.argtypes = [c_type, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_blck_size.argtypes = [c_type]
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_type_size.argtypes = [c_type]
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_type_name.argtypes = [c_type]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_validate_row_data.argtypes = [c_type, ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_validate_row_data.restype = ctypes.c_bool
    lib.ggml_get_type_traits.argtypes = [c_type]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    lib.ggml_ext_format_version.argtypes = []
    lib.ggml_ext_format_version.restype = ctypes.c_int
    for fn in (lib.ggml_ext_repack_q4_0, lib.ggml_ext_unpack_q4_0, lib.ggml_ext_repack_iq4_nl, lib.ggml_ext_unpack_iq4_nl):
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        fn.restype = ctypes.c_int
    lib.ggml_ext_quantize_iq4_nl_weighted.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                      ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.ggml_ext_quantize_iq4_nl_weighted.restype = ctypes.c_size_t
    return lib


def format_version() -> int:
    """``ggml_ext_format_version()``: the value writers put in ``ggml_ext.format_version``."""
    return int(library().ggml_ext_format_version())


def type_id(t: int | str | formats.TypeInfo) -> int:
    """The ggml type id of a name ("Q8_0", "q8_0"), an id, or a TypeInfo."""
    if isinstance(t, formats.TypeInfo):
        return t.id
    if isinstance(t, str):
        info = formats.type_by_name(t)
        return info.id
    return int(t)


def _producible(tid: int) -> None:
    info = formats.find_type(tid)
    if info is None:
        raise QuantError(formats.describe_id(tid))
    if info.kind != "stock" and info.name not in INTERLEAVED and info.name not in INTERLEAVED_IQ4_NL \
            and info.name not in CODEBOOKS:
        raise QuantError(f"{info.name} is not produced by ggml_quantize_chunk (interleaved or ggml-ext type)")
    if info.name in ("I8", "I16", "I32", "I64", "F64", "Q8_1", "Q8_K"):
        raise QuantError(f"{info.name} is not a storage type ggml_quantize_chunk produces")


def blck_size(t) -> int:
    return int(library().ggml_blck_size(type_id(t)))


def type_size(t) -> int:
    return int(library().ggml_type_size(type_id(t)))


def row_size(t, n_per_row: int) -> int:
    """Bytes of one row of ``n_per_row`` weights (``ggml_row_size``)."""
    tid = type_id(t)
    bs = blck_size(tid)
    if bs <= 0 or n_per_row % bs:
        raise QuantError(f"a row of {n_per_row} weights is not a whole number of "
                         f"{type_name(tid)} blocks ({bs} weights each)")
    return int(library().ggml_row_size(tid, n_per_row))


def type_name(t) -> str:
    return library().ggml_type_name(type_id(t)).decode()


def requires_imatrix(t) -> bool:
    return bool(library().ggml_quantize_requires_imatrix(type_id(t)))


def _init(tid: int) -> None:
    # ggml_quantize_init builds lookup tables for some types; do it once, not from several threads at once.
    if tid in _initialised:
        return
    with _init_lock:
        if tid not in _initialised:
            library().ggml_quantize_init(tid)
            _initialised.add(tid)


def _as_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        x = x.astype(np.float32)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    elif x.ndim > 2:
        x = x.reshape(-1, x.shape[-1])
    return np.ascontiguousarray(x)


def _check_finite(rows: np.ndarray, imatrix: np.ndarray | None) -> None:
    if not np.isfinite(rows).all():
        bad = np.argwhere(~np.isfinite(rows))
        r, c = (int(v) for v in bad[0])
        raise QuantError(f"rows hold {len(bad)} NaN or infinite values (first at row {r}, column {c}); "
                         "refusing to quantize")
    if imatrix is not None and not (np.isfinite(imatrix).all() and (imatrix >= 0).all()):
        raise QuantError("imatrix holds NaN, infinite or negative values; refusing to quantize")


def quantize_rows_into(t, rows: np.ndarray, out: np.ndarray, imatrix: np.ndarray | None = None,
                       threads: int | None = None, quantizer: str | None = None,
                       weighting: str = "default") -> int:
    """Quantize float32 ``rows`` (n_rows x n_per_row) into the uint8 buffer ``out``.

    ``out`` must be C-contiguous and hold at least ``n_rows * row_size(t, n_per_row)``
    bytes. Rows are independent, so they are split over ``threads`` (default: all
    cores) and the result does not depend on the split. Returns the bytes written.

    ``quantizer``: ``None`` (ggml-ext's for IQ4_NL and the interleaved IQ4_NL types — plain
    IQ4_NL then repacked —, ggml's for every other type), ``"ggml"`` or ``"ggml-ext"``
    (IQ4_NL types only); ``weighting``: a key of
    :data:`IQ4_NL_WEIGHTINGS` for ggml-ext's IQ4_NL quantizer.
    """
    tid = type_id(t)
    _producible(tid)
    if quantizer not in (None, "ggml", "ggml-ext"):
        raise QuantError(f"unknown quantizer {quantizer!r}; choose 'ggml' or 'ggml-ext'")
    interleaved_iq4 = type_name(tid) in INTERLEAVED_IQ4_NL
    ext = (tid == IQ4_NL_ID or interleaved_iq4) and quantizer != "ggml"
    if quantizer == "ggml-ext" and not ext:
        raise QuantError(f"ggml-ext has its own quantizer for IQ4_NL only, not {type_name(tid)}")
    if weighting not in IQ4_NL_WEIGHTINGS:
        raise QuantError(f"unknown IQ4_NL weighting {weighting!r}; choose from {', '.join(IQ4_NL_WEIGHTINGS)}")
    rows = _as_rows(rows)
    n_rows, n_per_row = rows.shape
    rs = row_size(tid, n_per_row)
    need = n_rows * rs
    group = formats.find_type(tid).row_group
    if n_rows % group:
        raise QuantError(f"{formats.find_type(tid).name} needs a row count divisible by {group}; "
                         f"this tensor has {n_rows} rows")
    if not out.flags.c_contiguous or out.nbytes < need:
        raise QuantError(f"output buffer of {out.nbytes} bytes is too small or not contiguous (need {need})")
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        if imatrix.shape != (n_per_row,):
            raise QuantError(f"imatrix must have {n_per_row} values, got shape {imatrix.shape}")
    elif requires_imatrix(tid):
        raise QuantError(f"{type_name(tid)} needs an importance matrix")
    if ext and interleaved_iq4:
        # plain IQ4_NL by our quantizer (weighting honoured, NaN refused), then the lossless interleave:
        # the bytes of repack(convert --type iq4_nl)
        plain = np.empty(need, dtype=np.uint8)
        quantize_rows_into(IQ4_NL_ID, rows, plain, imatrix=imatrix, threads=threads, weighting=weighting)
        out.reshape(-1)[:need] = repack_iq4_nl(tid, plain, n_rows, n_per_row).reshape(-1)
        return need
    if ext:
        _check_finite(rows, imatrix)
    _init(tid)
    lib = library()
    src = rows.ctypes.data
    dst = out.ctypes.data
    im = imatrix.ctypes.data if imatrix is not None else None
    mode = IQ4_NL_WEIGHTINGS[weighting]

    def run(r0: int, r1: int) -> int:
        if ext:
            return int(lib.ggml_ext_quantize_iq4_nl_weighted(src + r0 * n_per_row * 4, dst + r0 * rs, r1 - r0,
                                                             n_per_row, im, mode))
        # start = r0 * n_per_row: ggml writes row r at dst + r * row_size.
        return int(lib.ggml_quantize_chunk(tid, src, dst, r0 * n_per_row, r1 - r0, n_per_row, im))

    threads = threads or os.cpu_count() or 1
    # Small tensors: one call. Large ones: about 4 pieces per thread of at least 64k weights.
    per_piece = max(1, min(n_rows, max(65536 // max(n_per_row, 1), -(-n_rows // (4 * threads)))))
    per_piece = -(-per_piece // group) * group  # interleaved types: whole row groups per piece
    pieces = [(r, min(n_rows, r + per_piece)) for r in range(0, n_rows, per_piece)]
    if threads == 1 or len(pieces) == 1:
        written = sum(run(a, b) for a, b in pieces)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:  # ctypes releases the GIL during each call
            written = sum(pool.map(lambda ab: run(*ab), pieces))
    if written != need:
        raise QuantError(f"ggml_quantize_chunk wrote {written} bytes, expected {need}")
    return written


def quantize(rows: np.ndarray, t, imatrix: np.ndarray | None = None, threads: int | None = None,
             quantizer: str | None = None, weighting: str = "default") -> np.ndarray:
    """Quantize float32 rows to type ``t``; returns uint8 of shape (n_rows, row_size)."""
    rows = _as_rows(rows)
    n_rows, n_per_row = rows.shape
    out = np.empty((n_rows, row_size(t, n_per_row)), dtype=np.uint8)
    quantize_rows_into(t, rows, out, imatrix=imatrix, threads=threads, quantizer=quantizer, weighting=weighting)
    return out


def dequantize(data: np.ndarray | bytes, t, n_per_row: int) -> np.ndarray:
    """ggml's own ``to_float`` of type ``t``: the float32 rows (n_rows x n_per_row) that ``data`` (a
    whole number of rows of ``t``) holds -- what llama.cpp computes with. Stock types only."""
    tid = type_id(t)
    _producible(tid)
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data)
    buf = buf.reshape(-1)
    rs = row_size(tid, n_per_row)
    if buf.nbytes % rs:
        raise QuantError(f"{buf.nbytes} bytes are not a whole number of {type_name(tid)} rows of {n_per_row} weights")
    n_rows = buf.nbytes // rs
    out = np.empty((n_rows, n_per_row), dtype=np.float32)
    if tid == 0:  # F32: the bytes are the values (ggml has no to_float for it)
        out.reshape(-1)[:] = buf.view(np.float32)
        return out
    traits = library().ggml_get_type_traits(tid).contents
    if not traits.to_float:
        raise QuantError(f"ggml has no to_float for {type_name(tid)}")
    traits.to_float(buf.ctypes.data, out.ctypes.data, n_rows * n_per_row)
    return out


def validate(t, data: np.ndarray | bytes) -> bool:
    """``ggml_validate_row_data``: no NaN/inf scales or values in the encoded bytes."""
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data)
    return bool(library().ggml_validate_row_data(type_id(t), buf.ctypes.data, buf.nbytes))


def _layout_call(fn_name: str, t, src: np.ndarray, n_rows: int, n_per_row: int) -> np.ndarray:
    name = formats.find_type(type_id(t)).name if formats.find_type(type_id(t)) else str(t)
    layouts, plain = (INTERLEAVED_IQ4_NL, "IQ4_NL") if fn_name.endswith("iq4_nl") else (INTERLEAVED, "Q4_0")
    if name not in layouts:
        raise QuantError(f"{name} is not an interleaved {plain} type ({', '.join(layouts)})")
    src = np.ascontiguousarray(np.frombuffer(src, dtype=np.uint8) if isinstance(src, (bytes, bytearray)) else src)
    need = n_rows * row_size(plain, n_per_row)
    if src.nbytes != need:
        raise QuantError(f"{src.nbytes} bytes are not a {n_rows} x {n_per_row} {plain} tensor ({need} bytes)")
    out = np.empty(need, dtype=np.uint8)
    rc = getattr(library(), fn_name)(layouts[name], out.ctypes.data, src.ctypes.data, n_rows, n_per_row)
    if rc == -2:
        raise QuantError(f"{name} needs a row count divisible by {formats.type_by_name(name).row_group}; "
                         f"this tensor has {n_rows} rows")
    if rc != 0:
        raise QuantError(f"{fn_name} failed with {rc} for {n_rows} rows of {n_per_row} weights")
    return out


def repack_q4_0(t, data, n_rows: int, n_per_row: int) -> np.ndarray:
    """Q4_0 bytes of an ``n_rows`` x ``n_per_row`` tensor -> the same tensor in interleaved type ``t``."""
    return _layout_call("ggml_ext_repack_q4_0", t, data, n_rows, n_per_row)


def unpack_q4_0(t, data, n_rows: int, n_per_row: int) -> np.ndarray:
    """Interleaved type ``t`` bytes -> the Q4_0 bytes they were made from (lossless inverse of repack_q4_0)."""
    return _layout_call("ggml_ext_unpack_q4_0", t, data, n_rows, n_per_row)


def repack_iq4_nl(t, data, n_rows: int, n_per_row: int) -> np.ndarray:
    """IQ4_NL bytes of an ``n_rows`` x ``n_per_row`` tensor -> the same tensor in interleaved type ``t`` (IQ4_NL_N_B)."""
    return _layout_call("ggml_ext_repack_iq4_nl", t, data, n_rows, n_per_row)


def unpack_iq4_nl(t, data, n_rows: int, n_per_row: int) -> np.ndarray:
    """Interleaved IQ4_NL type ``t`` bytes -> the IQ4_NL bytes they were made from (lossless inverse of repack_iq4_nl)."""
    return _layout_call("ggml_ext_unpack_iq4_nl", t, data, n_rows, n_per_row)
