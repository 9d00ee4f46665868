"""A streaming GGUF v3 writer that leaves either the whole file or nothing.

Usage::

    w = GGUFWriter("out.gguf", force=False)
    w.add("general.architecture", "str", "llama")
    w.add_tensor_info("token_embd.weight", (576, 49152), type_id, nbytes)
    with w:                       # opens a temp file next to out.gguf, writes the header
        w.write_tensor(buf)       # each tensor's bytes, in the order announced
        w.set("ggml_ext.source_hash", "...")   # may change a value of the same encoded size
    # leaving the block normally moves the temp file into place; an exception
    # (KeyboardInterrupt included) removes it and leaves any old out.gguf as it was.

Every tensor info is known before any data is written (shapes and types are
planned from the checkpoint's headers), so the header goes first and tensor data
streams behind it; only values of the same encoded size can be set late (the
source hash, computed while the tensors are written), and the header is then
rewritten in place.  Without ``force`` an existing file is never replaced: the
final step is a hard link, which fails if the name has appeared meanwhile.
"""
from __future__ import annotations

import numbers

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import _atomic, formats

__all__ = ["GGUFWriter", "GGUFWriteError", "VALUE_TYPES"]

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# GGUF value types
VALUE_TYPES = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8,
               "array": 9, "u64": 10, "i64": 11, "f64": 12}
_SCALAR_FMT = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i", "f32": "<f",
               "bool": "<?", "u64": "<Q", "i64": "<q", "f64": "<d"}
_NP_DTYPE = {"u8": "<u1", "i8": "<i1", "u16": "<u2", "i16": "<i2", "u32": "<u4", "i32": "<i4", "f32": "<f4",
             "bool": "<u1", "u64": "<u8", "i64": "<i8", "f64": "<f8"}


def _string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _encode_value(vtype: str, value: Any) -> bytes:
    """Type id and bytes of one value. ``vtype`` is a scalar name, "str", or "array[<elem>]"."""
    if vtype == "str":
        return struct.pack("<I", VALUE_TYPES["str"]) + _string(value)
    if vtype in _SCALAR_FMT:
        return struct.pack("<I", VALUE_TYPES[vtype]) + struct.pack(_SCALAR_FMT[vtype], value)
    if vtype.startswith("array[") and vtype.endswith("]"):
        elem = vtype[6:-1]
        head = struct.pack("<I", VALUE_TYPES["array"])
        if elem == "str":
            parts = [struct.pack("<IQ", VALUE_TYPES["str"], len(value))]
            parts.extend(_string(v) for v in value)
            return head + b"".join(parts)
        if elem in _NP_DTYPE:
            arr = np.asarray(value)
            if elem == "bool":
                arr = arr.astype(bool)
            data = arr.astype(_NP_DTYPE[elem]).tobytes()
            return head + struct.pack("<IQ", VALUE_TYPES[elem], len(arr)) + data
    raise ValueError(f"unsupported GGUF value type {vtype!r}")


@dataclass
class _TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    type_id: int
    nbytes: int
    offset: int = 0


class GGUFWriteError(ValueError):
    """The file cannot be written as asked: it exists (and ``force`` is off), its folder is
    missing, or a tensor name is too long for ggml. The message says which; callers such as
    the converter pass it on to the user as their own error."""


def _pad(n: int, align: int = ALIGNMENT) -> int:
    return (n + align - 1) // align * align


