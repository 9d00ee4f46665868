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


class _LoadBackendModules:
    """A wheel made from a release bundle (scripts/build_wheels.py) has its CPU backend as modules in bin/, one per
    CPU variant; llama.cpp's llama_backend_init looks for them beside the running program (python) and finds none.
    This import hook waits until llama_cpp.llama_cpp has loaded our libllama, then points ggml at bin/ (ggml loads
    the variant that scores best on this CPU) before anything makes a model. Nothing is loaded at Python's start."""

    def __init__(self, bin_dir):
        self.bin_dir = bin_dir

    def find_spec(self, name, path=None, target=None):
        if name != "llama_cpp.llama_cpp":
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module, bin_dir = spec.loader.exec_module, self.bin_dir

        def exec_then_load(module):
            exec_module(module)
            load_backend_modules(module._lib, bin_dir)

        spec.loader.exec_module = exec_then_load
        return spec


def load_backend_modules(lib, bin_dir):
    """ggml_backend_load_all_from_path(bin_dir) unless backends are registered already (a linked CPU backend, or
    an earlier call); libggml's functions are reached through libllama's dependencies."""
    import ctypes
    count = lib.ggml_backend_reg_count
    count.argtypes, count.restype = [], ctypes.c_size_t
    if count():
        return
    fn = lib.ggml_backend_load_all_from_path
    fn.argtypes, fn.restype = [ctypes.c_char_p], None
    fn(os.fsencode(bin_dir))


def install():
    if "LLAMA_CPP_LIB_PATH" in os.environ or _llama_cpp_has_its_own_lib():
        return
    lib = lib_dir()
    if lib:
        os.environ["LLAMA_CPP_LIB_PATH"] = lib
        os.environ.setdefault("MTMD_CPP_LIB", lib)
        bin_dir = os.path.join(os.path.dirname(lib), "bin")
        if os.path.isdir(bin_dir) and any(n.startswith("libggml-cpu-") for n in os.listdir(bin_dir)):
            sys.meta_path.insert(0, _LoadBackendModules(bin_dir))


try:
    install()
except Exception:  # never break Python's start-up
    pass
