"""Point llama-cpp-python at ggml-ext's libllama, so that plain `from llama_cpp import Llama` runs on it.

Imported at every Python start by `_ggml_ext_llama_cpp_path.pth`, which our wheel installs into
site-packages beside this file. llama-cpp-python is installed with -DLLAMA_BUILD=OFF (it has no
libllama of its own) and loads the library from $LLAMA_CPP_LIB_PATH (libmtmd from $MTMD_CPP_LIB)
when it is imported; this sets both if they are unset. It must stay cheap and silent: it imports
neither ggml_ext nor numpy, only looks at a few paths, and never raises (a .pth line that fails
prints an error at every Python start).
"""
import os
import sys

_LIB = "libllama.dylib" if sys.platform == "darwin" else "libllama.so"


def _has_lib(folder):
    return os.path.isfile(os.path.join(folder, _LIB))


def lib_dir():
    """ggml-ext's lib/ folder, found the way ggml_ext._locate finds it (GGML_EXT_PREFIX, then the
    installed package; an editable install keeps its compiled files in site-packages too), or None."""
    roots = [os.environ.get("GGML_EXT_PREFIX")]
    roots += [os.path.join(p, "ggml_ext") for p in [os.path.dirname(os.path.abspath(__file__)), *sys.path] if p]
    for root in roots:
        if root and _has_lib(os.path.join(root, "lib")):
            return os.path.join(root, "lib")
    return None


def _llama_cpp_has_its_own_lib():
    """True when the llama_cpp package found first was built with its own libllama (not ours to redirect)."""
    for p in sys.path:
        pkg = os.path.join(p or os.curdir, "llama_cpp")
        if os.path.isfile(os.path.join(pkg, "__init__.py")):
            return _has_lib(os.path.join(pkg, "lib"))
    return False


def install():
    if "LLAMA_CPP_LIB_PATH" in os.environ or _llama_cpp_has_its_own_lib():
        return
    lib = lib_dir()
    if lib:
        os.environ["LLAMA_CPP_LIB_PATH"] = lib
        os.environ.setdefault("MTMD_CPP_LIB", lib)


try:
    install()
except Exception:  # never break Python's start-up
    pass
