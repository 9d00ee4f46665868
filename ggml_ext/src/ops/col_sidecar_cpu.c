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
    const int64_t   K = x->ne[0], k = idx->ne[0];
    const int32_t * ix = (const int32_t *) idx->data;
    // an index past x's row would read another row or outside the buffer (like get_rows, abort)
    for (int64_t j = 0; j < k; j++) {
        GGML_ASSERT(ix[j] >= 0 && ix[j] < K);
    }

    struct ggml_ext_row_split split = ggml_ext_row_split(params->ith, params->nth, y, x, dst);
    struct ggml_ext_row_piece pc;
    while (ggml_ext_row_split_next(&split, &pc)) {
        for (int64_t m = pc.m0; m < pc.m1; m++) {
            const float * sm  = (const float *) ((const char *) s->data + m * s->nb[1]);
            float         acc = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                acc += sm[j] * pc.x[ix[j]];
            }
            pc.dst[m] = pc.y[m] + acc;
        }
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
