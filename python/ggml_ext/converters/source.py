"""Reading a Hugging Face model folder: config, tensor index, tensor data, source hash.

Weights are found in this order:

1. ``model.safetensors.index.json`` (sharded safetensors) or ``model.safetensors``;
2. ``pytorch_model.bin.index.json`` (sharded) or ``pytorch_model.bin``.

Safetensors files are parsed here (an 8-byte little-endian header length, a JSON
header, then raw little-endian data): every tensor's dtype, shape and byte range
are checked against the file before anything is read, so a truncated or
inconsistent file fails at once with the file and tensor named.  A tensor is
read with one positioned read into a NumPy buffer when it is needed, so memory
holds the tensors being converted, never the model.  F32, F16 and BF16 are read;
everything is handed on as float32.

PyTorch ``.bin`` files are loaded with ``torch.load(weights_only=True)``
(tensors and plain containers only: no code from the file runs) and
``mmap=True`` where the file is in the zip format, so tensors are paged in on use.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .errors import ConversionError

__all__ = ["TensorRef", "Checkpoint", "open_checkpoint", "SUPPORTED_DTYPES"]

# safetensors dtype -> (numpy dtype of the stored values, bytes per value)
_ST_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2)}
SUPPORTED_DTYPES = tuple(_ST_DTYPES)
_MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
_HASH_CHUNK = 8 << 20


@dataclass(frozen=True)
class TensorRef:
    """Where one source tensor lives. ``shape`` is PyTorch's (row-major, outermost first)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "F32", "F16" or "BF16"
    file: Path
    offset: int = 0  # absolute byte offset (safetensors)
    nbytes: int = 0

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _load_json(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConversionError(f"{what} not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path}: not valid JSON ({e})") from None


def _parse_safetensors(path: Path) -> dict[str, TensorRef]:
    """The tensors of one safetensors file, checked against its size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConversionError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > _MAX_HEADER or 8 + hlen > size:
                raise ConversionError(f"{path}: truncated or corrupt safetensors file (header of {hlen} bytes "
                                      f"announced, file is {size} bytes)")
            raw = f.read(hlen)
    except OSError as e:
        raise ConversionError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path}: corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise ConversionError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_start = 8 + hlen
    out: dict[str, TensorRef] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConversionError(f"{path}: tensor {name!r} has a malformed header entry") from None
        if dtype not in _ST_DTYPES:
            raise ConversionError(f"{path}: tensor {name!r} has dtype {dtype}; only "
                                  f"{', '.join(SUPPORTED_DTYPES)} checkpoints can be converted")
        n = 1
        for d in shape:
            if d < 0:
                raise ConversionError(f"{path}: tensor {name!r} has a negative dimension {shape}")
            n *= d
        itemsize = _ST_DTYPES[dtype][1]
        if not (isinstance(begin, int) and isinstance(end, int)) or begin < 0 or end < begin:
            raise ConversionError(f"{path}: tensor {name!r} has bad data offsets {info['data_offsets']}")
        if end - begin != n * itemsize:
            raise ConversionError(f"{path}: tensor {name!r} of shape {list(shape)} ({dtype}) needs {n * itemsize} "
                                  f"bytes but its data range holds {end - begin}")
        if data_start + end > size:
            raise ConversionError(f"{path}: truncated safetensors file: tensor {name!r} ends at byte "
                                  f"{data_start + end} but the file has {size} bytes")
        out[name] = TensorRef(name, shape, dtype, path, data_start + begin, end - begin)
    return out


def _torch():
    try:
        import torch
    except ImportError:
        raise ConversionError("PyTorch .bin checkpoints need torch (pip install 'ggml-ext[convert]'); "
                              "safetensors checkpoints do not") from None
    return torch


_TORCH_DTYPES = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16"}


class Checkpoint:
    """A Hugging Face model folder: ``config`` (config.json) and its tensors, read on demand."""

    def __init__(self, folder: str | os.PathLike, weights: bool = True):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ConversionError(f"not a folder: {self.folder}")
        self.config_path = self.folder / "config.json"
        if not self.config_path.is_file():
            raise ConversionError(f"{self.folder} has no config.json: not a Hugging Face model folder")
        self.config: dict[str, Any] = _load_json(self.config_path, "config.json")
        if not isinstance(self.config, dict):
            raise ConversionError(f"{self.config_path}: not a JSON object")
        if weights:
            self.format, self.weight_files, self.tensors = self._index()
        else:
            self.format, self.weight_files, self.tensors = "none", [], {}
        self._torch_state: dict[Path, dict] = {}

    # ----------------------------------------------------------------- index
    def _index(self) -> tuple[str, list[Path], dict[str, TensorRef]]:
        f = self.folder
        st_index = f / "model.safetensors.index.json"
        if st_index.is_file() or (f / "model.safetensors").is_file():
            files = self._shards(st_index, f / "model.safetensors")
            tensors: dict[str, TensorRef] = {}
            for p in files:
                for name, ref in _parse_safetensors(p).items():
                    if name in tensors:
                        raise ConversionError(f"tensor {name!r} is in both {tensors[name].file.name} and {p.name}")
                    tensors[name] = ref
            if st_index.is_file():
                for name, fname in self._weight_map(st_index).items():
                    if name not in tensors:
                        raise ConversionError(f"{st_index.name} lists tensor {name!r} in {fname}, "
                                              f"but that file does not hold it")
            return "safetensors", files, tensors
        bin_index = f / "pytorch_model.bin.index.json"
        if bin_index.is_file() or (f / "pytorch_model.bin").is_file():
            files = self._shards(bin_index, f / "pytorch_model.bin")
            return "pytorch", files, self._torch_index(files)
        raise ConversionError(f"{f} holds no weights: expected model.safetensors, "
                              "model.safetensors.index.json with its shards, pytorch_model.bin "
                              "or pytorch_model.bin.index.json")

    def _shards(self, index: Path, single: Path) -> list[Path]:
        if not index.is_file():
            return [single]
        wmap = self._weight_map(index)
        files = []
        for name in sorted(set(wmap.values())):
            p = self.folder / name
            if Path(name).name != name:
                raise ConversionError(f"{index}: shard name {name!r} is not a plain file name")
            if not p.is_file():
                raise ConversionError(f"{index} names shard {name}, which is missing")
            files.append(p)
        return files

    @staticmethod
    def _weight_map(index: Path) -> dict[str, str]:
        data = _load_json(index, index.name)
        wmap = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wmap, dict) or not wmap:
            raise ConversionError(f"{index}: no weight_map")
        if not all(isinstance(v, str) for v in wmap.values()):
            raise ConversionError(f"{index}: weight_map values must be file names")
        return wmap

    def _torch_index(self, files: list[Path]) -> dict[str, TensorRef]:
        torch = _torch()
        tensors: dict[str, TensorRef] = {}
        for p in files:
            state = self._load_torch(p)
            for name, t in state.items():
                if not isinstance(t, torch.Tensor):
                    raise ConversionError(f"{p}: entry {name!r} is not a tensor")
                dtype = _TORCH_DTYPES.get(str(t.dtype))
                if dtype is None:
                    raise ConversionError(f"{p}: tensor {name!r} has dtype {t.dtype}; only float32, float16 "
                                          "and bfloat16 checkpoints can be converted")
                if name in tensors:
                    raise ConversionError(f"tensor {name!r} is in both {tensors[name].file.name} and {p.name}")
                tensors[name] = TensorRef(name, tuple(t.shape), dtype, p, 0, t.numel() * t.element_size())
        return tensors

    def _load_torch(self, p: Path) -> dict:
        torch = _torch()
        try:
            try:
                state = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                state = torch.load(p, map_location="cpu", weights_only=True)  # legacy (non-zip) format
        except Exception as e:  # noqa: BLE001 - unpickling errors come in many types
            raise ConversionError(f"{p}: cannot be loaded as a weights-only PyTorch checkpoint "
                                  f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        if not isinstance(state, dict):
            raise ConversionError(f"{p}: not a state dict")
        if "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        return state

    # ----------------------------------------------------------------- data
    def load(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a float32 array in PyTorch's shape (a fresh, writable array)."""
        ref = self.tensors[name]
        if self.format == "pytorch":
            state = self._torch_state.get(ref.file)
            if state is None:
                self._torch_state.clear()  # one shard at a time
                state = self._torch_state[ref.file] = self._load_torch(ref.file)
            t = state[name]
            # float() already makes a new tensor; a float32 one is copied out of the mapped file
            return t.float().numpy() if t.dtype != _torch().float32 else t.numpy().copy()
        np_dtype, itemsize = _ST_DTYPES[ref.dtype]
        raw = np.empty(ref.n_elements, dtype=np_dtype)
        with open(ref.file, "rb") as f:
            f.seek(ref.offset)
            got = f.readinto(memoryview(raw).cast("B"))
        if got != ref.nbytes:
            raise ConversionError(f"{ref.file}: truncated while reading tensor {name!r} "
                                  f"({got} of {ref.nbytes} bytes)")
        if ref.dtype == "F32":
            out = raw
        elif ref.dtype == "F16":
            out = raw.astype(np.float32)
        else:  # BF16: the top half of a float32
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        return out.reshape(ref.shape)

    def close(self) -> None:
        self._torch_state.clear()

    # ----------------------------------------------------------------- identity
    def hashed_files(self) -> list[Path]:
        """config.json, then the weight files in name order: what ``source_hash`` covers."""
        return [self.config_path, *sorted(self.weight_files, key=lambda p: p.name)]

    def source_hash(self, progress=None, stop=None) -> str | None:
        """sha256 over config.json and the weight files, streamed.

        For each file of :meth:`hashed_files`, in order: its name (UTF-8), a zero byte,
        its size as 8 bytes little-endian, then its bytes. ``progress(n)`` is called
        with the bytes read so far.
        """
        h = hashlib.sha256()
        buf = bytearray(_HASH_CHUNK)
        view = memoryview(buf)
        for p in self.hashed_files():
            size = p.stat().st_size
            h.update(p.name.encode() + b"\0" + struct.pack("<Q", size))
            with open(p, "rb", buffering=0) as f:
                while True:
                    n = f.readinto(buf)
                    if not n:
                        break
                    if stop is not None and stop():
                        return None
                    h.update(view[:n])
                    if progress:
                        progress(n)
        return h.hexdigest()

    def hashed_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.hashed_files())

    def __iter__(self) -> Iterator[TensorRef]:
        return iter(self.tensors.values())


def open_checkpoint(folder: str | os.PathLike, weights: bool = True) -> Checkpoint:
    return Checkpoint(folder, weights)
