"""The C files of the standalone interleaved4 kernel library (Q4_0 and IQ4_NL values), for the
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
]

# The any-precision bitplane GEMV (formats/anyprec): the byte layout and reference, the scalar twin,
# the SIMD kernels and the dispatcher (tests/c/test_anyprec_kernels.c).
ANYPREC = [
    SRC / "formats" / "anyprec" / "anyprec.c",
    SRC / "formats" / "anyprec" / "dispatch.c",
    SRC / "generic" / "anyprec.c",
    SRC / "x86" / "anyprec_avx2.c",
    SRC / "arm" / "anyprec_neon.c",
]
