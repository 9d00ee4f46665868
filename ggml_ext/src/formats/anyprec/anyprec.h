// Any-precision bitplanes (Any-Precision LLM, Park et al. 2024; bytes in docs/formats/anyprec.md).
//
// A weight matrix of n_rows x n_per_row is quantized per output row to a parent precision P
// (default 8) whose codes nest: the top b bits of a weight's P-bit code are its b-bit code, for
// every b from the seed precision S (default 3) to P. Each precision b has its own table of 2^b
// centroids per row, so one file serves S..P bits:
//
//   seed:      Fisher-weighted 1-D k-means of each row to 2^S centroids (exact: the optimal
//              partition of the sorted row, dynamic programming with divide-and-conquer);
//   upscaling: each cluster of precision b split in two by the optimal weighted 2-means of its
//              values, giving precision b + 1 (the new bit is 1 for the upper half);
//   refinement (ours, beyond the paper): the seed and the first R splits (default
//              GGML_EXT_ANYPREC_REFINE) are then adjusted together, keeping the nesting, by coordinate
//              descent on the sum of the weighted squared errors of precisions S..S+R: the seed
//              gives up a little of its optimum so that its clusters split better (the greedy
//              split of an optimal 3-bit partition lands well above the 4-bit optimum);
//
// The codes are stored as P bitplanes, tensor-wide plane-major so that precision b reads one
// contiguous prefix of the tensor (the first b planes):
//   planes[k][r][j/8] bit (j%8) = bit (P-1-k) of the P-bit code of weight j of row r
// (plane 0 holds the most significant bit); n_per_row is a multiple of 32.
// Tables are fp16, precision-major: the 2^b centroids of row r at precision b start at
//   ggml_ext_anyprec_table_offset(n_rows, S, b) + r * 2^b.
// Clusters are ranges of the sorted row, so nonempty clusters' centroids increase with the code.
//
// Not a ggml type yet: no type id and no op (docs/formats/anyprec.md, "Next: the op and the type").
#pragma once

#include "common/blocks.h"  // ggml_ext_fp16_t
#include "ggml-ext.h"       // GGML_EXT_API

#include <stddef.h>
#include <stdint.h>

#define GGML_EXT_ANYPREC_MIN_BITS 1
#define GGML_EXT_ANYPREC_MAX_BITS 8
#define GGML_EXT_ANYPREC_QK       32   // n_per_row must be a multiple of this
#define GGML_EXT_ANYPREC_REFINE   2    // precisions above the seed refined jointly with it (0: the paper's greedy)
#define GGML_EXT_ANYPREC_REFINE_SWEEPS 8  // at most this many coordinate-descent sweeps per row
#define GGML_EXT_ANYPREC_STARTS   0    // extra starts of the refinement: the optimal partitions at S+1 .. S+T bits
#define GGML_EXT_ANYPREC_GAIN     1.0  // precision S+i weighs GAIN^i in the refinement's joint objective

