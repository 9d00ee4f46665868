"""The format registry: every ggml tensor type, stock and ggml-ext's, as the library reports it.

This is the one table of types in Python. Its two views: the registry's own rows (:class:`ExtType`,
:class:`StockType`: :func:`ext_types`, :func:`stock_types`, :func:`family`, ...) and one :class:`TypeInfo`
per usable id (:data:`TYPES`, :func:`type_info`, :func:`tensor_nbytes`, ...), which the GGUF reader and
writer, the quantizers and the converter's type policy look types up in.

ggml-ext's own types are one table in C, ``ggml_ext/include/ggml-ext-types.def``; the
library answers ``ggml_ext_type_count`` / ``ggml_ext_type_info_at`` from it, and this
module reads that table through ctypes (``libggml-base``), so Python never keeps a list
of its own. Stock types come from the same library: ``ggml_type_name``,
``ggml_blck_size`` and ``ggml_type_size`` for every id below the pinned tree's
``GGML_TYPE_COUNT`` that ggml gives a block size.

Without a built library (a source checkout before ``pip install``), ggml-ext's rows are
read from the ``.def`` itself, the same file the library was compiled from.

    >>> from ggml_ext import formats
    >>> [t.name for t in formats.ext_types()][:3]
    ['Q4_0_4_4', 'Q4_0_4_8', 'Q4_0_8_8']
"""
from __future__ import annotations

import ctypes
import platform
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import _locate

__all__ = [
    "ExtType", "StockType", "ext_types", "ext_type", "by_name", "family", "own_id_range", "stock_types",
    "parse_def", "def_path", "dispatched_kernel", "STOCK_TYPE_COUNT",
    "TypeInfo", "TYPES", "EXT_ID_MIN", "EXT_ID_MAX", "TYPE_ID_LIMIT", "type_info", "find_type", "type_by_name",
    "describe_id", "is_known", "row_bytes", "tensor_nbytes", "check_shape", "n_elements",
]

#: ``GGML_TYPE_COUNT`` of the pinned llama.cpp tree (commit 0c1e57098): ggml has no
#: function that answers it, and ids at or above it index past ggml's trait table.
STOCK_TYPE_COUNT = 43


@dataclass(frozen=True)
class ExtType:
    """One row of ggml-ext-types.def (fields as ``struct ggml_ext_type_info`` in ggml-ext.h)."""

    name: str          # "Q4_0_4_4"
    ggml_name: str     # ggml's type_name: "q4_0_4x4"
    id: int
    blck_size: int     # weights per block
    type_size: int     # bytes per block
    row_group: int     # rows interleaved per group
    chunk: int         # bytes per round-robin chunk
    family: str        # "interleaved4"
    layout: int        # layout number inside the family
    base_name: str     # the stock type whose values it stores: "Q4_0" / "IQ4_NL"
    base_type: int
    vec_dot_type: int  # what the CPU quantizes activations to (8: Q8_0, 15: Q8_K)
    rowwise: bool = False  # rows stand alone (ROWWISE column): ggml has row-wise to_float for it

    @property
    def bits_per_weight(self) -> float:
        return self.type_size * 8 / self.blck_size

    @property
    def layout_name(self) -> str:
        """The interleave as rows x chunk bytes: "4x4", "4x8", "8x8"."""
        return f"{self.row_group}x{self.chunk}"


@dataclass(frozen=True)
class StockType:
    """A type of the pinned ggml, as its trait table says."""

    id: int
    name: str          # upper case: "Q4_0", "Q4_K"
    ggml_name: str     # ggml's type_name: "q4_0", "q4_K"
    blck_size: int
    type_size: int
    quantized: bool = True   # ggml_is_quantized: False for the float and integer types

    @property
    def bits_per_weight(self) -> float:
        return self.type_size * 8 / self.blck_size


class _Info(ctypes.Structure):
    # struct ggml_ext_type_info (ggml-ext.h), field for field
    _fields_ = [
        ("name", ctypes.c_char_p), ("ggml_name", ctypes.c_char_p), ("id", ctypes.c_int),
        ("blck_size", ctypes.c_int), ("type_size", ctypes.c_int), ("row_group", ctypes.c_int),
        ("chunk", ctypes.c_int), ("family", ctypes.c_int), ("family_name", ctypes.c_char_p),
        ("layout", ctypes.c_int), ("base_type", ctypes.c_int), ("base_name", ctypes.c_char_p),
        ("vec_dot_type", ctypes.c_int), ("shape_rule", ctypes.c_char_p), ("rowwise", ctypes.c_bool),
    ]


@lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(_locate.library("ggml-base")), mode=ctypes.RTLD_GLOBAL)
    lib.ggml_ext_type_count.restype, lib.ggml_ext_type_count.argtypes = ctypes.c_int, []
    lib.ggml_ext_type_info_at.restype = ctypes.POINTER(_Info)
    lib.ggml_ext_type_info_at.argtypes = [ctypes.c_int]
    lib.ggml_ext_type_first_own.restype = lib.ggml_ext_type_last_own.restype = ctypes.c_int
    lib.ggml_type_name.restype, lib.ggml_type_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    lib.ggml_blck_size.restype, lib.ggml_blck_size.argtypes = ctypes.c_int64, [ctypes.c_int]
    lib.ggml_type_size.restype, lib.ggml_type_size.argtypes = ctypes.c_size_t, [ctypes.c_int]
    lib.ggml_is_quantized.restype, lib.ggml_is_quantized.argtypes = ctypes.c_bool, [ctypes.c_int]
    return lib


def _library_or_none() -> ctypes.CDLL | None:
    try:
        return _lib()
    except (_locate.NotBuiltError, OSError, AttributeError):
        return None


def def_path() -> Path | None:
    """ggml-ext-types.def: beside the installed header, else in the source checkout."""
    here = Path(__file__).resolve()
    candidates = []
    try:
        candidates.append(_locate.prefix() / "include" / "ggml-ext-types.def")
    except _locate.NotBuiltError:
        pass
    candidates.append(here.parents[3] / "ggml_ext" / "include" / "ggml-ext-types.def")
    return next((p for p in candidates if p.is_file()), None)


_ROW = re.compile(r"^GGML_EXT_TYPE\((.*)\)\s*$", re.M)
_DEFINE = re.compile(r"#\s*define\s+(GGML_EXT_TYPE_(?:FIRST|LAST)_OWN)\s+(\d+)")


def parse_def(text: str) -> tuple[list[ExtType], tuple[int, int]]:
    """The rows and the own id range of a ggml-ext-types.def, read as text."""
    rows = []
    for m in _ROW.finditer(text):
        f = [x.strip() for x in m.group(1).split(",")]
        if len(f) != 14:
            raise ValueError(f"ggml-ext-types.def: a row needs 14 fields, not {len(f)}: {m.group(0)}")
        name, id_, blck, size, rows_, chunk, gname, fam, layout, base, base_id, _vd, vd_id, rowwise = f
        if rowwise not in ("ROWWISE", "GROUPED"):
            raise ValueError(f"ggml-ext-types.def: ROWWISE column must be ROWWISE or GROUPED: {m.group(0)}")
        rows.append(ExtType(name, gname.strip('"'), int(id_), int(blck), int(size), int(rows_), int(chunk),
                            fam.lower(), int(layout), base, int(base_id), int(vd_id), rowwise == "ROWWISE"))
    d = dict(_DEFINE.findall(text))
    return rows, (int(d["GGML_EXT_TYPE_FIRST_OWN"]), int(d["GGML_EXT_TYPE_LAST_OWN"]))


@lru_cache(maxsize=None)
def _from_def() -> tuple[tuple[ExtType, ...], tuple[int, int]]:
    p = def_path()
    if p is None:
        raise _locate.NotBuiltError("neither ggml-ext's library nor ggml-ext-types.def was found")
    rows, rng = parse_def(p.read_text())
    return tuple(rows), rng


@lru_cache(maxsize=None)
def ext_types() -> tuple[ExtType, ...]:
    """ggml-ext's types in registry order, from the library (the .def where none is built)."""
    lib = _library_or_none()
    if lib is None:
        return _from_def()[0]
    out = []
    for i in range(lib.ggml_ext_type_count()):
        r = lib.ggml_ext_type_info_at(i).contents
        out.append(ExtType(r.name.decode(), r.ggml_name.decode(), r.id, r.blck_size, r.type_size, r.row_group,
                           r.chunk, r.family_name.decode(), r.layout, r.base_name.decode(), r.base_type,
                           r.vec_dot_type, bool(r.rowwise)))
    return tuple(out)


def own_id_range() -> tuple[int, int]:
    """ggml-ext's own id range (first, last), inclusive: GGML_EXT_TYPE_FIRST_OWN / LAST_OWN."""
    lib = _library_or_none()
    if lib is None:
        return _from_def()[1]
    return int(lib.ggml_ext_type_first_own()), int(lib.ggml_ext_type_last_own())


def ext_type(type_id: int) -> ExtType | None:
    return next((t for t in ext_types() if t.id == type_id), None)


def by_name(name: str) -> ExtType | None:
    return next((t for t in ext_types() if t.name == name.upper()), None)


