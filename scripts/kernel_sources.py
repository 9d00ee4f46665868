"""The C files of the standalone interleaved Q4_0 / IQ4_NL kernel library, for the kernel
tests and benchmarks that compile it outside the CMake build (natively and for
aarch64). The CMake build lists the same files in cmake/ggml-ext-sources.cmake,
split between ggml-base and ggml-cpu."""
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "ggml_ext" / "src"

Q4_0_INTERLEAVED = [
    SRC / "common" / "registry.c",  # the dispatcher asks the type registry which type is which
    SRC / "q4_0_interleaved_dispatch.c",
    SRC / "generic" / "q4_0_interleaved.c",
    SRC / "x86" / "q4_0_interleaved.c",
    SRC / "x86" / "q4_0_interleaved_avx512.c",
    SRC / "arm" / "q4_0_interleaved.c",
    SRC / "arm" / "q4_0_interleaved_i8mm.c",
    SRC / "arm" / "q4_0_interleaved_sve.c",
]
