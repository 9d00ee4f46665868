// ggml-ext's ggml ops: graph constructors, and what the patched CPU backend calls (patch 0200).
// The ops themselves are listed in ggml-ext-ops.def; each has a real id, GGML_OP_<NAME>.
#pragma once

#include "ggml-ext.h"
#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- graph constructors (ggml-base) ----

// GGML_OP_COL_SIDECAR: dst = y + S . x[idx], the column side-car in its plainest form: the input
// columns idx of every row of x, times a small dense matrix, added to y (typically y = W.x of a
// weight whose columns idx were taken out or are kept at higher precision).
//   y   F32 [M, n1, n2, n3]   x F32 [K, n1, n2, n3]   (the same rows)
//   idx I32 [k], each in [0, K)   s F32 [k, M]: row m holds output m's k coefficients
// dst has y's shape: dst[m, r] = y[m, r] + sum_j s[j, m] * x[idx[j], r], summed in order j = 0..k-1.
// Rows of y, x and s must be contiguous (nb[0] is the element size); idx contiguous.
GGML_EXT_API struct ggml_tensor * ggml_ext_col_sidecar(struct ggml_context * ctx, struct ggml_tensor * y,
                                                       struct ggml_tensor * x, struct ggml_tensor * idx,
                                                       struct ggml_tensor * s);

// NULL when the sources of a GGML_OP_COL_SIDECAR node are usable (types, shapes, strides), else a
// static message saying why not. Backends check it before running a node they received (RPC).
GGML_EXT_API const char * ggml_ext_col_sidecar_check(const struct ggml_tensor * dst);

// GGML_OP_APQ_MUL_MAT: dst = W_b . x for an any-precision weight (docs/formats/anyprec.md).
//   w      APQ [K, N]: the bitplanes of the parent precision P (8 for the APQ type), plane-major
//   x      F32 [K, n1, n2, n3], rows contiguous
//   tables F16 [N (2^(P+1) - 2^S)] (1-D): every precision's per-row centroids, precision-major
//   bits   the precision b to compute at, S <= b <= P (S follows from the tables' length)
// dst F32 [N, n1, n2, n3]: dst[r, t] = sum_j T_b[r][code_b(r, j)] x[j, t], reading the first b planes and
// precision b's tables only. Aborts on a bad node (check with ggml_ext_apq_mul_mat_check first).
GGML_EXT_API struct ggml_tensor * ggml_ext_apq_mul_mat(struct ggml_context * ctx, struct ggml_tensor * w,
                                                       struct ggml_tensor * x, struct ggml_tensor * tables, int bits);

// The seed precision S an APQ weight's tables imply (their length is N (2^(P+1) - 2^S)), or -1 when w is
// not an APQ tensor, tables is not F16 1-D, or its length fits no S in 1..P.
GGML_EXT_API int ggml_ext_anyprec_seed_bits(const struct ggml_tensor * w, const struct ggml_tensor * tables);
// The parent precision P of an APQ type (its planes), 0 for any other type.
GGML_EXT_API int ggml_ext_anyprec_parent_bits(int type);

// NULL when a GGML_OP_APQ_MUL_MAT node is usable (types, shapes, op params), else a static message.
GGML_EXT_API const char * ggml_ext_apq_mul_mat_check(const struct ggml_tensor * dst);

// GGML_OP_DEC_MUL_MAT: dynamic error compensation (QDEC; docs/QDEC.md). For every row r of x, pick
// channels of x per 1024-channel chunk (the last chunk may be shorter): k = min(k_chunk, chunk length) of
// the largest |x|, then add the 4-bit residual of those input channels:
//   dst[m, r] = y[m, r] + scales[m] * sum_{j in sel(x_r)} q[j][m] * x[j, r]      (j ascending)
//   y      F32 [M, n1, n2, n3]        x F32 [K, n1, n2, n3] (the same rows; rows contiguous)
//   r      I8  [(M+1)/2, K]: input channel j's row holds q[j][m] + 8 in 4 bits, output m in byte m/2
//          (low nibble for even m, high for odd); q in -7..7
//   scales F32 [M]: one per output channel
//   mode   GGML_EXT_QDEC_APPROX: the paper's bucketed selection, 32 buckets of |x| from b0 and b15
//          (ggml_ext_qdec_bucket), filled from the top bucket, the last bucket's channels taken in index
//          order; GGML_EXT_QDEC_EXACT: the k largest |x| (ties: the lower index), for evaluation
// k_chunk 0: dst = y.
enum ggml_ext_qdec_mode { GGML_EXT_QDEC_APPROX = 0, GGML_EXT_QDEC_EXACT = 1 };
#define GGML_EXT_QDEC_CHUNK 1024
GGML_EXT_API struct ggml_tensor * ggml_ext_dec_mul_mat(struct ggml_context * ctx, struct ggml_tensor * y,
                                                       struct ggml_tensor * x, struct ggml_tensor * r,
                                                       struct ggml_tensor * scales, int k_chunk,
                                                       enum ggml_ext_qdec_mode mode, float b0, float b15);

// The bucket of a magnitude v (0 the top, 31 the bottom): 16 uniform buckets over [b15, b0] (values
// above b0 in bucket 0) and 16 over [0, b15); NaN and 0 in bucket 31. b15 > 0, b0 >= b15.
GGML_EXT_API int ggml_ext_qdec_bucket(float v, float b0, float b15);

// The channels of one row x[0..K) the op compensates, ascending, into sel (room for K); returns their count.
GGML_EXT_API int64_t ggml_ext_qdec_select(const float * x, int64_t K, int k_chunk, enum ggml_ext_qdec_mode mode,
                                          float b0, float b15, int32_t * sel);

// The thread blocks of the CUDA kernel's residual GEMV (the paper's n_tb; op param 4): 0 (the default)
// lets the backend choose (one per SM). The CPU ignores it. n_tb >= 0.
GGML_EXT_API void ggml_ext_dec_mul_mat_set_n_tb(struct ggml_tensor * dst, int n_tb);
GGML_EXT_API int  ggml_ext_dec_mul_mat_n_tb(const struct ggml_tensor * dst);

// NULL when a GGML_OP_DEC_MUL_MAT node is usable (types, shapes, op params), else a static message.
GGML_EXT_API const char * ggml_ext_dec_mul_mat_check(const struct ggml_tensor * dst);

// ---- the CPU backend (ggml-cpu): what patch 0200 calls for ops past upstream's ----
struct ggml_compute_params;

// Runs ggml-ext's op `dst` on ggml's threadpool (every thread calls it). false: not one of its ops.
GGML_EXT_API bool ggml_ext_cpu_forward(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// Threads the op takes out of n_threads; 0 when it is not one of ggml-ext's ops.
GGML_EXT_API int ggml_ext_cpu_n_tasks(const struct ggml_tensor * op, int n_threads);

// Bytes of ggml's shared work buffer the op needs with n_tasks threads; 0 for any other op.
GGML_EXT_API size_t ggml_ext_cpu_work_size(const struct ggml_tensor * op, int n_tasks);

// supports_op: 1 when the CPU backend runs this node of one of ggml-ext's ops, 0 when it cannot,
// -1 when the op is not ggml-ext's (ggml decides). (ggml_ext_cpu_supports_op in ggml-ext.h answers
// for ggml-ext's types under stock ops.)
GGML_EXT_API int ggml_ext_cpu_supports_ext_op(const struct ggml_tensor * op);

// Whether GGML_OP id `op` is one of ggml-ext's.
GGML_EXT_API bool ggml_ext_is_ext_op(int op);

#ifdef __cplusplus
}
#endif
