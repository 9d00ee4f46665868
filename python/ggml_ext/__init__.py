"""ggml-ext: the low-bit toolchain for llama.cpp.

The compiled parts (our patched llama.cpp's libraries and tools) are installed
inside this package; `ggml_ext.build_info.report()` says what was built.
"""
from __future__ import annotations

import importlib
from pathlib import Path

__version__ = "0.1.0"

__all__ = ["__version__", "convert"]

# The converters live in the repository's top-level converters/ folder; the wheel
# installs them as ggml_ext/converters. Running from a source checkout
# (PYTHONPATH=python), let `ggml_ext.converters` resolve to that folder.
_here = Path(__file__).resolve().parent
if not (_here / "converters").is_dir() and (_here.parents[1] / "converters" / "__init__.py").is_file():
    __path__.append(str(_here.parents[1]))  # noqa: F821 - the package's own search path


def __getattr__(name: str):
    # `ggml_ext.convert(...)`: the convert verb module is callable (it forwards to converters.convert).
    if name == "convert":
        return importlib.import_module(".convert", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
