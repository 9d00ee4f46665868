# ggml_ext's own sources, added to the targets llama.cpp defines.
# Arch-specific kernels live in ggml_ext/src/{generic,x86,arm} and are added to
# ggml-cpu. GGML_EXT_CUDA builds llama.cpp's ggml-cuda with ggml_ext/src/cuda in it
# (the kernels of our ops, below) and defines GGML_EXT_CUDA for ggml_ext_has_cuda.
set(GGML_EXT_DIR "${CMAKE_CURRENT_LIST_DIR}/../ggml_ext")

if (NOT DEFINED LLAMA_CPP_COMMIT)
    execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c "import sys; sys.path.insert(0, '${CMAKE_CURRENT_LIST_DIR}/../scripts'); import fetch_llama_cpp as f; print(f.COMMIT)"
        OUTPUT_VARIABLE LLAMA_CPP_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()

# The type registry (ggml_ext/include/ggml-ext-types.def as a table) and the settings (every environment
# variable, src/common/settings.c) with the other ggml-base code, which every other library links;
# the patched ggml.h includes the .def, so the include folder is PUBLIC.
target_sources(ggml-base PRIVATE "${GGML_EXT_DIR}/src/ggml-ext.c" "${GGML_EXT_DIR}/src/model-checks.c"
    "${GGML_EXT_DIR}/src/common/registry.c" "${GGML_EXT_DIR}/src/common/settings.c")
target_include_directories(ggml-base PUBLIC "${GGML_EXT_DIR}/include")
target_compile_definitions(ggml-base PRIVATE
    GGML_EXT_VERSION="${PROJECT_VERSION}"
    GGML_EXT_LLAMA_CPP_COMMIT="${LLAMA_CPP_COMMIT}"
    $<$<BOOL:${GGML_EXT_CUDA}>:GGML_EXT_CUDA>)
target_include_directories(llama PRIVATE "${GGML_EXT_DIR}/include")

# The formats' code, found by where it lives (docs/DEVELOPING.md "Adding a type"), so a new family
# is its folders' files, not a line here:
#   ggml-base: src/formats/<family>/*.c (bytes: reference quantize/dequantize, layout transforms;
#              the family's dispatch.c excepted), src/generic/*.c (scalar twin of every kernel),
#              src/backend/*_base.c (what ggml.c / ggml-quants.c / gguf.cpp call: quantize_chunk, row
#              validation, shape rule; backend/families_base.c: the ggml-base family table, common/families.h);
#   ggml-cpu:  src/formats/<family>/dispatch.c and src/formats/families.c (the kernel report's family table),
#              src/x86/*.c and src/arm/*.c (each compiles to nothing unless the target's flags enable its
#              instruction set, so the same list cross-compiles), src/backend/*_cpu.c and *.cpp (mul_mat hooks,
#              runtime repack: patches 0110-0112; backend/families_cpu.c: the ggml-cpu family table).
# The CPU backend: one ggml-cpu target, or with GGML_CPU_ALL_VARIANTS (make dist) one ggml-cpu-<variant> module
# per instruction set, each with all of our CPU sources compiled under its flags, the best loaded at run time.
if (TARGET ggml-cpu)
    set(GGML_EXT_CPU_TARGETS ggml-cpu)
else()
    set(GGML_EXT_CPU_TARGETS "")
    foreach(backend ${GGML_AVAILABLE_BACKENDS})
        if (backend MATCHES "^ggml-cpu-" AND TARGET ${backend})
            list(APPEND GGML_EXT_CPU_TARGETS ${backend})
        endif()
    endforeach()
endif()

file(GLOB GGML_EXT_FORMATS_BASE CONFIGURE_DEPENDS "${GGML_EXT_DIR}/src/formats/*/*.c")
list(FILTER GGML_EXT_FORMATS_BASE EXCLUDE REGEX "/dispatch\\.c$")
file(GLOB GGML_EXT_FORMATS_DISPATCH CONFIGURE_DEPENDS "${GGML_EXT_DIR}/src/formats/*/dispatch.c"
    "${GGML_EXT_DIR}/src/formats/families.c")
file(GLOB GGML_EXT_GENERIC CONFIGURE_DEPENDS "${GGML_EXT_DIR}/src/generic/*.c" "${GGML_EXT_DIR}/src/backend/*_base.c")
file(GLOB GGML_EXT_CPU CONFIGURE_DEPENDS "${GGML_EXT_DIR}/src/x86/*.c" "${GGML_EXT_DIR}/src/arm/*.c"
    "${GGML_EXT_DIR}/src/backend/*_cpu.c" "${GGML_EXT_DIR}/src/backend/*.cpp")
