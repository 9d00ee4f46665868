// ggml-ext public C API: what the patched llama.cpp and the Python layer call.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#if defined(_WIN32)
#    define GGML_EXT_API __declspec(dllexport)
#else
#    define GGML_EXT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Version of the ggml-ext sources compiled into this build ("0.1.0").
GGML_EXT_API const char * ggml_ext_version(void);

// Version of the GGUF conventions ggml-ext writes (key ggml_ext.format_version).
GGML_EXT_API int ggml_ext_format_version(void);

// Pinned llama.cpp commit these sources were patched into.
GGML_EXT_API const char * ggml_ext_llama_cpp_commit(void);

// One line for llama_print_system_info():
// "GGML_EXT : VERSION = 0.1.0 | FORMAT = 1 | ARCH = x86 | CUDA = 0 | "
GGML_EXT_API const char * ggml_ext_system_info(void);

// Whether ggml-ext's CUDA kernels were compiled in.
GGML_EXT_API bool ggml_ext_has_cuda(void);

// Model checks for the loader: NULL when the values are usable, else a message
// naming the bad GGUF key (valid until the next call on the same thread).
GGML_EXT_API const char * ggml_ext_check_block_count(uint32_t n_layer, uint32_t max_layers);
GGML_EXT_API const char * ggml_ext_check_hparams(uint32_t n_ctx_train, float f_norm_eps, float f_norm_rms_eps);

#ifdef __cplusplus
}
#endif
