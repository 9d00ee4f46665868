# ggml_ext's own sources, added to the targets llama.cpp defines.
# Arch-specific kernels live in ggml_ext/src/{generic,x86,arm,cuda} and are
# added to ggml-cpu / ggml-cuda as they arrive.
set(GGML_EXT_DIR "${CMAKE_CURRENT_LIST_DIR}/../ggml_ext")

if (NOT DEFINED LLAMA_CPP_COMMIT)
    execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c "import sys; sys.path.insert(0, '${CMAKE_CURRENT_LIST_DIR}/../scripts'); import fetch_llama_cpp as f; print(f.COMMIT)"
        OUTPUT_VARIABLE LLAMA_CPP_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()

target_sources(ggml-base PRIVATE "${GGML_EXT_DIR}/src/ggml-ext.c" "${GGML_EXT_DIR}/src/model-checks.c")
target_include_directories(ggml-base PUBLIC "${GGML_EXT_DIR}/include")
target_compile_definitions(ggml-base PRIVATE
    GGML_EXT_VERSION="${PROJECT_VERSION}"
    GGML_EXT_LLAMA_CPP_COMMIT="${LLAMA_CPP_COMMIT}"
    $<$<BOOL:${GGML_EXT_CUDA}>:GGML_EXT_CUDA>)
target_include_directories(llama PRIVATE "${GGML_EXT_DIR}/include")
