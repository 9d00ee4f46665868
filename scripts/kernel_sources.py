"""The C files of the standalone kernel libraries (interleaved4: Q4_0 and IQ4_NL values; codebooks:
CB2 / CB3), for the
kernel tests and benchmarks that compile it outside the CMake build (natively and for aarch64).
The CMake build finds the same files by folder (cmake/ggml-ext-sources.cmake), split between
ggml-base and ggml-cpu; compile with -I of ggml_ext/include and of SRC."""
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "ggml_ext" / "src"

INTERLEAVED4 = [
    SRC / "common" / "registry.c",  # the dispatcher asks the type registry which type is which
    SRC / "formats" / "interleaved4" / "layout.c",
    SRC / "formats" / "interleaved4" / "dispatch.c",
    SRC / "generic" / "interleaved4.c",
    SRC / "x86" / "interleaved4_avx2.c",
    SRC / "x86" / "interleaved4_avx512.c",
    SRC / "arm" / "interleaved4_neon.c",
    SRC / "arm" / "interleaved4_i8mm.c",
    SRC / "arm" / "interleaved4_sve.c",
    SRC / "formats" / "families.c",  # ggml_ext_dispatched_kernel: the kernel report family table
]

CODEBOOKS = [
    SRC / "formats" / "codebooks" / "codebooks.c",
    SRC / "formats" / "codebooks" / "dispatch.c",
    SRC / "generic" / "codebooks.c",
    SRC / "x86" / "codebooks_avx2.c",
    SRC / "arm" / "codebooks_neon.c",
]


# The KVQuant KV-cache kernels (docs/formats/kvquant.md): bytes, dispatch, scalar reference, SIMD twins.
KVQUANT = [
    SRC / "formats" / "kvquant" / "kvquant.c",
    SRC / "formats" / "kvquant" / "dispatch.c",
    SRC / "generic" / "kvquant.c",
    SRC / "x86" / "kvquant_avx2.c",
    SRC / "arm" / "kvquant_neon.c",
]

# The NUQ cache types' block decode (formats/kvquant/kvquant_decode.h; tests/c/test_nuq_decode.c): the scalar
# reference, the SIMD decoders, and the kvquant row kernels it is checked against.
NUQ_DECODE = [
    SRC / "formats" / "kvquant" / "kvquant.c",
    SRC / "generic" / "kvquant_decode.c",
    SRC / "x86" / "kvquant_decode_avx2.c",
    SRC / "arm" / "kvquant_decode_neon.c",
]

# The any-precision bitplane GEMV (formats/anyprec): the byte layout and reference, the scalar twin,
# the SIMD kernels and the dispatcher (tests/c/test_anyprec_kernels.c).
ANYPREC = [
    SRC / "formats" / "anyprec" / "anyprec.c",
    SRC / "formats" / "anyprec" / "dispatch.c",
    SRC / "generic" / "anyprec.c",
    SRC / "x86" / "anyprec_avx2.c",
    SRC / "x86" / "anyprec_avx512.c",
    SRC / "arm" / "anyprec_neon.c",
]


def cpu_flags() -> set[str]:
    """The host CPU's feature flags (/proc/cpuinfo; empty where there is none): which of the kernel
    tests' builds can run natively here."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()

# formats/families.c names every family's dispatcher: each library of the weight formats holds them all.
INTERLEAVED4 = INTERLEAVED4 + CODEBOOKS + ANYPREC
CODEBOOKS = INTERLEAVED4