def family(name: str, base: str | None = None) -> tuple[ExtType, ...]:
    """The types of one family (and one base type), in layout order."""
    return tuple(sorted((t for t in ext_types() if t.family == name and (base is None or t.base_name == base)),
                        key=lambda t: t.layout))


@lru_cache(maxsize=None)
def stock_types() -> tuple[StockType, ...]:
    """Every real stock type of the pinned ggml (block size > 0), from the library; ggml-ext's ids left out."""
    lib = _lib()
    ours = {t.id for t in ext_types()}
    out = []
    for i in range(STOCK_TYPE_COUNT):
        if i in ours:
            continue
        blck = int(lib.ggml_blck_size(i))
        if blck <= 0:
            continue
        gname = lib.ggml_type_name(i).decode()
        out.append(StockType(i, gname.upper(), gname, blck, int(lib.ggml_type_size(i)), bool(lib.ggml_is_quantized(i))))
    return tuple(out)


def dispatched_kernel(type_id: int, gemm: bool) -> str | None:
    """The kernel implementation ggml-cpu's mul_mat runs on this CPU for one of ggml-ext's types
    (ggml_ext_dispatched_kernel: "generic" is the scalar C reference), None where there is none."""
    lib = ctypes.CDLL(str(_locate.library("ggml-cpu")), mode=ctypes.RTLD_GLOBAL)
    fn = getattr(lib, "ggml_ext_dispatched_kernel", None)
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int, ctypes.c_int]
    r = fn(type_id, 1 if gemm else 0)
    return r.decode() if r else None


def table() -> list[dict]:
    """Every type, stock and ggml-ext's, in id order: what ``ggml-ext info --types`` prints.

    ``stock_readable``: whether stock llama.cpp (the pinned commit) loads it; ggml-ext's never
    (upstream removed the restored ids, and the own range is ours). ``kernels`` (ggml-ext's types):
    the implementation ggml-cpu's mul_mat dispatches on this CPU for the GEMV and the GEMM
    ("generic" is the scalar C reference) and the machine's arch."""
    rows: list[dict] = []
    for s in stock_types():
        rows.append({"id": s.id, "name": s.name, "ggml_name": s.ggml_name, "block": s.blck_size,
                     "bytes": s.type_size, "bits_per_weight": round(s.bits_per_weight, 4), "stock_readable": True,
                     "origin": "stock", "family": None, "base": None, "row_group": 1, "kernels": None})
    first_own, _ = own_id_range()
    arch = platform.machine()  # the kernels' arch; the names below are the ISA extensions
    for t in ext_types():
        rows.append({"id": t.id, "name": t.name, "ggml_name": t.ggml_name, "block": t.blck_size,
                     "bytes": t.type_size, "bits_per_weight": round(t.bits_per_weight, 4), "stock_readable": False,
                     "origin": "restored" if t.id < first_own else "ggml-ext", "family": t.family,
                     "base": t.base_name, "row_group": t.row_group,
                     "kernels": {"arch": arch, "gemv": dispatched_kernel(t.id, False),
                                 "gemm": dispatched_kernel(t.id, True)}})
    return sorted(rows, key=lambda r: r["id"])


def format_table(rows: list[dict]) -> str:
    """The table as text, one type a line."""
    head = f"{'id':>3}  {'name':<11} {'block':>5} {'bytes':>5} {'bpw':>7}  {'stock':<5}  {'family':<12}  kernels (gemv / gemm)"
    out = [head]
    for r in rows:
        k = r["kernels"]
        kern = f"{k['gemv'] or '-'} / {k['gemm'] or '-'}" if k else "-"
        out.append(f"{r['id']:>3}  {r['name']:<11} {r['block']:>5} {r['bytes']:>5} {r['bits_per_weight']:>7.3f}  "
                   f"{'yes' if r['stock_readable'] else 'no':<5}  {r['family'] or '-':<12}  {kern}")
    return "\n".join(out) + "\n"


# The per-id view (TypeInfo for every usable id); its table is built on first use.
from .typeinfo import (TypeInfo, check_shape, describe_id, find_type, is_known, n_elements,  # noqa: E402
                       row_bytes, tensor_nbytes, type_by_name, type_info)


def __getattr__(name: str):
    # TYPES and the own id range as module constants, computed when first read: the stock rows need the
    # built library, which importing the package does not
    if name == "TYPES":
        from .typeinfo import all_types
        return all_types()
    if name in ("EXT_ID_MIN", "EXT_ID_MAX", "TYPE_ID_LIMIT"):
        lo, hi = own_id_range()
        return {"EXT_ID_MIN": lo, "EXT_ID_MAX": hi, "TYPE_ID_LIMIT": hi + 1}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