class GGUFWriter:
    def __init__(self, path: str | os.PathLike, *, force: bool = False):
        self.path = Path(path)
        self.force = force
        self._kv: dict[str, tuple[str, Any]] = {}
        self._tensors: list[_TensorInfo] = []
        self._names: set[str] = set()
        self._fh = None
        self._tmp: Path | None = None
        self._next = 0  # index of the next tensor to write
        self._header_size = 0
        self._dirty = False
        if self.path.exists() and not force:
            raise GGUFWriteError(f"{self.path} exists; pass --force (force=True) to replace it")
        if not self.path.parent.is_dir():
            raise GGUFWriteError(f"output folder does not exist: {self.path.parent}")

    # ----------------------------------------------------------------- building
    def add(self, key: str, vtype: str, value: Any) -> None:
        if self._fh is not None:
            raise RuntimeError("metadata must be added before the file is opened (use set() for late values)")
        if key in self._kv:
            raise ValueError(f"duplicate key {key!r}")
        _encode_value(vtype, value)  # fail early on a bad value
        self._kv[key] = (vtype, value)

    def add_values(self, prefix: str, values: dict[str, Any]) -> None:
        """``prefix.KEY`` for every item of a flat metadata dict, the GGUF type from the Python value: bool,
        integer (u32, or i32 when negative), float (f64), str, a list of integers (array[i32]) or of other
        values (array[str]); anything else is a TypeError naming the key."""
        for k, v in values.items():
            key = f"{prefix}.{k}"
            if isinstance(v, bool):
                self.add(key, "bool", v)
            elif isinstance(v, numbers.Integral):
                self.add(key, "u32" if v >= 0 else "i32", int(v))
            elif isinstance(v, float):
                self.add(key, "f64", v)
            elif isinstance(v, str):
                self.add(key, "str", v)
            elif isinstance(v, (list, tuple)) and all(isinstance(e, numbers.Integral) for e in v):
                self.add(key, "array[i32]", [int(e) for e in v])
            elif isinstance(v, (list, tuple)):
                self.add(key, "array[str]", [str(e) for e in v])
            else:
                raise TypeError(f"{key}: cannot store {type(v).__name__}")

    def set(self, key: str, value: Any) -> None:
        """Change a value after the header was written: only to one of the same encoded size."""
        vtype, old = self._kv[key]
        if len(_encode_value(vtype, old)) != len(_encode_value(vtype, value)):
            raise ValueError(f"{key}: a late value must have the same encoded size as the placeholder")
        self._kv[key] = (vtype, value)
        self._dirty = True

    def add_tensor_info(self, name: str, shape: tuple[int, ...], type_id: int, nbytes: int) -> None:
        if self._fh is not None:
            raise RuntimeError("tensor infos must be added before the file is opened")
        if name in self._names:
            raise ValueError(f"duplicate tensor {name!r}")
        if len(name.encode()) >= 64:
            raise GGUFWriteError(f"tensor name {name!r} is longer than ggml's 63-byte limit")
        t = formats.find_type(int(type_id))
        if t is not None and t.cache_only:
            # the reader and llama.cpp's loader refuse such a file: never write one
            raise GGUFWriteError(f"tensor {name!r}: type {t.name} (id {t.id}) is a KV cache type, not a tensor type")
        self._names.add(name)
        self._tensors.append(_TensorInfo(name, tuple(int(d) for d in shape), int(type_id), int(nbytes)))

    def _header(self) -> bytes:
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self._tensors), len(self._kv))]
        for key, (vtype, value) in self._kv.items():
            parts.append(_string(key))
            parts.append(_encode_value(vtype, value))
        offset = 0
        for t in self._tensors:
            t.offset = offset
            parts.append(_string(t.name))
            parts.append(struct.pack("<I", len(t.shape)))
            parts.append(struct.pack(f"<{len(t.shape)}Q", *t.shape))
            parts.append(struct.pack("<IQ", t.type_id, offset))
            offset += _pad(t.nbytes)
        head = b"".join(parts)
        return head + b"\0" * (_pad(len(head)) - len(head))

    @property
    def total_size(self) -> int:
        return len(self._header()) + sum(_pad(t.nbytes) for t in self._tensors)

    # ----------------------------------------------------------------- writing
    def __enter__(self) -> "GGUFWriter":
        # named for this process; a dead run's leftover for the same output is removed here
        fd, self._tmp = _atomic.temp_file(self.path)
        try:  # __exit__ does not run when __enter__ fails: clean up here
            self._fh = os.fdopen(fd, "wb")
            head = self._header()
            self._header_size = len(head)
            self._fh.write(head)
        except BaseException:
            if self._fh is None:
                os.close(fd)
            self.abort()
            raise
        return self

    def write_tensor(self, data: np.ndarray | bytes | memoryview) -> None:
        if self._fh is None:
            raise RuntimeError("open the writer first (with GGUFWriter(...) as w)")
        if self._next >= len(self._tensors):
            raise RuntimeError("more tensors written than announced")
        t = self._tensors[self._next]
        buf = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) else memoryview(data)
        if buf.nbytes != t.nbytes:
            raise RuntimeError(f"tensor {t.name}: {buf.nbytes} bytes written, {t.nbytes} announced")
        self._fh.write(buf)
        self._fh.write(b"\0" * (_pad(t.nbytes) - t.nbytes))
        self._next += 1

    def _finish(self) -> None:
        assert self._fh is not None and self._tmp is not None
        if self._next != len(self._tensors):
            raise RuntimeError(f"only {self._next} of {len(self._tensors)} tensors were written")
        if self._dirty:
            head = self._header()
            if len(head) != self._header_size:
                raise RuntimeError("header size changed")
            self._fh.seek(0)
            self._fh.write(head)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        os.chmod(self._tmp, 0o644 & ~_umask())
        if self.force:
            os.replace(self._tmp, self.path)
        else:
            try:
                os.link(self._tmp, self.path)  # fails if the name exists: never clobber
            except FileExistsError:
                raise GGUFWriteError(f"{self.path} appeared while converting; pass --force to replace it") from None
            except OSError:
                if self.path.exists():
                    raise
                os.replace(self._tmp, self.path)  # file systems without hard links
            finally:
                if self._tmp.exists():
                    self._tmp.unlink()
        self._tmp = None

    def abort(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass  # closing flushes what is buffered, which fails again after a write error (disk full)
            finally:
                self._fh = None
        if self._tmp is not None:
            try:
                self._tmp.unlink()
            except FileNotFoundError:
                pass
            self._tmp = None

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self._finish()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
