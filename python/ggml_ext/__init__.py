"""ggml-ext: the low-bit toolchain for llama.cpp.

The compiled parts (our patched llama.cpp's libraries and tools) are installed
inside this package; `ggml_ext.build_info.report()` says what was built.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = ["__version__", "convert"]


def __getattr__(name: str):
    # `ggml_ext.convert(...)`: the convert verb module is callable (it forwards to converters.convert).
    if name == "convert":
        return importlib.import_module(".convert", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
