"""Make llama-cpp-python run on our libllama.

llama-cpp-python 0.3.36 is pinned to the same llama.cpp commit as our build, so
its ctypes declarations match our llama.h. It is installed with
CMAKE_ARGS="-DLLAMA_BUILD=OFF" (it compiles nothing) and finds our library
through LLAMA_CPP_LIB_PATH, which must be set before `llama_cpp` is imported.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from pathlib import Path
from types import ModuleType

from . import _locate

REQUIRED_VERSION = "0.3.36"
INSTALL_HINT = (
    f'CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install --no-binary llama-cpp-python llama-cpp-python=={REQUIRED_VERSION}'
)


class BindingError(RuntimeError):
    """llama-cpp-python is missing, the wrong version, or bound to another libllama."""


def _check_version() -> None:
    try:
        installed = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise BindingError(f"llama-cpp-python is not installed; install it with:\n  {INSTALL_HINT}") from None
    if installed != REQUIRED_VERSION:
        raise BindingError(
            f"llama-cpp-python {installed} is installed, but ggml-ext needs exactly {REQUIRED_VERSION} "
            f"(its ctypes bindings must match our llama.h); reinstall with:\n  {INSTALL_HINT}"
        )


def load_llama_cpp() -> ModuleType:
    """Import `llama_cpp` bound to our libllama and return the module."""
    _check_version()
    lib_dir = _locate.lib_dir()
    loaded = sys.modules.get("llama_cpp.llama_cpp")
    if loaded is not None:
        bound = Path(getattr(loaded, "_base_path", "")).resolve()
        if bound != lib_dir.resolve():
            raise BindingError(
                f"llama_cpp was already imported with the library in {bound}, not ggml-ext's {lib_dir}; "
                "import ggml_ext's bindings before anything imports llama_cpp"
            )
        return importlib.import_module("llama_cpp")
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    module = importlib.import_module("llama_cpp")
    try:
        module.llama_cpp._lib.ggml_ext_version  # noqa: B018 - symbol probe
    except AttributeError:
        raise BindingError(f"llama_cpp loaded a libllama without ggml-ext from {module.llama_cpp._base_path}") from None
    return module


def Llama(model_path: str | os.PathLike, **kwargs):  # noqa: N802 - mirrors llama_cpp.Llama
    """`llama_cpp.Llama` on our libllama; raises ValueError with llama.cpp's reason when loading fails."""
    llama_cpp = load_llama_cpp()
    path = Path(model_path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    kwargs.setdefault("verbose", False)
    return llama_cpp.Llama(model_path=str(path), **kwargs)