#ifdef __cplusplus
extern "C" {
#endif

// Seed + incremental upscaling of rows x (n_rows x n_per_row float32) with per-weight
// sensitivities w (same shape, non-negative; NULL: all 1). Writes the P-bit code of every
// weight (codes: n_rows x n_per_row bytes, code < 2^P) and every precision's centroids in
// float32 (tables: n_rows x (2^(P+1) - 2^S) floats, per row precision-major: precision b at
// row offset 2^b - 2^S). A cluster whose weights sum to 0 gets the plain mean of its values;
// an empty cluster repeats its parent's centroid. Returns 0, or -1 for bad arguments
// (1 <= seed <= parent <= 8, n_per_row >= 1). Single-threaded: callers split rows.
GGML_EXT_API int ggml_ext_anyprec_quantize(const float * x, const float * w, int64_t n_rows, int64_t n_per_row,
                                           int seed_bits, int parent_bits, uint8_t * codes, float * tables);
// The same with the refinement's depth chosen: refine = 0 is the paper's seed + greedy upscaling;
// refine = R > 0 refines precisions S..min(S+R, P) jointly (ggml_ext_anyprec_quantize: GGML_EXT_ANYPREC_REFINE).
GGML_EXT_API int ggml_ext_anyprec_quantize_refined(const float * x, const float * w, int64_t n_rows, int64_t n_per_row,
                                                   int seed_bits, int parent_bits, int refine, uint8_t * codes,
                                                   float * tables);

// The same with every knob of the refinement: refine R as above; starts T > 0 also runs the refinement from
// the optimal partition at S+1 .. S+min(T, R) bits (its coarser precisions by the nesting, the finer ones
// by greedy splits) and keeps the start with the lowest joint objective; gain g > 0 weighs precision S+i by
// g^i in that objective (1: the plain sum). ggml_ext_anyprec_quantize_refined: GGML_EXT_ANYPREC_STARTS / _GAIN.
GGML_EXT_API int ggml_ext_anyprec_quantize_ex(const float * x, const float * w, int64_t n_rows, int64_t n_per_row,
                                              int seed_bits, int parent_bits, int refine, int starts, double gain,
                                              uint8_t * codes, float * tables);

// Floats per row of ggml_ext_anyprec_quantize's tables: 2^(P+1) - 2^S.
GGML_EXT_API int64_t ggml_ext_anyprec_row_table_len(int seed_bits, int parent_bits);

// Weighted squared error sum_j w_j (x_j - table_b[code_j >> (P - b)])^2 of one row at precision b
// (tables as ggml_ext_anyprec_quantize writes them, w NULL: all 1), in double.
GGML_EXT_API double ggml_ext_anyprec_row_sse(const float * x, const float * w, int64_t n_per_row, const uint8_t * codes,
                                             const float * tables, int seed_bits, int parent_bits, int bits);

// The file's bytes: bitplanes (n_per_row % 32 == 0) and fp16 tables.
// Bytes of all P planes of a tensor: P * n_rows * n_per_row / 8; the first b planes are the first
// b * n_rows * n_per_row / 8 bytes.
GGML_EXT_API size_t ggml_ext_anyprec_planes_size(int parent_bits, int64_t n_rows, int64_t n_per_row);
// codes (rows r0 .. r0+nr-1 of the tensor, nr x n_per_row) -> their bits in planes (the whole
// tensor's buffer: several callers may fill disjoint row ranges).
GGML_EXT_API int ggml_ext_anyprec_pack(const uint8_t * codes, int64_t r0, int64_t nr, int64_t n_rows, int64_t n_per_row,
                                       int parent_bits, uint8_t * planes);
// Fp16 entries before precision b's tables: n_rows * (2^b - 2^S).
GGML_EXT_API int64_t ggml_ext_anyprec_table_offset(int64_t n_rows, int seed_bits, int bits);
// float tables of rows r0 .. r0+nr-1 (ggml_ext_anyprec_quantize's order) -> the tensor's fp16 tables.
GGML_EXT_API int ggml_ext_anyprec_pack_tables(const float * tables, int64_t r0, int64_t nr, int64_t n_rows,
                                              int seed_bits, int parent_bits, ggml_ext_fp16_t * out);

// Rows r0 .. r0+nr-1 at precision b (seed <= b <= parent) from the file's bytes: planes (at least
// the first b planes) and fp16 tables -> float32 (nr x n_per_row).
GGML_EXT_API int ggml_ext_anyprec_dequantize(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                             int64_t n_rows, int64_t n_per_row, int seed_bits, int parent_bits, int bits,
                                             float * y);

// The reference GEMV (scalar, in ggml-base): y[r] = sum_j table_b[r][code_b(r, j)] * x[j] for rows
// r0 .. r0+nr-1 (y holds nr values), reading only the first b planes and precision b's tables.
// Sums in float, 8 lanes (weight j in lane j % 8), added at the end: the SIMD kernels' order up to
// fused multiply-adds, so they agree to rounding.
GGML_EXT_API int ggml_ext_anyprec_gemv_ref(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                           int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x,
                                           float * y);

#ifdef __cplusplus
}
#endif
