# ggml_ext's own sources, added to the targets llama.cpp defines.
# Arch-specific kernels live in ggml_ext/src/{generic,x86,arm} and are added to
# ggml-cpu. There is no CUDA code of ours: GGML_EXT_CUDA only builds llama.cpp's
# stock ggml-cuda (and defines GGML_EXT_CUDA for ggml_ext_has_cuda).
set(GGML_EXT_DIR "${CMAKE_CURRENT_LIST_DIR}/../ggml_ext")

if (NOT DEFINED LLAMA_CPP_COMMIT)
    execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c "import sys; sys.path.insert(0, '${CMAKE_CURRENT_LIST_DIR}/../scripts'); import fetch_llama_cpp as f; print(f.COMMIT)"
        OUTPUT_VARIABLE LLAMA_CPP_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()

# The type registry (ggml_ext/include/ggml-ext-types.def as a table) with the other ggml-base code;
# the patched ggml.h includes the .def, so the include folder is PUBLIC.
target_sources(ggml-base PRIVATE "${GGML_EXT_DIR}/src/ggml-ext.c" "${GGML_EXT_DIR}/src/model-checks.c"
    "${GGML_EXT_DIR}/src/common/registry.c")
target_include_directories(ggml-base PUBLIC "${GGML_EXT_DIR}/include")
target_compile_definitions(ggml-base PRIVATE
    GGML_EXT_VERSION="${PROJECT_VERSION}"
    GGML_EXT_LLAMA_CPP_COMMIT="${LLAMA_CPP_COMMIT}"
    $<$<BOOL:${GGML_EXT_CUDA}>:GGML_EXT_CUDA>)
target_include_directories(llama PRIVATE "${GGML_EXT_DIR}/include")

# The interleaved4 family (interleaved Q4_0 and IQ4_NL). ggml-base: the scalar reference, transforms and what
# ggml.c / ggml-quants.c / gguf.cpp call (quantize_chunk, row validation, shape rule).
# ggml-cpu: the dispatcher, every arch file (each compiles to nothing unless the target's
# flags enable its instruction set, so the same list cross-compiles) and the mul_mat hook.
target_sources(ggml-base PRIVATE
    "${GGML_EXT_DIR}/src/generic/q4_0_interleaved.c"
    "${GGML_EXT_DIR}/src/ggml/q4_0_interleaved_base.c")
target_sources(ggml-cpu PRIVATE
    "${GGML_EXT_DIR}/src/q4_0_interleaved_dispatch.c"
    "${GGML_EXT_DIR}/src/x86/q4_0_interleaved.c"
    "${GGML_EXT_DIR}/src/x86/q4_0_interleaved_avx512.c"
    "${GGML_EXT_DIR}/src/arm/q4_0_interleaved.c"
    "${GGML_EXT_DIR}/src/arm/q4_0_interleaved_i8mm.c"
    "${GGML_EXT_DIR}/src/arm/q4_0_interleaved_sve.c"
    "${GGML_EXT_DIR}/src/ggml/q4_0_interleaved_cpu.c"
    "${GGML_EXT_DIR}/src/ggml/q4_0_runtime_repack.cpp")  # plain Q4_0 -> our layout in CPU_REPACK (patch 0112)
target_include_directories(ggml-cpu PRIVATE "${GGML_EXT_DIR}/src")

# IQ4_NL quantizer (plain type 20): called from Python (ggml_ext.quants) and the converter;
# ggml's own quantize_iq4_nl stays what llama-quantize uses.
target_sources(ggml-base PRIVATE "${GGML_EXT_DIR}/src/iq4_nl_quant.c")
target_include_directories(ggml-base PRIVATE "${GGML_EXT_DIR}/src")
