// GGML_OP_DEC_MUL_MAT, ggml-base side: the graph constructor, the node check, and the channel selection
// (QDEC's chunked, bucketed approximate top-k of |x| and the exact top-k), shared by every backend's
// reference and by the tests. docs/QDEC.md has the design.
//
// Why a new op and not COL_SIDECAR with a dynamic index: the side-car's S is F32, output-major [k, M]
// and its idx is one list for every row; DEC's residual is 4-bit, input-channel-major (the fetch of one
// channel is one contiguous row of M/2 bytes: what a zero-copy read of host memory needs), covers every
// input channel, and its channels are chosen per row from x inside the op (the CUDA kernel fuses the
// selection with the fetch). Expressing that through COL_SIDECAR would need a selection op, a gather of
// residual rows and a dequantization in the graph: three nodes and two buffers per linear per token.
#include "ggml-ext-ops.h"

#include <math.h>
#include <string.h>

int ggml_ext_qdec_bucket(float v, float b0, float b15) {
    if (!(v > 0.0f)) {
        return 31;  // 0, negative zero and NaN
    }
    if (v >= b15) {
        if (!(b0 > b15)) {
            return 0;
        }
        const float t = (v - b15) / (b0 - b15) * 16.0f;
        const int   i = t >= 15.0f ? 15 : (int) t;
        return 15 - i;
    }
    const float t = v / b15 * 16.0f;
    const int   i = t >= 15.0f ? 15 : (int) t;
    return 31 - i;
}

// |v| with NaN as 0: a NaN activation is never picked before a number
static float mag(float v) {
    return v == v ? fabsf(v) : 0.0f;
}

// exact: the k largest |x| of x[0..L) (ties: the lower index); sel gets them in index order.
static int64_t exact_chunk(const float * x, int64_t L, int64_t k, int64_t base, int32_t * sel) {
    // insertion into a list of k channels, descending |x|: O(L k), a reference, not a kernel
    int64_t n = 0;
    for (int64_t j = 0; j < L; j++) {
        const float v = mag(x[j]);
        if (n == k && !(v > mag(x[sel[n - 1] - base]))) {
            continue;
        }
        int64_t p = n < k ? n++ : k - 1;
        for (; p > 0 && v > mag(x[sel[p - 1] - base]); p--) {
            sel[p] = sel[p - 1];
        }
        sel[p] = (int32_t) (base + j);
    }
    // back to index order (insertion sort: k is small)
    for (int64_t a = 1; a < n; a++) {
        const int32_t t = sel[a];
        int64_t       b = a;
        for (; b > 0 && sel[b - 1] > t; b--) {
            sel[b] = sel[b - 1];
        }
        sel[b] = t;
    }
    return n;
}

// approximate: count |x| into 32 buckets, take whole buckets from the top while they fit, then the
// first channels (index order) of the bucket that overflows.
static int64_t approx_chunk(const float * x, int64_t L, int64_t k, int64_t base, float b0, float b15, int32_t * sel) {
    int64_t count[32] = { 0 };
    for (int64_t j = 0; j < L; j++) {
        count[ggml_ext_qdec_bucket(fabsf(x[j]), b0, b15)]++;
    }
    int     last = 0;
    int64_t before = 0;  // channels in buckets above `last`
    while (last < 31 && before + count[last] < k) {
        before += count[last++];
    }
    int64_t take = k - before, n = 0;  // from bucket `last`
    for (int64_t j = 0; j < L; j++) {
        const int b = ggml_ext_qdec_bucket(fabsf(x[j]), b0, b15);
        if (b < last || (b == last && take-- > 0)) {
            sel[n++] = (int32_t) (base + j);
        }
    }
    return n;
}

int64_t ggml_ext_qdec_select(const float * x, int64_t K, int k_chunk, enum ggml_ext_qdec_mode mode, float b0, float b15,
                             int32_t * sel) {
    int64_t n = 0;
    if (k_chunk <= 0) {
        return 0;
    }
    for (int64_t c = 0; c < K; c += GGML_EXT_QDEC_CHUNK) {
        const int64_t L = K - c < GGML_EXT_QDEC_CHUNK ? K - c : GGML_EXT_QDEC_CHUNK;
        const int64_t k = k_chunk < L ? k_chunk : L;
        n += mode == GGML_EXT_QDEC_EXACT ? exact_chunk(x + c, L, k, c, sel + n)
                                        : approx_chunk(x + c, L, k, c, b0, b15, sel + n);
    }
    return n;
}

