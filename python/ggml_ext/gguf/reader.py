"""A GGUF reader that is safe on hostile files.

Reads GGUF v2 and v3 (little-endian) metadata: header, key/value pairs (every
value type, nested arrays included), tensor infos, alignment and the start of
the data section. Tensor data is never read, only located and checked.

Every count, length, offset and size is checked against the bytes left in the
file *before* anything is allocated or read, so a string length of 2**63 or a
tensor count of 2**60 fails at once with a clear message and bounded memory.
All problems raise :class:`GGUFError` (a ``ValueError``) whose message names
the problem and the byte offset where it was found.

Checks mirror those of the pinned llama.cpp's ``gguf.cpp`` (and its model
loader), plus a few of ggml-ext's own:

* magic, version (0 / v1 / > 3 refused; a byte-swapped version means a
  big-endian file, which is refused clearly);
* tensor and KV counts against the file size;
* keys non-empty and unique; value types valid; string length <= 1 GiB and
  array length <= 2**30 elements (gguf.cpp's limits), both within the file;
  arrays nested at most MAX_ARRAY_DEPTH deep;
* ``general.alignment`` of type uint32, a power of two;
* tensor names unique, non-empty, shorter than 64 bytes (GGML_MAX_NAME);
  n_dims <= 4; every dimension > 0 (gguf.cpp accepts 0); element count
  < 2**63; the type id known (stock, restored interleaved id or ggml-ext id)
  and not a KV-cache-only type (KVQuant nuq4/3/2, ids 103-105);
  row length divisible by the block size; row count divisible by the
  interleave factor of ids 31-33 and 36-38;
* the data section start (aligned) inside the file; each tensor's offset
  aligned; its data inside the file; no two tensors overlapping.

Things llama.cpp would refuse but that are not damage to the file itself are
recorded in ``GGUFFile.warnings``: nested arrays (gguf.cpp rejects them) and
tensor data not laid out in order, back to back with alignment padding
(gguf.cpp requires each offset to equal the padded sum of the earlier sizes).
"""
from __future__ import annotations

import array
import mmap
import os
import stat
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

from .. import formats

__all__ = [
    "GGUFError", "GGUFFile", "TensorInfo", "TypeStats", "read_gguf",
    "GGUF_MAGIC", "DEFAULT_ALIGNMENT", "MAX_STRING_LENGTH", "MAX_ARRAY_ELEMENTS",
    "MAX_ARRAY_DEPTH", "MAX_NAME", "MAX_DIMS", "VALUE_TYPE_NAMES",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_STRING_LENGTH = 1 << 30     # GGUF_MAX_STRING_LENGTH in gguf.cpp
MAX_ARRAY_ELEMENTS = 1 << 30    # GGUF_MAX_ARRAY_ELEMENTS in gguf.cpp
MAX_ARRAY_DEPTH = 8             # ours: gguf.cpp allows no nesting at all
MAX_NAME = 64                   # GGML_MAX_NAME: names must be shorter
MAX_DIMS = 4                    # GGML_MAX_DIMS
_INT64_MAX = (1 << 63) - 1

# GGUF value types: id -> (name, struct format, size, array typecode)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, \
    T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)
_SCALARS: dict[int, tuple[str, str, int, str]] = {
    T_UINT8: ("u8", "<B", 1, "B"),
    T_INT8: ("i8", "<b", 1, "b"),
    T_UINT16: ("u16", "<H", 2, "H"),
    T_INT16: ("i16", "<h", 2, "h"),
    T_UINT32: ("u32", "<I", 4, "I"),
    T_INT32: ("i32", "<i", 4, "i"),
    T_FLOAT32: ("f32", "<f", 4, "f"),
    T_BOOL: ("bool", "<b", 1, "b"),
    T_UINT64: ("u64", "<Q", 8, "Q"),
    T_INT64: ("i64", "<q", 8, "q"),
    T_FLOAT64: ("f64", "<d", 8, "d"),
}
VALUE_TYPE_NAMES = {k: v[0] for k, v in _SCALARS.items()}
VALUE_TYPE_NAMES[T_STRING] = "str"
VALUE_TYPE_NAMES[T_ARRAY] = "array"

# Smallest possible encodings, used to bound counts by the bytes left.
_MIN_KV_BYTES = 8 + 1 + 4 + 1          # key length, >= 1 key byte, value type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length, >= 1 name byte, n_dims, type, offset
_MIN_ARRAY_HEADER = 4 + 8               # element type + element count


