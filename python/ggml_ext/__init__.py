"""ggml-ext: the low-bit toolchain for llama.cpp.

The compiled parts (our patched llama.cpp's libraries and tools) are installed
inside this package; `ggml_ext.build_info.report()` says what was built.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
