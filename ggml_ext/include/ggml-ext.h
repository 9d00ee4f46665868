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
// "GGML_EXT : VERSION = 0.1.0 | FORMAT = 1 | ARCH = x86 | CUDA_BACKEND = 0 | LLAMA_CPP = 0c1e57098 | "
GGML_EXT_API const char * ggml_ext_system_info(void);

// Whether this build includes llama.cpp's CUDA backend (configured with GGML_EXT_CUDA=ON), and with
// it the CUDA kernels of ggml-ext's ops (ggml_ext/src/cuda). ggml-ext's types have no CUDA kernels:
// the interleaved types 31-33 and 36-38 run on the CPU in every build (ggml-cuda does not support
// them, so the model loader keeps those weights in host memory).
GGML_EXT_API bool ggml_ext_has_cuda(void);

// Model checks for the loader: NULL when the values are usable, else a message
// naming the bad GGUF key (valid until the next call on the same thread).
GGML_EXT_API const char * ggml_ext_check_block_count(uint32_t n_layer, uint32_t max_layers);
GGML_EXT_API const char * ggml_ext_check_hparams(uint32_t n_ctx_train, float f_norm_eps, float f_norm_rms_eps,
                                                  float rope_freq_base, float rope_freq_scale);

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

// Which kernel implementation ggml-cpu's mul_mat runs on this CPU for type 31-33 or 36-38:
// its GEMV (gemm = 0: activation rows left over after groups of four) or its GEMM (gemm != 0:
// groups of four rows). "generic" is the portable scalar C reference (the scalar fallback
// where this build for this CPU has no SIMD kernel for the entry); otherwise "neon-dotprod",
// "neon-i8mm", "sve256-i8mm", "avx2" or "avx512-vnni". NULL for any other type.
GGML_EXT_API const char * ggml_ext_dispatched_kernel(int type, int gemm);

// ---- IQ4_NL quantizer (plain IQ4_NL, ggml type 20; ggml_ext/src/iq4_nl_quant.c) ----

// How each weight counts in the squared error the per-block scale search minimises:
// w_i = imatrix[col] (1 without one) times f(x_i), sigma2 = mean x^2 of the 32-weight block.
enum ggml_ext_iq4_nl_weighting {
    GGML_EXT_IQ4_NL_W_DEFAULT   = 0,  // the measured best: see docs/BENCHMARKS.md (IQ4_NL quality)
    GGML_EXT_IQ4_NL_W_ONE       = 1,  // f = 1 (plain squared error)
    GGML_EXT_IQ4_NL_W_X2        = 2,  // f = x^2
    GGML_EXT_IQ4_NL_W_SQRT_S2X2 = 3,  // f = sqrt(sigma2 + x^2)
    GGML_EXT_IQ4_NL_W_S2X2      = 4,  // f = sigma2 + x^2
};

// Float rows (nrows x n_per_row, n_per_row a multiple of 32) -> block_iq4_nl bytes (fp16 d +
// 16 bytes of nibbles per 32 weights, ggml's layout), row r at dst + r * (n_per_row / 32 * 18).
// imatrix: n_per_row importances (llama-imatrix's mean squared activations) or NULL.
// Per block the scale is the exact minimiser of the weighted squared error over all scales
// (then the best of the nearest fp16 values), d is clamped to fp16's range so it stays finite.
// Returns the bytes written; 0 when n_per_row is not a multiple of 32, or when src (or
// imatrix) holds a NaN or infinity, or imatrix a negative value.
GGML_EXT_API size_t ggml_ext_quantize_iq4_nl(const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                             const float * imatrix);

// The same with an explicit weighting (enum ggml_ext_iq4_nl_weighting); 0 for an unknown one.
GGML_EXT_API size_t ggml_ext_quantize_iq4_nl_weighted(const float * src, void * dst, int64_t nrows,
                                                      int64_t n_per_row, const float * imatrix, int weighting);

#ifdef __cplusplus
}
#endif