def _min_elem_bytes(vtype: int) -> int:
    if vtype == T_STRING:
        return 8
    if vtype == T_ARRAY:
        return _MIN_ARRAY_HEADER
    return _SCALARS[vtype][2]


class GGUFError(ValueError):
    """A GGUF file is malformed or uses something this reader does not support."""

    def __init__(self, message: str, offset: int | None = None):
        self.problem = message
        self.offset = offset
        super().__init__(message if offset is None else f"{message} (at byte offset {offset})")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    ``shape`` is in ggml order (``shape[0]`` is the row length). ``offset`` is
    the offset as stored in the file, relative to the data section;
    ``file_offset`` is the absolute position of the data in the file.
    """

    name: str
    shape: tuple[int, ...]
    type_id: int
    type_name: str
    offset: int
    nbytes: int
    file_offset: int = 0
    #: absolute position of the tensor info's int32 type id (what ``ggml-ext repack`` rewrites)
    type_field_offset: int = 0

    @property
    def n_elements(self) -> int:
        return formats.n_elements(self.shape)

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.shape[0] if self.shape else 1


@dataclass(frozen=True)
class TypeStats:
    """Per-type totals for GGUFFile.type_histogram()."""

    type_name: str
    type_id: int
    count: int
    nbytes: int
    n_weights: int

    @property
    def bits_per_weight(self) -> float:
        return self.nbytes * 8 / self.n_weights if self.n_weights else 0.0


@dataclass
class GGUFFile:
    """The metadata of a GGUF file, as read by read_gguf().

    ``kv`` holds the values: scalars as Python ints/floats/bools/strs, arrays
    of numbers as ``array.array`` (compact, one machine value per element),
    arrays of bools and strings and nested arrays as lists. ``kv_types``
    gives each key's GGUF type, e.g. "u32", "str", "array[str]",
    "array[array[i32]]".
    """

    path: str
    version: int
    kv: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    alignment: int
    file_size: int
    kv_types: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def n_weights(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def bits_per_weight(self) -> float:
        """Total tensor bytes * 8 / total weights (0.0 for a file without tensors)."""
        n = self.n_weights
        return self.tensor_bytes * 8 / n if n else 0.0

    def type_histogram(self) -> dict[str, TypeStats]:
        """Per tensor type: tensor count, bytes and weights; largest byte total first."""
        acc: dict[int, list[int]] = {}
        names: dict[int, str] = {}
        for t in self.tensors:
            a = acc.setdefault(t.type_id, [0, 0, 0])
            a[0] += 1
            a[1] += t.nbytes
            a[2] += t.n_elements
            names[t.type_id] = t.type_name
        stats = [TypeStats(names[i], i, a[0], a[1], a[2]) for i, a in acc.items()]
        stats.sort(key=lambda s: (-s.nbytes, s.type_id))
        return {s.type_name: s for s in stats}


class _Cursor:
    """Bounds-checked little-endian reads from a buffer (an mmap)."""

    __slots__ = ("buf", "pos", "size")

    def __init__(self, buf: Any, size: int):
        self.buf = buf
        self.pos = 0
        self.size = size

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str, at: int | None = None) -> None:
        if n > self.size - self.pos:
            raise GGUFError(f"file truncated: {what} needs {n} bytes but only {self.size - self.pos} remain "
                            f"(file size {self.size})", self.pos if at is None else at)

    def unpack(self, fmt: str, n: int, what: str) -> Any:
        self.need(n, what)
        v = struct.unpack(fmt, self.buf[self.pos:self.pos + n])[0]
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.unpack("<I", 4, what)

    def i32(self, what: str) -> int:
        return self.unpack("<i", 4, what)

    def u64(self, what: str) -> int:
        return self.unpack("<Q", 8, what)

    def i64(self, what: str) -> int:
        return self.unpack("<q", 8, what)

    def raw(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def string_bytes(self, what: str) -> bytes:
        at = self.pos
        n = self.u64(f"length of {what}")
        if n > MAX_STRING_LENGTH:
            raise GGUFError(f"{what}: string length {n} exceeds the maximum {MAX_STRING_LENGTH}", at)
        if n > self.remaining:
            raise GGUFError(f"{what}: string length {n} exceeds the {self.remaining} bytes left in the file", at)
        return self.raw(n, what)

    def string(self, what: str) -> str:
        return self.string_bytes(what).decode("utf-8", errors="replace")


class _FileBuf:
    """Slice access to an open file through positioned reads (fallback when mmap fails)."""

    def __init__(self, f: Any):
        self.f = f

    def __getitem__(self, s: slice) -> bytes:
        self.f.seek(s.start)
        return self.f.read(s.stop - s.start)


def _show(name: str, limit: int = 80) -> str:
    r = repr(name)
    return r if len(r) <= limit else r[:limit] + "..."


def _read_value(cur: _Cursor, vtype: int, key: str, depth: int, warnings: list[str]) -> tuple[Any, str]:
    """Read one value of GGUF type ``vtype``; returns (value, type description)."""
    if vtype in _SCALARS:
        name, fmt, size, _ = _SCALARS[vtype]
        v = cur.unpack(fmt, size, f"value of key {_show(key)}")
        if vtype == T_BOOL:
            v = v != 0
        return v, name
    if vtype == T_STRING:
        return cur.string(f"value of key {_show(key)}"), "str"
    if vtype == T_ARRAY:
        at = cur.pos
        etype = cur.i32(f"array element type of key {_show(key)}")
        if etype not in VALUE_TYPE_NAMES:
            raise GGUFError(f"key {_show(key)}: invalid array element type {etype}", at)
        n_at = cur.pos
        n = cur.u64(f"array length of key {_show(key)}")
        if n > MAX_ARRAY_ELEMENTS:
            raise GGUFError(f"key {_show(key)}: array length {n} exceeds the maximum {MAX_ARRAY_ELEMENTS}", n_at)
        min_bytes = n * _min_elem_bytes(etype)
        if min_bytes > cur.remaining:
            raise GGUFError(f"key {_show(key)}: array of {n} {VALUE_TYPE_NAMES[etype]} needs at least "
                            f"{min_bytes} bytes but only {cur.remaining} remain", n_at)
        if etype == T_ARRAY:
            if depth + 1 >= MAX_ARRAY_DEPTH:
                raise GGUFError(f"key {_show(key)}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels", at)
            if depth == 0:
                warnings.append(f"key {key!r} holds nested arrays, which llama.cpp's GGUF loader refuses")
        if etype in _SCALARS and etype != T_BOOL:
            tc = _SCALARS[etype][3]
            arr = array.array(tc)
            if arr.itemsize != _SCALARS[etype][2]:  # platform without a matching C type
                vals = [cur.unpack(_SCALARS[etype][1], _SCALARS[etype][2], f"element of key {_show(key)}")
                        for _ in range(n)]
                return vals, f"array[{VALUE_TYPE_NAMES[etype]}]"
            arr.frombytes(cur.raw(min_bytes, f"array data of key {_show(key)}"))
            if sys.byteorder == "big":
                arr.byteswap()
            return arr, f"array[{VALUE_TYPE_NAMES[etype]}]"
        if etype == T_BOOL:
            data = cur.raw(n, f"array data of key {_show(key)}")
            return [b != 0 for b in data], "array[bool]"
        items: list[Any] = []
        inner = VALUE_TYPE_NAMES[etype]
        for _ in range(n):
            v, inner = _read_value(cur, etype, key, depth + 1, warnings)
            items.append(v)
        if etype == T_ARRAY and n == 0:
            inner = "array"
        return items, f"array[{inner}]"
    raise GGUFError(f"key {_show(key)}: invalid value type {vtype}", cur.pos - 4)


def _check_version(version: int, at: int) -> None:
    if version in SUPPORTED_VERSIONS:
        return
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version & 0xFFFF == 0 and 1 <= swapped <= 0xFFFF:
        raise GGUFError(f"big-endian GGUF not supported (version field reads {version:#010x}, "
                        f"i.e. version {swapped} byte-swapped)", at)
    if version == 0:
        raise GGUFError("bad GGUF version 0", at)
    if version == 1:
        raise GGUFError("GGUF version 1 is not supported (only versions 2 and 3)", at)
    raise GGUFError(f"unsupported GGUF version {version} (only versions 2 and 3)", at)


def _parse(buf: Any, size: int, path: str) -> GGUFFile:
    cur = _Cursor(buf, size)
    warnings: list[str] = []

    # --- header ---
    if size < 4:
        raise GGUFError(f"not a GGUF file: only {size} bytes, too short for the magic", 0)
    magic = cur.raw(4, "magic")
    if magic != GGUF_MAGIC:
        if magic == b"FUGG":
            raise GGUFError("big-endian GGUF not supported (byte-swapped magic 'FUGG')", 0)
        shown = "".join(chr(c) if 32 <= c < 127 else "?" for c in magic)
        raise GGUFError(f"not a GGUF file: bad magic {shown!r} ({magic.hex()}), expected 'GGUF'", 0)
    at = cur.pos
    version = cur.u32("version")
    _check_version(version, at)
    at_nt = cur.pos
    n_tensors = cur.u64("tensor count")
    at_nkv = cur.pos
    n_kv = cur.u64("key/value count")
    if n_tensors > _INT64_MAX:
        raise GGUFError(f"tensor count {n_tensors} is negative as int64", at_nt)
    if n_kv > _INT64_MAX:
        raise GGUFError(f"key/value count {n_kv} is negative as int64", at_nkv)
    if n_tensors * _MIN_TENSOR_INFO_BYTES > cur.remaining:
        raise GGUFError(f"tensor count {n_tensors} cannot fit: each tensor info takes at least "
                        f"{_MIN_TENSOR_INFO_BYTES} bytes and only {cur.remaining} bytes follow the header", at_nt)
    if n_kv * _MIN_KV_BYTES > cur.remaining:
        raise GGUFError(f"key/value count {n_kv} cannot fit: each pair takes at least "
                        f"{_MIN_KV_BYTES} bytes and only {cur.remaining} bytes follow the header", at_nkv)
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > cur.remaining:
        raise GGUFError(f"{n_kv} key/value pairs and {n_tensors} tensor infos cannot fit in the "
                        f"{cur.remaining} bytes after the header", at_nt)

    # --- key/value pairs ---
    kv: dict[str, Any] = {}
    kv_types: dict[str, str] = {}
    seen_keys: set[bytes] = set()
    kv_at: dict[str, int] = {}
    for i in range(n_kv):
        at = cur.pos
        raw_key = cur.string_bytes(f"key of key/value pair {i}")
        if not raw_key:
            raise GGUFError(f"key/value pair {i} has an empty key", at)
        key = raw_key.decode("utf-8", errors="replace")
        if raw_key in seen_keys or key in kv:
            raise GGUFError(f"duplicate key {_show(key)} (key/value pair {i})", at)
        seen_keys.add(raw_key)
        at_t = cur.pos
        vtype = cur.i32(f"value type of key {_show(key)}")
        if vtype not in VALUE_TYPE_NAMES:
            raise GGUFError(f"key {_show(key)} has invalid value type {vtype}", at_t)
        kv_at[key] = cur.pos
        value, tname = _read_value(cur, vtype, key, 0, warnings)
        kv[key] = value
        kv_types[key] = tname

    # --- alignment ---
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in kv:
        if kv_types["general.alignment"] != "u32":
            raise GGUFError(f"key 'general.alignment' must be of type u32 but is "
                            f"{kv_types['general.alignment']}", kv_at["general.alignment"])
        alignment = kv["general.alignment"]
        if alignment == 0 or alignment & (alignment - 1):
            raise GGUFError(f"general.alignment {alignment} is not a power of two", kv_at["general.alignment"])

    # --- tensor infos ---
    tensors: list[TensorInfo] = []
    seen_names: set[bytes] = set()
    seen_decoded: set[str] = set()
    raw_infos: list[tuple[str, tuple[int, ...], int, int, int, int]] = []
    for i in range(n_tensors):
        at = cur.pos
        raw_name = cur.string_bytes(f"name of tensor {i}")
        name = raw_name.decode("utf-8", errors="replace")
        if not raw_name:
            raise GGUFError(f"tensor {i} has an empty name", at)
        if len(raw_name) >= MAX_NAME:
            raise GGUFError(f"tensor {i} name {_show(name)} is too long: {len(raw_name)} bytes, "
                            f"llama.cpp allows at most {MAX_NAME - 1}", at)
        if raw_name in seen_names or name in seen_decoded:
            raise GGUFError(f"duplicate tensor name {_show(name)} (tensor {i})", at)
        seen_names.add(raw_name)
        seen_decoded.add(name)
        at = cur.pos
        n_dims = cur.u32(f"n_dims of tensor {_show(name)}")
        if n_dims > MAX_DIMS:
            raise GGUFError(f"tensor {_show(name)} has {n_dims} dimensions, at most {MAX_DIMS} allowed", at)
        shape_list = []
        for d in range(n_dims):
            at = cur.pos
            ne = cur.i64(f"dimension {d} of tensor {_show(name)}")
            if ne <= 0:
                raise GGUFError(f"tensor {_show(name)} dimension {d} is {ne}, must be > 0", at)
            shape_list.append(ne)
        shape = tuple(shape_list)
        nel = 1
        for d in shape:
            nel *= d
        if nel > _INT64_MAX:
            raise GGUFError(f"tensor {_show(name)} shape {list(shape)} has {nel} elements, "
                            f"more than INT64_MAX", at)
        at = cur.pos
        type_id = cur.i32(f"type of tensor {_show(name)}")
        tinfo = formats.find_type(type_id)
        if tinfo is None:
            raise GGUFError(f"tensor {_show(name)} has type {formats.describe_id(type_id)}", at)
        if tinfo.cache_only:
            # llama.cpp's loader refuses it too (patch 0321): a weight of it would decode with uniform levels
            raise GGUFError(f"tensor {_show(name)} has type {tinfo.name} (id {type_id}), a KVQuant KV cache "
                            "type that holds no weights (only a KV cache with its calibration gives its bytes "
                            "a meaning); the file is damaged or was not made by ggml-ext", at)
        try:
            nbytes = formats.tensor_nbytes(tinfo, shape)
        except ValueError as e:
            raise GGUFError(f"tensor {_show(name)} of type {tinfo.name}: {e}", at) from None
        at = cur.pos
        offset = cur.u64(f"data offset of tensor {_show(name)}")
        raw_infos.append((name, shape, type_id, offset, nbytes, at))

    # --- data section ---
    info_end = cur.pos
    if n_tensors > 0:
        data_offset = (info_end + alignment - 1) // alignment * alignment
        if data_offset > size:
            raise GGUFError(f"data section would start at {data_offset} (tensor infos end at {info_end}, "
                            f"alignment {alignment}), beyond the end of the {size}-byte file", info_end)
    else:
        data_offset = info_end

    for name, shape, type_id, offset, nbytes, at in raw_infos:
        if offset % alignment:
            raise GGUFError(f"tensor {_show(name)} data offset {offset} is not a multiple of "
                            f"the alignment {alignment}", at)
        start = data_offset + offset
        if start > size or nbytes > size - start:
            raise GGUFError(f"tensor {_show(name)} data [{start}, {start + nbytes}) is not within the "
                            f"{size}-byte file (truncated or corrupted)", at)
        tinfo = formats.TYPES[type_id]
        tensors.append(TensorInfo(name, shape, type_id, tinfo.name, offset, nbytes, start, at - 4))

    order = sorted(range(len(tensors)), key=lambda j: (tensors[j].offset, j))
    for a, b in zip(order, order[1:]):
        ta, tb = tensors[a], tensors[b]
        if ta.offset + ta.nbytes > tb.offset:
            raise GGUFError(f"tensor {_show(tb.name)} data [{tb.offset}, {tb.offset + tb.nbytes}) overlaps "
                            f"tensor {_show(ta.name)} data [{ta.offset}, {ta.offset + ta.nbytes}) "
                            f"(offsets relative to the data section at {data_offset})", raw_infos[b][5])

    expected = 0
    for t in tensors:
        if t.offset != expected:
            warnings.append(f"tensor {t.name!r} is at data offset {t.offset}, where llama.cpp expects {expected} "
                            f"(tensors packed in file order, each padded to {alignment}); llama.cpp will refuse "
                            "this file")
            break
        expected += (t.nbytes + alignment - 1) // alignment * alignment

    return GGUFFile(path=path, version=version, kv=kv, tensors=tensors, data_offset=data_offset,
                    alignment=alignment, file_size=size, kv_types=kv_types, warnings=warnings)


def parse_gguf_bytes(data: bytes | bytearray | memoryview, path: str = "<bytes>") -> GGUFFile:
    """Parse GGUF metadata from an in-memory buffer (the whole file)."""
    return _parse(data, len(data), path)


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Read and validate a GGUF file's metadata.

    Raises GGUFError for a malformed or unsupported file and OSError (e.g.
    FileNotFoundError) when the file cannot be opened.
    """
    spath = os.fspath(path)
    with open(spath, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError("not a regular file", None)
        size = st.st_size
        mm = None
        if size > 0:
            try:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                mm = None
        if mm is None:
            # mmap unavailable (some FUSE file systems): positioned plain reads.
            return _parse(_FileBuf(f), size, spath)
        try:
            return _parse(mm, size, spath)
        finally:
            mm.close()
