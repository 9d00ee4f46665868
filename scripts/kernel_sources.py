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

# The KVQuant KV-cache kernels (docs/formats/kvquant.md): bytes, dispatch, scalar reference, SIMD twins.
KVQUANT = [
    SRC / "formats" / "kvquant" / "kvquant.c",
    SRC / "formats" / "kvquant" / "dispatch.c",
    SRC / "generic" / "kvquant.c",
    SRC / "x86" / "kvquant_avx2.c",
    SRC / "arm" / "kvquant_neon.c",
]
