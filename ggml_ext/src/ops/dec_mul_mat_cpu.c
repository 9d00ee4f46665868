// GGML_OP_DEC_MUL_MAT on the CPU: the scalar reference the CUDA kernel will be compared with.
//
// Per row of x: the channels sel(x) (ggml_ext_qdec_select, ascending), then for every output m
//   dst[m] = y[m] + scales[m] * sum_{j in sel} q[j][m] * x[j]
// summed in float in ascending j, so each output is the same whatever the thread count. Threads split
// the outputs (rows times M) into equal contiguous ranges like COL_SIDECAR; a thread recomputes the
// selection of each row it touches (O(K), deterministic) into its slice of the work buffer.
#include "ggml-cpu-impl.h"
#include "ops.h"

#include <string.h>

#define SLICE_PAD 16  // int32s between threads' slices (a cache line)

static void forward(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const char * err = ggml_ext_dec_mul_mat_check(dst);
    if (err) {
        GGML_ABORT("%s", err);
    }
    const struct ggml_tensor * y = dst->src[0];
    const struct ggml_tensor * x = dst->src[1];
    const struct ggml_tensor * r = dst->src[2];
    const struct ggml_tensor * s = dst->src[3];
    const int32_t *            p = (const int32_t *) dst->op_params;
    float                      b0, b15;
    memcpy(&b0, p + 2, sizeof(float));
    memcpy(&b15, p + 3, sizeof(float));
    const int                   k_chunk = p[0];
    const enum ggml_ext_qdec_mode mode   = (enum ggml_ext_qdec_mode) p[1];

    const int64_t   K = x->ne[0];
    const uint8_t * rq = (const uint8_t *) r->data;
    const float *   sc = (const float *) s->data;
    const size_t    rs = r->nb[1];
    int32_t *       sel = (int32_t *) params->wdata + params->ith * (K + SLICE_PAD);

    struct ggml_ext_row_split split = ggml_ext_row_split(params->ith, params->nth, y, x, dst);
    struct ggml_ext_row_piece pc;
    while (ggml_ext_row_split_next(&split, &pc)) {
        const int64_t ns = ggml_ext_qdec_select(pc.x, K, k_chunk, mode, b0, b15, sel);
        for (int64_t m = pc.m0; m < pc.m1; m++) {
            float acc = 0.0f;
            for (int64_t t = 0; t < ns; t++) {
                const int64_t j = sel[t];
                const uint8_t b = rq[j * rs + m / 2];
                const int     q = (int) ((m & 1) ? b >> 4 : b & 15) - 8;
                acc += (float) q * pc.x[j];
            }
            pc.dst[m] = pc.y[m] + sc[m] * acc;
        }
    }
}

static int supports(const struct ggml_tensor * op) {
    return ggml_ext_dec_mul_mat_check(op) == NULL;
}

static size_t work_size(const struct ggml_tensor * op, int n_tasks) {
    return (size_t) n_tasks * (size_t) (op->src[1]->ne[0] + SLICE_PAD) * sizeof(int32_t);
}

const struct ggml_ext_cpu_op ggml_ext_cpu_op_dec_mul_mat = {
    .supports  = supports,
    .n_tasks   = NULL,  // every thread
    .work_size = work_size,
    .forward   = forward,
};
