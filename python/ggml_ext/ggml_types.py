"""The ggml tensor types ggml-ext knows: ids, names, block sizes, bytes per block.

Three kinds of id:

* **stock** — every type of the pinned llama.cpp tree's ``ggml.h`` (ids 0..42,
  ``GGML_TYPE_COUNT`` = 43 there). Block sizes and byte sizes are those of the
  tree's ``type_traits`` table in ``ggml.c`` (``tests/formats/test_gguf_reader.py``
  checks them against the tree itself).
* **legacy** — the interleaved ids upstream removed from GGUF files and
  ggml-ext restores (the registry's rows below its own range), byte-compatible with llama.cpp
  July-December 2024: same size as Q4_0 / IQ4_NL (32 weights, 18 bytes per
  block), and the tensor's row count must be divisible by the interleave
  factor N (4 or 8). See ``docs/formats/interleaved4.md``.
* **ext** — ggml-ext's own ids (GGML_EXT_TYPE_FIRST_OWN..LAST_OWN). None is defined
  yet; an id in that range is reported as "ggml-ext type id N, not known to this version".

The ggml-ext rows come from the format registry (:mod:`ggml_ext.formats`, read from
the library, whose table is ``ggml_ext/include/ggml-ext-types.def``).

Ids 4 and 5 (Q4_2, Q4_3) were removed from ggml long ago and stay reserved.
Shapes are in ggml order: ``shape[0]`` (``ne[0]``) is the row length, the
number of contiguous weights; ``shape[1]`` is the number of rows of a matrix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, Union

from . import formats as _formats

__all__ = [
    "TypeInfo", "TYPES", "STOCK_TYPE_COUNT", "EXT_ID_MIN", "EXT_ID_MAX", "TYPE_ID_LIMIT",
    "type_info", "find_type", "type_by_name", "describe_id", "is_known",
    "row_bytes", "tensor_nbytes", "check_shape", "n_elements",
]

#: ``GGML_TYPE_COUNT`` of the pinned llama.cpp tree (commit 0c1e57098).
STOCK_TYPE_COUNT = _formats.STOCK_TYPE_COUNT


@dataclass(frozen=True)
class TypeInfo:
    """One usable ggml tensor type.

    ``block_size`` weights are stored in ``type_size`` bytes. ``row_group`` is
    the number by which a tensor's row count (``shape[1]``) must be divisible
    (1 for everything but the interleaved legacy ids). ``kind`` is "stock",
    "legacy" or "ext". ``ggml_name`` is ggml's own lower-case ``type_name``.
    ``cache_only``: a KV cache type (KVQuant nuq4/3/2) that no GGUF tensor may
    have: its bytes mean something only with a cache's calibrated tables.
    """

    id: int
    name: str
    block_size: int
    type_size: int
    kind: str = "stock"
    row_group: int = 1
    ggml_name: str = ""
    is_quantized: bool = True
    note: str = ""
    cache_only: bool = False

    @property
    def bits_per_weight(self) -> float:
        return self.type_size * 8 / self.block_size


def _t(id_: int, name: str, blck: int, size: int, ggml_name: str | None = None, *,
       quantized: bool = True, kind: str = "stock", row_group: int = 1, note: str = "",
       cache_only: bool = False) -> TypeInfo:
    return TypeInfo(id_, name, blck, size, kind, row_group,
                    ggml_name if ggml_name is not None else name.lower(), quantized, note, cache_only)


_QK_K = 256

_ENTRIES: tuple[TypeInfo, ...] = (
    # --- stock types of the pinned tree (ggml.h enum ggml_type, ggml.c type_traits) ---
    _t(0, "F32", 1, 4, quantized=False),
    _t(1, "F16", 1, 2, quantized=False),
    _t(2, "Q4_0", 32, 18),
    _t(3, "Q4_1", 32, 20),
    _t(6, "Q5_0", 32, 22),
    _t(7, "Q5_1", 32, 24),
    _t(8, "Q8_0", 32, 34),
    _t(9, "Q8_1", 32, 36),      # d and s are fp16 (ggml_half2 ds); older gguf-py says 40
    _t(10, "Q2_K", _QK_K, 84, "q2_K"),
    _t(11, "Q3_K", _QK_K, 110, "q3_K"),
    _t(12, "Q4_K", _QK_K, 144, "q4_K"),
    _t(13, "Q5_K", _QK_K, 176, "q5_K"),
    _t(14, "Q6_K", _QK_K, 210, "q6_K"),
    _t(15, "Q8_K", _QK_K, 292, "q8_K"),
    _t(16, "IQ2_XXS", _QK_K, 66),
    _t(17, "IQ2_XS", _QK_K, 74),
    _t(18, "IQ3_XXS", _QK_K, 98),
    _t(19, "IQ1_S", _QK_K, 50),
    _t(20, "IQ4_NL", 32, 18),
    _t(21, "IQ3_S", _QK_K, 110),
    _t(22, "IQ2_S", _QK_K, 82),
    _t(23, "IQ4_XS", _QK_K, 136),
    _t(24, "I8", 1, 1, quantized=False),
    _t(25, "I16", 1, 2, quantized=False),
    _t(26, "I32", 1, 4, quantized=False),
    _t(27, "I64", 1, 8, quantized=False),
    _t(28, "F64", 1, 8, quantized=False),
    _t(29, "IQ1_M", _QK_K, 56),
    _t(30, "BF16", 1, 2, quantized=False),
    _t(34, "TQ1_0", _QK_K, 54),
    _t(35, "TQ2_0", _QK_K, 66),
    _t(39, "MXFP4", 32, 17),
    _t(40, "NVFP4", 64, 36),
    _t(41, "Q1_0", 128, 18),
    _t(42, "Q2_0", 64, 18),
    # --- ggml-ext's types (restored interleaved ids, then its own range) come from the registry below ---
)


def _note(t) -> str:
    # what the interleaved4 family's bytes are (docs/formats/interleaved4.md); Q4_0's quants are stored ^ 0x88
    if t.family != "interleaved4":
        return ""
    return (f"{t.base_name} rows interleaved by {t.row_group}, {t.chunk}-byte chunks"
            + (", quants ^ 0x88" if t.base_name == "Q4_0" else ""))


#: ggml-ext's own type ids: EXT_ID_MIN..EXT_ID_MAX inclusive (GGML_EXT_TYPE_FIRST_OWN / LAST_OWN).
EXT_ID_MIN, EXT_ID_MAX = _formats.own_id_range()
#: ``GGML_TYPE_COUNT`` once ggml-ext's own ids are in use.
TYPE_ID_LIMIT = EXT_ID_MAX + 1

_ENTRIES += tuple(
    _t(t.id, t.name, t.blck_size, t.type_size, t.ggml_name, kind="legacy" if t.id < EXT_ID_MIN else "ext",
       row_group=t.row_group, note=_note(t), cache_only=t.family == "kvquant")
    for t in _formats.ext_types())

#: Every usable type, by id.
TYPES: dict[int, TypeInfo] = {t.id: t for t in sorted(_ENTRIES, key=lambda t: t.id)}
_BY_NAME: dict[str, TypeInfo] = {t.name.upper(): t for t in _ENTRIES}

#: Ids below STOCK_TYPE_COUNT that the pinned tree marks removed and ggml-ext does not restore.
_REMOVED: dict[int, str] = {4: "Q4_2", 5: "Q4_3"}

TypeLike = Union[int, str, TypeInfo]


def describe_id(type_id: int) -> str:
    """A human-readable description of any type id, known or not."""
    t = TYPES.get(type_id)
    if t is not None:
        return f"{t.name} (id {t.id})"
    if type_id in _REMOVED:
        return f"ggml type id {type_id} ({_REMOVED[type_id]}), removed from ggml and not supported"
    if EXT_ID_MIN <= type_id <= EXT_ID_MAX:
        return f"ggml-ext type id {type_id}, not known to this version"
    return (f"unknown ggml type id {type_id} (this version knows stock ids 0-{STOCK_TYPE_COUNT - 1}, "
            f"the interleaved ids {_restored_ids()}, and ggml-ext ids {EXT_ID_MIN}-{EXT_ID_MAX})")


def _restored_ids() -> str:
    """The restored ids as ranges: "31-33 and 36-38"."""
    ids = sorted(t.id for t in _ENTRIES if t.kind == "legacy")
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    return " and ".join([", ".join(parts[:-1]), parts[-1]]) if len(parts) > 1 else "".join(parts)


def is_known(type_id: int) -> bool:
    return type_id in TYPES


def find_type(type_id: int) -> TypeInfo | None:
    """The TypeInfo for ``type_id``, or None if it is not a usable type."""
    return TYPES.get(type_id)


def type_by_name(name: str) -> TypeInfo:
    t = _BY_NAME.get(name.upper())
    if t is None:
        raise ValueError(f"unknown ggml type name {name!r}")
    return t


def type_info(type_id: TypeLike) -> TypeInfo:
    """The TypeInfo for an id (or name); ValueError with a clear reason otherwise."""
    if isinstance(type_id, TypeInfo):
        return type_id
    if isinstance(type_id, str):
        return type_by_name(type_id)
    if isinstance(type_id, bool) or not isinstance(type_id, int):
        raise TypeError(f"type id must be an int, a name or a TypeInfo, not {type(type_id).__name__}")
    t = TYPES.get(type_id)
    if t is None:
        raise ValueError(describe_id(type_id))
    return t


def n_elements(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def row_bytes(type_id: TypeLike, n: int) -> int:
    """Bytes taken by a row of ``n`` weights of the given type."""
    t = type_info(type_id)
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"row length must be an int, not {type(n).__name__}")
    if n < 0:
        raise ValueError(f"row length {n} is negative")
    if n % t.block_size != 0:
        raise ValueError(f"row length {n} is not a multiple of {t.name}'s block size {t.block_size}")
    return n // t.block_size * t.type_size


def check_shape(type_id: TypeLike, shape: Iterable[int]) -> TypeInfo:
    """Validate a ggml-order shape for a type; returns the TypeInfo.

    The row length ``shape[0]`` must be a multiple of the block size; for the
    interleaved ids the row count ``shape[1]`` (1 for a 1-D tensor) must be a
    multiple of the interleave factor.
    """
    t = type_info(type_id)
    shape = tuple(shape)
    for i, d in enumerate(shape):
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"dimension {i} must be an int, not {type(d).__name__}")
        if d < 0:
            raise ValueError(f"dimension {i} is negative ({d})")
    ne0 = shape[0] if shape else 1
    if ne0 % t.block_size != 0:
        raise ValueError(f"shape {list(shape)}: row length {ne0} is not a multiple of "
                         f"{t.name}'s block size {t.block_size}")
    if t.row_group > 1:
        rows = shape[1] if len(shape) > 1 else 1
        if rows % t.row_group != 0:
            raise ValueError(f"shape {list(shape)}: {t.name} interleaves rows by {t.row_group}, "
                             f"but the row count {rows} is not a multiple of {t.row_group}")
    return t


def tensor_nbytes(type_id: TypeLike, shape: Iterable[int]) -> int:
    """Bytes of a tensor of this type and ggml-order shape (validated by check_shape)."""
    shape = tuple(shape)
    t = check_shape(type_id, shape)
    return n_elements(shape) // t.block_size * t.type_size
