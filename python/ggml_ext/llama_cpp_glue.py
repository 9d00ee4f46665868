"""Make llama-cpp-python run on our libllama.

llama-cpp-python 0.3.36 is pinned to the same llama.cpp commit as our build, so
its ctypes declarations match our llama.h. It is installed with
CMAKE_ARGS="-DLLAMA_BUILD=OFF" (it compiles nothing) and finds our library
through LLAMA_CPP_LIB_PATH, which must be set before `llama_cpp` is imported.
"""
from __future__ import annotations

import ctypes
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
    _load_backend_modules(module.llama_cpp._lib)
    return module


def _load_backend_modules(lib: ctypes.CDLL) -> None:
    """A release bundle's libraries (make dist: GGML_BACKEND_DL) hold the CPU backend as modules in bin/, one per
    CPU variant, which ggml looks for beside the running program: here that is python, so ggml is pointed at
    bin/ (it loads the variant that scores best on this CPU). A build with a linked CPU backend has none."""
    bin_dir = _locate.bin_dir()
    if not any(bin_dir.glob("libggml-cpu-*.so")):
        return
    count = lib.ggml_backend_reg_count
    count.argtypes, count.restype = [], ctypes.c_size_t
    if count():  # loaded already by the import hook of _ggml_ext_llama_cpp_path (a wheel made from a bundle)
        return
    fn = lib.ggml_backend_load_all_from_path  # in libggml, found through libllama's dependencies
    fn.argtypes, fn.restype = [ctypes.c_char_p], None
    fn(os.fsencode(bin_dir))


def set_apq_bits(bits: int | None) -> None:
    """The precision any-precision (APQ) weights run at in contexts made from now on (None: back to
    GGML_EXT_APQ_BITS, else each file's highest). Process-wide in libllama (ggml_ext_llama_set_apq_bits);
    a context keeps the precision in effect when it was made (patch 0312), so a Llama created earlier
    keeps its own; one made with none set follows this setting."""
    lib = load_llama_cpp().llama_cpp._lib
    fn = lib.ggml_ext_llama_set_apq_bits
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    if fn(0 if bits is None else int(bits)) != 0 or (bits is not None and bits < 1):
        raise ValueError(f"apq_bits={bits}: a precision is 1..8")


def set_dec(path: str | os.PathLike | None, k: str | int | None = None, ntb: str | int | None = None) -> None:
    """QDEC (docs/QDEC.md "In llama.cpp"): the side file models loaded from now on use (None: back to
    GGML_EXT_DEC), and k_chunk / n_tb per linear type for graphs built from now on ("16" or
    "qkv=16,o=8,gateup=16,down=32"; None: back to GGML_EXT_DEC_K / GGML_EXT_DEC_NTB, else 16 / 0).
    Process-wide in libllama, as the tools' --dec, --dec-k, --dec-ntb. ValueError for a bad k / ntb."""
    lib = load_llama_cpp().llama_cpp._lib
    set_path = lib.ggml_ext_llama_set_dec
    set_path.argtypes, set_path.restype = [ctypes.c_char_p], ctypes.c_int
    err = ctypes.create_string_buffer(512)
    for name, value in (("ggml_ext_llama_set_dec_k", k), ("ggml_ext_llama_set_dec_ntb", ntb)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int
        if fn(None if value is None else str(value).encode(), err, len(err)) != 0:
            raise ValueError(err.value.decode(errors="replace"))
    set_path(None if path is None else os.fsencode(path))


def check_apq_bits(path: str | os.PathLike, bits: int) -> None:
    """ValueError unless ``path`` is an any-precision file serving ``bits``."""
    from .anyprec import AnyPrecError
    from .anyprec.extract import open_file
    try:
        f = open_file(path)
    except AnyPrecError as e:
        raise ValueError(f"apq_bits={bits} given, but {e}") from None
    if not f.seed <= bits <= f.parent:
        raise ValueError(f"apq_bits={bits}: {path} serves {f.seed} to {f.parent} bits")


def Llama(model_path: str | os.PathLike, *, apq_bits: int | None = None, dec: str | os.PathLike | None = None,  # noqa: N802 - mirrors llama_cpp.Llama
          dec_k: str | int | None = None, dec_ntb: str | int | None = None, **kwargs):
    """`llama_cpp.Llama` on our libllama; raises ValueError with llama.cpp's reason when loading fails.

    ``apq_bits``: the precision of an any-precision file (``convert --method anyprec``; default: its
    highest); checked against the file. The Llama keeps it for its life (two Llama objects of one
    process can run at two precisions); it is also left as the process-wide setting (:func:`set_apq_bits`).

    ``dec`` / ``dec_k`` / ``dec_ntb``: a QDEC side file and its k_chunk / n_tb (:func:`set_dec`; also
    process-wide: they stay set for later models; ``set_dec(None)`` goes back to the environment)."""
    llama_cpp = load_llama_cpp()
    path = Path(model_path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    if apq_bits is not None:
        check_apq_bits(path, apq_bits)
        set_apq_bits(apq_bits)
    if dec is not None or dec_k is not None or dec_ntb is not None:
        set_dec(dec, k=dec_k, ntb=dec_ntb)
    kwargs.setdefault("verbose", False)
    return llama_cpp.Llama(model_path=str(path), **kwargs)