target_sources(ggml-base PRIVATE ${GGML_EXT_FORMATS_BASE} ${GGML_EXT_GENERIC})
target_include_directories(ggml-base PRIVATE "${GGML_EXT_DIR}/src")
foreach(cpu ${GGML_EXT_CPU_TARGETS})
    target_sources(${cpu} PRIVATE ${GGML_EXT_FORMATS_DISPATCH} ${GGML_EXT_CPU})
    target_include_directories(${cpu} PRIVATE "${GGML_EXT_DIR}/src")
    # a variant's feature probe (ggml-cpu/arch/*/cpu-feats.cpp) is an object library of its own, built without
    # the variant's flags and without ggml-base's include folders: the patched ggml.h includes our .def
    if (TARGET ${cpu}-feats)
        target_include_directories(${cpu}-feats PRIVATE "${GGML_EXT_DIR}/include")
    endif()
endforeach()

# ggml-ext's ops (ggml_ext/include/ggml-ext-ops.def; patch 0200 gives them GGML_OP ids and routes them here).
# Found by name, so adding an op is its .def row and its files: ops/<name>.c (constructor, node check)
# into ggml-base, ops/<name>_cpu.c (the scalar reference) into ggml-cpu, cuda/<name>.cu into ggml-cuda.
file(GLOB GGML_EXT_OPS_CPU CONFIGURE_DEPENDS "${GGML_EXT_DIR}/src/ops/*_cpu.c")
file(GLOB GGML_EXT_OPS_BASE CONFIGURE_DEPENDS "${GGML_EXT_DIR}/src/ops/*.c")
list(REMOVE_ITEM GGML_EXT_OPS_BASE ${GGML_EXT_OPS_CPU})
target_sources(ggml-base PRIVATE ${GGML_EXT_OPS_BASE})
foreach(cpu ${GGML_EXT_CPU_TARGETS})
    target_sources(${cpu} PRIVATE ${GGML_EXT_OPS_CPU})
    target_include_directories(${cpu} PRIVATE "${GGML_EXT_DIR}/src/ops")
endforeach()

# The CUDA home: ggml_ext/src/cuda/*.cu compiled into llama.cpp's ggml-cuda target (its CUDA flags and
# architectures; `ggml-cuda/common.cuh` resolves through its include path) when GGML_EXT_CUDA=ON.
if (GGML_EXT_CUDA)
    file(GLOB GGML_EXT_CUDA_SOURCES CONFIGURE_DEPENDS "${GGML_EXT_DIR}/src/cuda/*.cu")
    target_sources(ggml-cuda PRIVATE ${GGML_EXT_CUDA_SOURCES})
    target_include_directories(ggml-cuda PRIVATE "${GGML_EXT_DIR}/src/cuda" "${GGML_EXT_DIR}/src")
endif()

# What patches 0300 / 0320 call from llama.cpp's graph and KV cache: linear-layer side-cars, KV types, the
# KVQuant cache bindings (libllama).
target_include_directories(llama PRIVATE "${GGML_EXT_DIR}/src")  # common/settings.h
target_sources(llama PRIVATE "${GGML_EXT_DIR}/src/llama/hooks.c" "${GGML_EXT_DIR}/src/llama/kvquant_cache.c"
                             "${GGML_EXT_DIR}/src/llama/qdec.c" "${GGML_EXT_DIR}/src/llama/file_checks.c"
                             "${GGML_EXT_DIR}/src/llama/flags.c")
target_sources(llama PRIVATE "${GGML_EXT_DIR}/src/llama/kvquant_cache_hooks.cpp")  # KV cache hooks of patches 0322 / 0323
# QDEC's side file is a buffer of its own host buffer type (ggml-backend-impl.h, in ggml's sources)
set_source_files_properties("${GGML_EXT_DIR}/src/llama/qdec.c" TARGET_DIRECTORY llama PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON
                            INCLUDE_DIRECTORIES "${LLAMA_CPP_PATCHED}/ggml/src")

# The headers programs built against the installed ggml.h need (it includes ggml-ext-ops.def); the
# sanitizer build (tests/c/sanitizer) installs nothing.
if (DEFINED GGML_EXT_INSTALL_DIR)
    install(FILES "${GGML_EXT_DIR}/include/ggml-ext-ops.def" "${GGML_EXT_DIR}/include/ggml-ext-ops.h"
                  "${GGML_EXT_DIR}/include/ggml-ext-llama.h" "${GGML_EXT_DIR}/include/ggml-ext-qdec.h"
                  "${GGML_EXT_DIR}/include/ggml-ext-kvquant.h"
            DESTINATION ${GGML_EXT_INSTALL_DIR}/include COMPONENT ggml_ext)
endif()
