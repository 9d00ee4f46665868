// ggml-ext public C API: what the patched llama.cpp and the Python layer call.
#pragma once

#include <stdbool.h>
#include <stddef.h>
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

// ---- hooks of the patched ggml (ggml_ext/patches): interleaved Q4_0 types 31-33 and
// interleaved IQ4_NL types 36-38 ----
// Types are passed as int (enum ggml_type values) so this header does not need ggml.h.

// Rows interleaved per group (4 or 8) for type ids 31-33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8)
// and 36-38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8), 0 for any other type.
GGML_EXT_API int ggml_ext_type_row_group(int type);

// NULL when a tensor of `type` and shape `ne` (ggml order, 4 dims) is acceptable,
// otherwise a static message saying why not (row count not a multiple of the group).
GGML_EXT_API const char * ggml_ext_check_tensor_shape(int type, const int64_t * ne);

// ggml_quantize_chunk for types 31-33: float rows [start / n_per_row, + nrows) -> interleaved
// bytes at dst (row r of the tensor at dst + r * row_size, like every ggml type). The first
// row and the row count must be multiples of the type's row group; returns the bytes
// written, 0 on a shape the layout cannot hold.
GGML_EXT_API size_t ggml_ext_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                            int64_t n_per_row);

// The same for types 36-38, with ggml_quantize_chunk's importance matrix (n_per_row
// values, or NULL): plain IQ4_NL quantization of the rows, then the interleave.
GGML_EXT_API size_t ggml_ext_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start,
                                                    int64_t nrows, int64_t n_per_row, const float * imatrix);

// ggml_validate_row_data for types 31-33 and 36-38: whole interleaved blocks, finite fp16 deltas.
GGML_EXT_API bool ggml_ext_validate_row_data(int type, const void * data, size_t nbytes);

// ggml-cpu's mul_mat for types 31-33 and 36-38 (src0), F32 src1 and dst, on ggml's threadpool.
// Returns false, having done nothing, for any other src0 type.
struct ggml_compute_params;
struct ggml_tensor;
GGML_EXT_API bool ggml_ext_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// ggml-cpu's supports_op for ops that involve types 31-33 or 36-38 (as a source or as the result):
// 1 for what ggml_ext_cpu_mul_mat runs (MUL_MAT of one 2-D interleaved matrix, F32
// activations and result), 0 for anything else (get_rows, copies, mul_mat_id, ...),
// -1 when no such type is involved (ggml decides).
GGML_EXT_API int ggml_ext_cpu_supports_op(const struct ggml_tensor * op);

#ifdef __cplusplus
}
#endif
