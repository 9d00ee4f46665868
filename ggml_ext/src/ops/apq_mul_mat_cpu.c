// GGML_OP_APQ_MUL_MAT on the CPU: dst = W_b . x for an any-precision weight (docs/formats/anyprec.md).
//
// Threads split W's rows into equal contiguous ranges, so one token (decode) still spreads over every
// thread, and each output element is computed by one thread in one fixed order: the result does not
// depend on the thread count.
//   - up to GEMV_MAX_TOKENS activation rows (decode, small batches): the family's GEMV of several rows
//     (ggml_ext_anyprec_gemv_tokens, formats/anyprec/dispatch.c: AVX-512 decodes each weight block once for up
//     to four rows (NEON too; AVX2 for two), scalar runs its GEMV per row; each row's result is the one-row GEMV's bit
//     for bit): it reads the first b planes of the thread's rows and precision b's tables, nothing else;
//   - more (prompt processing, perplexity): blocks of ROW_BLOCK rows are dequantized once to F32 in the
//     thread's part of the work buffer (ggml_ext_anyprec_dequantize: the same b planes and table entries)
//     and dotted with every activation row (ggml's own ggml_vec_dot_f32), so the bit-transpose is paid
//     once per block instead of once per token.
// Both compute the same values W_b[r][j] = T_b[r][code_b(r, j)]; they differ only in summation order.
#include "ggml-cpu-impl.h"
#include "vec.h"

#include "formats/anyprec/anyprec_impl.h"
#include "ops.h"

enum { GEMV_MAX_TOKENS = 8, ROW_BLOCK = 16, PAD_BYTES = 64 };

static int64_t n_tokens(const struct ggml_tensor * dst) {
    return dst->ne[1] * dst->ne[2] * dst->ne[3];
}

static size_t work_size(const struct ggml_tensor * op, int n_tasks) {
    if (n_tokens(op) <= GEMV_MAX_TOKENS) {
        return 0;
    }
    // one block of rows per thread, each padded to a cache line
    return (size_t) n_tasks * ((size_t) ROW_BLOCK * (size_t) op->src[0]->ne[0] * sizeof(float) + PAD_BYTES);
}

static void forward(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const char * err = ggml_ext_apq_mul_mat_check(dst);
    if (err) {
        GGML_ABORT("%s", err);
    }
    const struct ggml_tensor * w      = dst->src[0];
    const struct ggml_tensor * x      = dst->src[1];
    const struct ggml_tensor * tables = dst->src[2];
    const int32_t *            p      = (const int32_t *) dst->op_params;
    const int                  S = p[0], P = p[1], b = p[2];
    const int64_t              K = w->ne[0], N = w->ne[1];
    const uint8_t *            planes = (const uint8_t *) w->data;
    const ggml_ext_fp16_t *    tab    = (const ggml_ext_fp16_t *) tables->data;
    (void) P;

    const int64_t r0 = (N * params->ith) / params->nth;
    const int64_t r1 = (N * (params->ith + 1)) / params->nth;
    if (r0 >= r1) {
        return;
    }
    const int64_t ne1 = x->ne[1], ne2 = x->ne[2], T = n_tokens(dst);

    if (T <= GEMV_MAX_TOKENS) {
        const float * xs[GEMV_MAX_TOKENS];
        float *       ys[GEMV_MAX_TOKENS];
        for (int64_t t = 0; t < T; t++) {
            const int64_t i1 = t % ne1, i2 = (t / ne1) % ne2, i3 = t / (ne1 * ne2);
            xs[t] = (const float *) ((const char *) x->data + i1 * x->nb[1] + i2 * x->nb[2] + i3 * x->nb[3]);
            ys[t] = (float *) ((char *) dst->data + i1 * dst->nb[1] + i2 * dst->nb[2] + i3 * dst->nb[3]) + r0;
        }
        if (ggml_ext_anyprec_gemv_tokens(planes, tab, r0, r1 - r0, N, K, S, b, (int) T, xs, ys) != 0) {
            GGML_ABORT("apq_mul_mat: the GEMV refused %s (K %lld, S %d, b %d)", w->name, (long long) K, S, b);
        }
        return;
    }

    float * wf = (float *) ((char *) params->wdata +
                            (size_t) params->ith * ((size_t) ROW_BLOCK * (size_t) K * sizeof(float) + PAD_BYTES));
    for (int64_t rb = r0; rb < r1; rb += ROW_BLOCK) {
        const int64_t nr = r1 - rb < ROW_BLOCK ? r1 - rb : ROW_BLOCK;
        if (ggml_ext_anyprec_dequantize(planes, tab, rb, nr, N, K, S, P, b, wf) != 0) {
            GGML_ABORT("apq_mul_mat: could not dequantize %s (K %lld, S %d, b %d)", w->name, (long long) K, S, b);
        }
        for (int64_t t = 0; t < T; t++) {
            const int64_t i1 = t % ne1, i2 = (t / ne1) % ne2, i3 = t / (ne1 * ne2);
            const float * xr = (const float *) ((const char *) x->data + i1 * x->nb[1] + i2 * x->nb[2] + i3 * x->nb[3]);
            float * dr = (float *) ((char *) dst->data + i1 * dst->nb[1] + i2 * dst->nb[2] + i3 * dst->nb[3]);
            for (int64_t r = 0; r < nr; r++) {
                ggml_vec_dot_f32((int) K, dr + rb + r, 0, wf + r * K, 0, xr, 0, 1);
            }
        }
    }
}

static int supports(const struct ggml_tensor * op) {
    return ggml_ext_apq_mul_mat_check(op) == NULL;
}

const struct ggml_ext_cpu_op ggml_ext_cpu_op_apq_mul_mat = {
    .supports  = supports,
    .n_tasks   = NULL,  // every thread
    .work_size = work_size,
    .forward   = forward,
};
