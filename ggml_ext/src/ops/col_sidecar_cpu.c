// GGML_OP_COL_SIDECAR on the CPU: the scalar reference every other backend is compared with.
//
// dst[m, r] = y[m, r] + sum_j s[j, m] * x[idx[j], r], the sum in float in the order j = 0..k-1, so
// each output element is the same whatever the thread count. Threads split the outputs (rows of the
// result times M) into equal contiguous ranges: one token (decode) still spreads over every thread.
#include "ggml-cpu-impl.h"
#include "ops.h"

static void forward(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const char * err = ggml_ext_col_sidecar_check(dst);
    if (err) {
        GGML_ABORT("%s", err);
    }
    const struct ggml_tensor * y   = dst->src[0];
    const struct ggml_tensor * x   = dst->src[1];
    const struct ggml_tensor * idx = dst->src[2];
    const struct ggml_tensor * s   = dst->src[3];
    const int64_t   M = y->ne[0], K = x->ne[0], k = idx->ne[0];
    const int32_t * ix = (const int32_t *) idx->data;
    // an index past x's row would read another row or outside the buffer (like get_rows, abort)
    for (int64_t j = 0; j < k; j++) {
        GGML_ASSERT(ix[j] >= 0 && ix[j] < K);
    }

    const int64_t n     = ggml_nrows(y) * M;
    const int64_t per   = (n + params->nth - 1) / params->nth;
    const int64_t start = per * params->ith;
    const int64_t end   = start + per < n ? start + per : n;
    const int64_t ne1 = y->ne[1], ne2 = y->ne[2];
    for (int64_t e = start; e < end;) {
        const int64_t r = e / M, m0 = e % M;
        const int64_t m1 = M - m0 < end - e ? M : m0 + (end - e);
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float * xr = (const float *) ((const char *) x->data + i1 * x->nb[1] + i2 * x->nb[2] + i3 * x->nb[3]);
        const float * yr = (const float *) ((const char *) y->data + i1 * y->nb[1] + i2 * y->nb[2] + i3 * y->nb[3]);
        float *       dr = (float *) ((char *) dst->data + i1 * dst->nb[1] + i2 * dst->nb[2] + i3 * dst->nb[3]);
        for (int64_t m = m0; m < m1; m++) {
            const float * sm  = (const float *) ((const char *) s->data + m * s->nb[1]);
            float         acc = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                acc += sm[j] * xr[ix[j]];
            }
            dr[m] = yr[m] + acc;
        }
        e += m1 - m0;
    }
}

static int supports(const struct ggml_tensor * op) {
    return ggml_ext_col_sidecar_check(op) == NULL;
}

const struct ggml_ext_cpu_op ggml_ext_cpu_op_col_sidecar = {
    .supports  = supports,
    .n_tasks   = NULL,  // every thread
    .work_size = NULL,  // none
    .forward   = forward,
};