const char * ggml_ext_dec_mul_mat_check(const struct ggml_tensor * dst) {
    const struct ggml_tensor * y = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const struct ggml_tensor * r = dst->src[2];
    const struct ggml_tensor * s = dst->src[3];
    if (!y || !x || !r || !s) {
        return "dec_mul_mat: needs y, x, r and scales";
    }
    if (dst->type != GGML_TYPE_F32 || y->type != GGML_TYPE_F32 || x->type != GGML_TYPE_F32 ||
        s->type != GGML_TYPE_F32 || r->type != GGML_TYPE_I8) {
        return "dec_mul_mat: y, x, scales and the result are F32, r is I8";
    }
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (dst->ne[i] != y->ne[i]) {
            return "dec_mul_mat: the result has y's shape";
        }
        if (i > 0 && x->ne[i] != y->ne[i]) {
            return "dec_mul_mat: x and y have the same rows";
        }
    }
    if (r->ne[0] != (y->ne[0] + 1) / 2 || r->ne[1] != x->ne[0] || r->ne[2] != 1 || r->ne[3] != 1) {
        return "dec_mul_mat: r is [(M+1)/2, K] for y of [M, ...] and x of [K, ...]";
    }
    if (ggml_nelements(s) != y->ne[0] || ggml_nrows(s) != 1) {
        return "dec_mul_mat: scales is [M]";
    }
    if (!ggml_is_contiguous(r) || !ggml_is_contiguous(s) || !ggml_is_contiguous_rows(x) ||
        !ggml_is_contiguous_rows(y) || !ggml_is_contiguous_rows(dst)) {
        return "dec_mul_mat: r and scales are contiguous, rows of y, x and the result are contiguous";
    }
    const int32_t * p = (const int32_t *) dst->op_params;
    float           b0, b15;
    memcpy(&b0, p + 2, sizeof(float));
    memcpy(&b15, p + 3, sizeof(float));
    if (p[0] < 0 || (p[1] != GGML_EXT_QDEC_APPROX && p[1] != GGML_EXT_QDEC_EXACT) || p[4] < 0) {
        return "dec_mul_mat: k_chunk >= 0, mode approximate or exact, n_tb >= 0";
    }
    if (p[1] == GGML_EXT_QDEC_APPROX && !(b15 > 0.0f && b0 >= b15 && isfinite(b0))) {
        return "dec_mul_mat: the approximate top-k needs finite 0 < b15 <= b0";
    }
    return NULL;
}

struct ggml_tensor * ggml_ext_dec_mul_mat(struct ggml_context * ctx, struct ggml_tensor * y, struct ggml_tensor * x,
                                          struct ggml_tensor * r, struct ggml_tensor * scales, int k_chunk,
                                          enum ggml_ext_qdec_mode mode, float b0, float b15) {
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, y->ne);
    result->op                  = GGML_OP_DEC_MUL_MAT;
    result->src[0]              = y;
    result->src[1]              = x;
    result->src[2]              = r;
    result->src[3]              = scales;
    int32_t * p                 = (int32_t *) result->op_params;
    p[0]                        = k_chunk;
    p[1]                        = (int32_t) mode;
    memcpy(p + 2, &b0, sizeof(float));
    memcpy(p + 3, &b15, sizeof(float));
    const char * err = ggml_ext_dec_mul_mat_check(result);
    if (err) {
        GGML_ABORT("%s", err);
    }
    return result;
}

void ggml_ext_dec_mul_mat_set_n_tb(struct ggml_tensor * dst, int n_tb) {
    GGML_ASSERT(dst->op == GGML_OP_DEC_MUL_MAT && n_tb >= 0);
    ((int32_t *) dst->op_params)[4] = n_tb;
}

int ggml_ext_dec_mul_mat_n_tb(const struct ggml_tensor * dst) {
    return ((const int32_t *) dst->op_params)[4];
}
