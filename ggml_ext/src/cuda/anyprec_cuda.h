// CUDA kernels of the any-precision bitplanes (docs/formats/anyprec.md; ggml_ext/src/cuda/anyprec_cuda.cu).
// Plain launchers (not a ggml op yet). All pointers are device memory; every function returns
// cudaErrorInvalidValue for arguments it does not handle, otherwise the launch's error.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// v0: GEMV on the file's bytes as they are (planes plane-major, n_per_row % 32 == 0, at most ~50000).
cudaError_t ggml_ext_anyprec_gemv_cuda(const uint8_t * planes, const uint16_t * tables, int64_t n_rows,
                                       int64_t n_per_row, int seed_bits, int bits, const float * x, float * y,
                                       cudaStream_t stream);

// ---- device layout ("row-lane", made once when the tensor is uploaded; the file format stays) ----
// For each plane p, group g of 32 rows (the last group padded with zero codes) and super-chunk q of 128
// weights: 32 lanes x 16 bytes, lane l holding row 32 g + l's weights 128 q .. 128 q + 127 as four 32-bit
// words (word t: weights 128 q + 32 t + 0..31), each word's bits permuted so that bit 8 i + m holds
// weight 4 m + i of its 32 (i < 4, m < 8): the 4-bit/8-bit-lane bit-transpose is then shift+mask+or.
// Plane p starts at byte p * ggml_ext_anyprec_rl_plane_size(n_rows, n_per_row): precision b still reads one
// contiguous prefix (the first b planes). Needs n_per_row % 128 == 0.
size_t      ggml_ext_anyprec_rl_plane_size(int64_t n_rows, int64_t n_per_row);
// planes (the file's bytes, all parent_bits planes) -> out (parent_bits * ggml_ext_anyprec_rl_plane_size bytes)
cudaError_t ggml_ext_anyprec_relayout_cuda(const uint8_t * planes, int64_t n_rows, int64_t n_per_row, int parent_bits,
                                           uint8_t * out, cudaStream_t stream);

// GEMV / small-batch GEMM on the row-lane layout: y[t * n_rows + r] = sum_j W_b[r][j] x[t * n_per_row + j]
// for tokens t < n_tokens (1..8). variant (see anyprec_cuda.cu): 1 singles (8 warps per 32 rows), 2 pair
// tables for b <= 4 (singles above), 3 = 2 with 16 warps, 4 = 2 with x staged in shared memory, 5 and 6 = 2
// with clusters of 2 and 4 blocks per 32 rows (sm_90), 7 = 4 split-K over several blocks per 32 rows (atomic
// adds into y, which it zeroes first), 8 = split-K over contiguous slices, each block staging its slice of
// x for all tokens in shared memory (atomics), 9 / 10 = 4 with both first super-chunks' loads in flight
// during the block's prologue and 4-bit-lane codes at b >= 5 (8 / 16 warps per block), 11 / 12 = 9 / 10
// without pair tables, 13 / 14 = persistent blocks, tables in registers (b <= 3, byte-permute lookups) or
// double-buffered in shared memory, plane loads running ahead across row groups (14: more warps per SM), 15 =
// 13 with half the 3-bit lookups through shared pair tables. n_tokens == 1 only for 1, 3..7 and 9..15. 0: the default (14 for one
// token, 8 for 2..8). With 7 and 8 (so the default at 2..8 tokens) the order of the final additions
// varies from run to run.
// tables and x must be 16-byte aligned (as cudaMalloc and ggml buffers give).
cudaError_t ggml_ext_anyprec_gemv_rl_cuda(const uint8_t * rl, const uint16_t * tables, int64_t n_rows,
                                          int64_t n_per_row, int seed_bits, int bits, int variant, const float * x,
                                          int64_t n_tokens, float * y, cudaStream_t stream);

// One token, count (1..4) matrices sharing x and n_per_row (q/k/v, gate/up) in ONE launch of v13: y[m][r] =
// sum_j W_m,b[r][j] x[j]; rl, tables, n_rows and y are host arrays of count entries (device pointers).
cudaError_t ggml_ext_anyprec_gemv_rl_multi_cuda(int count, const uint8_t * const * rl, const uint16_t * const * tables,
                                                const int64_t * n_rows, int64_t n_per_row, int seed_bits, int bits,
                                                const float * x, float * const * y, cudaStream_t stream);

// v16 (one token, bits <= 3 for now): the "tile layout" (same size as the row-lane layout; see
// apq_gemv_tc16_kernel in anyprec_cuda.cu) made once by ggml_ext_anyprec_relayout_tc_cuda, and its GEMV on the tensor
// cores (fp16 centroid pairs x (x_hi + x_lo), fp32 accumulation). bits >= 4: cudaErrorInvalidValue.
cudaError_t ggml_ext_anyprec_relayout_tc_cuda(const uint8_t * planes, int64_t n_rows, int64_t n_per_row, int parent_bits,
                                              uint8_t * out, cudaStream_t stream);
cudaError_t ggml_ext_anyprec_gemv_tc_cuda(const uint8_t * tc, const uint16_t * tables, int64_t n_rows, int64_t n_per_row,
                                          int seed_bits, int bits, const float * x, float * y, cudaStream_t stream);

// Dequantize the row-lane layout at precision b to fp16, row-major n_rows x n_per_row (for cuBLAS above
// ~8 tokens).
cudaError_t ggml_ext_anyprec_dequantize_rl_cuda(const uint8_t * rl, const uint16_t * tables, int64_t n_rows,
                                                int64_t n_per_row, int seed_bits, int bits, uint16_t * out,
                                                cudaStream_t stream);

// float32 -> fp16 (activations for the cuBLAS path)
cudaError_t ggml_ext_anyprec_f32_to_f16_cuda(const float * x, uint16_t * out, int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
