"""GGUF files, read and written in one place.

* :mod:`.reader`: metadata and tensor infos of any GGUF v2/v3 file, safe on hostile
  input (every count and offset checked before use; :class:`GGUFError` names the byte).
* :mod:`.writer`: the streaming writer that leaves the whole file or nothing
  (:class:`GGUFWriter`; :class:`GGUFWriteError` when the file cannot be written as asked).

Nothing here knows about converters, methods or models: they build on this package,
not the other way round.
"""
from __future__ import annotations

from .reader import (DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_ARRAY_ELEMENTS, MAX_DIMS, MAX_NAME,
                     MAX_STRING_LENGTH, VALUE_TYPE_NAMES, GGUFError, GGUFFile, TensorInfo, TypeStats,
                     parse_gguf_bytes, read_gguf)
from .writer import VALUE_TYPES, GGUFWriteError, GGUFWriter

__all__ = [
    "GGUFError", "GGUFFile", "TensorInfo", "TypeStats", "read_gguf", "parse_gguf_bytes",
    "GGUF_MAGIC", "DEFAULT_ALIGNMENT", "MAX_STRING_LENGTH", "MAX_ARRAY_ELEMENTS",
    "MAX_ARRAY_DEPTH", "MAX_NAME", "MAX_DIMS", "VALUE_TYPE_NAMES",
    "GGUFWriter", "GGUFWriteError", "VALUE_TYPES",
]
