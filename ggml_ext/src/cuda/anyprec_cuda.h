// CUDA kernels of the any-precision (APQ) op on the row-lane device layout (docs/formats/anyprec.md;
// ggml_ext/src/cuda/anyprec_cuda.cu), called by apq_mul_mat.cu. All pointers are device memory; every
// function returns cudaErrorInvalidValue for arguments it does not handle, otherwise the launch's error.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- device layout ("row-lane", made once when the tensor is uploaded; the file format stays) ----
// For each plane p, group g of 32 rows (the last group padded with zero codes) and super-chunk q of 128
// weights: 32 lanes x 16 bytes, lane l holding row 32 g + l's weights 128 q .. 128 q + 127 as four 32-bit
// words (word t: weights 128 q + 32 t + 0..31), each word's bits permuted so that bit 8 i + m holds
// weight 4 m + i of its 32 (i < 4, m < 8): the 4-bit/8-bit-lane bit-transpose is then shift+mask+or.
// Plane p starts at byte p * ggml_ext_anyprec_rl_plane_size(n_rows, n_per_row): precision b still reads one
// contiguous prefix (the first b planes). Needs n_per_row % 128 == 0.
size_t ggml_ext_anyprec_rl_plane_size(int64_t n_rows, int64_t n_per_row);

// GEMV / small-batch GEMM on the row-lane layout: y[t * n_rows + r] = sum_j W_b[r][j] x[t * n_per_row + j]
// for tokens t < n_tokens (1..8). One token: a persistent GEMV, x staged in shared memory (n_per_row up to
// about 50000: cudaErrorInvalidConfiguration above). 2..8 tokens: split-K over slices of the row, the
// partial sums added with atomics into y (which it zeroes first), so the order of the final additions varies
// from run to run. tables and x must be 16-byte aligned (as cudaMalloc and ggml buffers give).
cudaError_t ggml_ext_anyprec_gemv_rl_cuda(const uint8_t * rl, const uint16_t * tables, int64_t n_rows,
                                      int64_t n_per_row, int seed_bits, int bits, const float * x,
                                      int64_t n_tokens, float * y, cudaStream_t stream);

// Dequantize the row-lane layout at precision b to fp16, row-major n_rows x n_per_row (for cuBLAS above
// 8 tokens).
cudaError_t ggml_ext_anyprec_dequantize_rl_cuda(const uint8_t * rl, const uint16_t * tables, int64_t n_rows,
                                                int64_t n_per_row, int seed_bits, int bits, uint16_t * out,
                                                cudaStream_t stream);

// float32 -> fp16 (activations for the cuBLAS path)
cudaError_t ggml_ext_anyprec_f32_to_f16_cuda(const float * x, uint16_t * out, int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
