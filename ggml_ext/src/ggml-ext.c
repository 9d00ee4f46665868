// Build identity of ggml-ext: version, format version, compiled-in parts.
#include "ggml-ext.h"

#include <stdio.h>

#ifndef GGML_EXT_VERSION
#    error "GGML_EXT_VERSION must be defined by the build"
#endif
#ifndef GGML_EXT_LLAMA_CPP_COMMIT
#    define GGML_EXT_LLAMA_CPP_COMMIT "unknown"
#endif

#define GGML_EXT_FORMAT_VERSION 1

#if defined(__aarch64__)
#    define GGML_EXT_ARCH "arm"
#elif defined(__x86_64__) || defined(_M_X64)
#    define GGML_EXT_ARCH "x86"
#else
#    define GGML_EXT_ARCH "generic"
#endif

const char * ggml_ext_version(void) { return GGML_EXT_VERSION; }

int ggml_ext_format_version(void) { return GGML_EXT_FORMAT_VERSION; }

const char * ggml_ext_llama_cpp_commit(void) { return GGML_EXT_LLAMA_CPP_COMMIT; }

// GGML_EXT_CUDA is defined when the build includes llama.cpp's stock ggml-cuda (ggml-ext.h).
bool ggml_ext_has_cuda(void) {
#ifdef GGML_EXT_CUDA
    return true;
#else
    return false;
#endif
}

const char * ggml_ext_system_info(void) {
    static char buf[256];
    if (!buf[0]) {
        snprintf(buf, sizeof(buf), "GGML_EXT : VERSION = %s | FORMAT = %d | ARCH = %s | CUDA_BACKEND = %d | LLAMA_CPP = %s | ",
                 ggml_ext_version(), ggml_ext_format_version(), GGML_EXT_ARCH, ggml_ext_has_cuda() ? 1 : 0,
                 ggml_ext_llama_cpp_commit());
    }
    return buf;
}
