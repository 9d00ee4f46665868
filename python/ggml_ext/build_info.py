"""What this installation was built with: versions, SIMD features, the CUDA backend, our kernels, paths.

Read from the compiled libraries themselves (ctypes), so it reports the build,
not what the Python package thinks it should be.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from functools import lru_cache

from . import __version__, _locate, formats


@dataclass
class BuildInfo:
    python_package: str
    ggml_ext: str
    format_version: int
    llama_cpp_commit: str
    cuda: bool  # the build includes llama.cpp's CUDA backend with ggml_ext/src/cuda (our ops; our types stay on the CPU)
    system_info: str
    backends: dict[str, dict[str, str]] = field(default_factory=dict)
    lib_dir: str = ""
    bin_dir: str = ""
    tools: list[str] = field(default_factory=list)
    # interleaved type name -> (GEMV kernel, GEMM kernel) that ggml-cpu runs on this CPU;
    # empty when the library predates ggml_ext_dispatched_kernel
    kernels: dict[str, tuple[str, str]] = field(default_factory=dict)


# The interleaved types our kernels run: ggml type id -> name (the format registry's interleaved4 rows).
INTERLEAVED_TYPES = {t.id: t.name for t in formats.ext_types() if t.family == "interleaved4"}
# What ggml_ext_dispatched_kernel calls the portable C reference: the scalar fallback.
SCALAR = "generic"


@lru_cache(maxsize=None)
def _libllama() -> ctypes.CDLL:
    # RTLD_GLOBAL so the ggml libraries it pulls in are shared with later loads.
    return ctypes.CDLL(str(_locate.library("llama")), mode=ctypes.RTLD_GLOBAL)


def dispatched_kernels() -> dict[str, tuple[str, str]]:
    """{type name: (GEMV, GEMM)}: the kernel implementation ggml-cpu's mul_mat runs for each interleaved
    type on this CPU, as its dispatcher reports it ("generic" is the scalar C reference; else the ISA:
    "avx2", "avx512-vnni", "neon-dotprod", "neon-i8mm", "sve256-i8mm"). {} for a build without the report."""
    lib = ctypes.CDLL(str(_locate.library("ggml-cpu")), mode=ctypes.RTLD_GLOBAL)
    fn = getattr(lib, "ggml_ext_dispatched_kernel", None)
    if fn is None:
        return {}
    fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int, ctypes.c_int]
    return {name: (fn(t, 0).decode(), fn(t, 1).decode()) for t, name in INTERLEAVED_TYPES.items()}


def _ext_ids() -> str:
    """ggml-ext's type ids as ranges ("31-33 and 36-38"), from the format registry."""
    from .formats.typeinfo import restored_ids
    return restored_ids()


def _kernel_text(name: str) -> str:
    return f"{name} (scalar fallback)" if name == SCALAR else name


def _parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """'CPU : SSE3 = 1 | AVX = 1 | GGML_EXT : VERSION = 0.1.0 | ' -> {backend: {feature: value}}."""
    out: dict[str, dict[str, str]] = {}
    current = None
    for part in (p.strip() for p in text.split("|")):
        if not part:
            continue
        if " : " in part:
            current, part = (s.strip() for s in part.split(" : ", 1))
            out.setdefault(current, {})
        if current is None or "=" not in part:
            continue
        key, value = (s.strip() for s in part.split("=", 1))
        out[current][key] = value
    return out


def get() -> BuildInfo:
    lib = _libllama()
    for fn, restype in (("ggml_ext_version", ctypes.c_char_p), ("ggml_ext_llama_cpp_commit", ctypes.c_char_p),
                        ("ggml_ext_format_version", ctypes.c_int), ("ggml_ext_has_cuda", ctypes.c_bool),
                        ("llama_print_system_info", ctypes.c_char_p)):
        getattr(lib, fn).restype = restype
        getattr(lib, fn).argtypes = []
    lib.llama_backend_init.argtypes = []
    lib.llama_backend_init()
    system_info = lib.llama_print_system_info().decode()
    bin_dir = _locate.bin_dir()
    return BuildInfo(
        python_package=__version__,
        ggml_ext=lib.ggml_ext_version().decode(),
        format_version=lib.ggml_ext_format_version(),
        llama_cpp_commit=lib.ggml_ext_llama_cpp_commit().decode(),
        cuda=bool(lib.ggml_ext_has_cuda()),
        system_info=system_info,
        backends=_parse_system_info(system_info),
        lib_dir=str(_locate.lib_dir()),
        bin_dir=str(bin_dir),
        tools=sorted(p.name for p in bin_dir.iterdir()) if bin_dir.is_dir() else [],
        kernels=dispatched_kernels(),
    )


def report() -> str:
    """A human-readable build report (what `ggml-ext info --build` prints)."""
    b = get()
    lines = [
        f"ggml-ext          {b.ggml_ext} (python package {b.python_package})",
        f"format version    {b.format_version}",
        f"llama.cpp         {b.llama_cpp_commit} (pinned, patched)",
        (f"CUDA backend      yes: llama.cpp's stock ggml-cuda; types {_ext_ids()} run on the CPU (not offloaded)"
         if b.cuda else "CUDA backend      no"),
    ]
    for backend, feats in b.backends.items():
        if backend == "GGML_EXT":
            continue
        on = [k for k, v in feats.items() if v not in ("0", "")]
        lines.append(f"{backend + ' features':<18}{' '.join(on) if on else '-'}")
    # which of our kernels runs each interleaved type here (plain Q4_0 files that the x86 runtime
    # repack puts into our Q4_0_8_8 layout run the Q4_0_8_8 ones)
    if b.kernels:
        for name, (gemv, gemm) in b.kernels.items():
            lines.append(f"{name:<18}kernels: gemv {_kernel_text(gemv)}, gemm {_kernel_text(gemm)}")
    else:
        lines.append("kernels           not reported by this build (it predates ggml_ext_dispatched_kernel)")
    lines += [f"libraries         {b.lib_dir}", f"tools             {b.bin_dir}", f"                  {' '.join(b.tools)}"]
    return "\n".join(lines)
