"""Every usable ggml type id as one :class:`TypeInfo`, built from the registry's rows: the view the GGUF
reader and writer, the quantizers and the converter's type policy look types up in.

Three kinds of id:

* **stock** -- every type of the pinned llama.cpp tree's ``ggml.h`` (ids below ``GGML_TYPE_COUNT``, 43
  there) that ggml gives a block size, as the library's trait table says (:func:`ggml_ext.formats.
  stock_types`; ``tests/formats/test_gguf_reader.py`` checks them against the tree's sources).
* **legacy** -- the interleaved ids upstream removed from GGUF files and ggml-ext restores (the
  registry's rows below its own range), byte-compatible with llama.cpp July-December 2024: same size as
  Q4_0 / IQ4_NL (32 weights, 18 bytes per block), and the tensor's row count must be divisible by the
  interleave factor N (4 or 8). See ``docs/formats/interleaved4.md``.
* **ext** -- ggml-ext's own ids (GGML_EXT_TYPE_FIRST_OWN..LAST_OWN); an id in that range the registry
  does not list is reported as "ggml-ext type id N, not known to this version".

Ids 4 and 5 (Q4_2, Q4_3) were removed from ggml long ago and stay reserved. Shapes are in ggml order:
``shape[0]`` (``ne[0]``) is the row length, the number of contiguous weights; ``shape[1]`` is the number
of rows of a matrix.

The table is built on first use, not at import: the stock rows need the built library, and importing
the package (``ggml-ext --help``, a source checkout) should not.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence, Union

__all__ = ["TypeInfo", "type_info", "find_type", "type_by_name", "describe_id", "is_known", "row_bytes",
           "tensor_nbytes", "check_shape", "n_elements", "all_types", "restored_ids"]


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


def _note(t) -> str:
    # what the interleaved4 family's bytes are (docs/formats/interleaved4.md); Q4_0's quants are stored ^ 0x88
    if t.family != "interleaved4":
        return ""
    return (f"{t.base_name} rows interleaved by {t.row_group}, {t.chunk}-byte chunks"
            + (", quants ^ 0x88" if t.base_name == "Q4_0" else ""))


@lru_cache(maxsize=None)
def all_types() -> dict[int, TypeInfo]:
    """Every usable type, by id (stock from the library, then ggml-ext's registry rows)."""
    from . import ext_types, own_id_range, stock_types
    first_own, _ = own_id_range()
    entries = [TypeInfo(s.id, s.name, s.blck_size, s.type_size, "stock", 1, s.ggml_name, s.quantized)
               for s in stock_types()]
    entries += [TypeInfo(t.id, t.name, t.blck_size, t.type_size, "legacy" if t.id < first_own else "ext",
                         t.row_group, t.ggml_name, True, _note(t), t.family == "kvquant")
                for t in ext_types()]
    return {t.id: t for t in sorted(entries, key=lambda t: t.id)}


@lru_cache(maxsize=None)
def _by_name() -> dict[str, TypeInfo]:
    return {t.name.upper(): t for t in all_types().values()}


#: Ids below STOCK_TYPE_COUNT that the pinned tree marks removed and ggml-ext does not restore.
_REMOVED: dict[int, str] = {4: "Q4_2", 5: "Q4_3"}

TypeLike = Union[int, str, TypeInfo]


def describe_id(type_id: int) -> str:
    """A human-readable description of any type id, known or not."""
    from . import STOCK_TYPE_COUNT, own_id_range
    t = all_types().get(type_id)
    if t is not None:
        return f"{t.name} (id {t.id})"
    if type_id in _REMOVED:
        return f"ggml type id {type_id} ({_REMOVED[type_id]}), removed from ggml and not supported"
    lo, hi = own_id_range()
    if lo <= type_id <= hi:
        return f"ggml-ext type id {type_id}, not known to this version"
    return (f"unknown ggml type id {type_id} (this version knows stock ids 0-{STOCK_TYPE_COUNT - 1}, "
            f"the interleaved ids {restored_ids()}, and ggml-ext ids {lo}-{hi})")


def restored_ids() -> str:
    """The restored ids as ranges: "31-33 and 36-38"."""
    ids = sorted(t.id for t in all_types().values() if t.kind == "legacy")
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    return " and ".join([", ".join(parts[:-1]), parts[-1]]) if len(parts) > 1 else "".join(parts)


def is_known(type_id: int) -> bool:
    return type_id in all_types()


def find_type(type_id: int) -> TypeInfo | None:
    """The TypeInfo for ``type_id``, or None if it is not a usable type."""
    return all_types().get(type_id)


def type_by_name(name: str) -> TypeInfo:
    t = _by_name().get(name.upper())
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
    t = all_types().get(type_id)
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
