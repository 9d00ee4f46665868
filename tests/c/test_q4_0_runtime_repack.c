// ggml-cpu's runtime repack (CPU_REPACK buffer) of plain Q4_0 weights, patch 0112:
//   ours     : the weight is repacked into Q4_0_8_8 bytes (== ggml_quantize_chunk's for
//              type 33) and its mul_mat is bit-identical to the Q4_0_8_8 weight's through
//              the mul_mat hook, and within rounding of ggml's plain Q4_0 vec_dot;
//   upstream : (GGML_EXT_RUNTIME_REPACK=0) upstream's repack takes it, within rounding too.
// Activation rows 1-33 (4-row GEMM, GEMV leftovers, both), 1-2 src1 planes, 1-4 threads.
// Weights whose row count does not divide by 8 are not offered to the repack buffer
// (supports_op, what llama.cpp asks when it places a weight), in both modes.
// Built and run by tests/kernels/test_q4_0_runtime_repack.py against our installed libggml.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ours;                          // expect ggml-ext's repack (else upstream's)
static int n_ours_logged, n_upstream_logged;

static void on_log(enum ggml_log_level level, const char * text, void * user) {
    (void) level;
    (void) user;
    if (strstr(text, "ggml-ext runtime repack of")) {
        n_ours_logged++;
    } else if (strstr(text, "repack tensor")) {
        n_upstream_logged++;
    }
}

static float frand(unsigned * s) {
    *s = *s * 1103515245u + 12345u;
    return ((float) ((*s >> 8) & 0xffff) / 65535.0f) * 2.0f - 1.0f;
}

static ggml_backend_buffer_type_t repack_buft(void) {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get ? get(ggml_backend_reg_dev_get(reg, 0)) : NULL; b && *b; b++) {
        if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK")) {
            return *b;
        }
    }
    return NULL;
}

// Whether the CPU device runs MUL_MAT of a Q4_0 K x M weight held in the repack buffer.
static int offered(int K, int M) {
    struct ggml_init_params ip = { 4 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor *  w   = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, K, M);
    struct ggml_tensor *  x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, 4);
    struct ggml_tensor *  y   = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(repack_buft(), ggml_nbytes(w) + 256);
    ggml_backend_tensor_alloc(buf, w, ggml_backend_buffer_get_base(buf));  // init_tensor: the type chosen, no data
    const int ok = ggml_backend_dev_supports_op(ggml_backend_reg_dev_get(ggml_backend_cpu_reg(), 0), y);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return ok;
}

// One case; returns the number of failed checks. *rel: largest |repack - plain| / max |plain|.
static int run(int K, int M, int N, int planes, int nth, double * rel) {
    int fails = 0;
    float * w = malloc(sizeof(float) * K * M);
    unsigned seed = 1234u + (unsigned) (K * 7 + M);
    for (int i = 0; i < K * M; i++) {
        w[i] = frand(&seed);
    }

    // the weight in the repack buffer, copied in by set_tensor (-> the traits' repack)
    struct ggml_init_params wp = { ggml_tensor_overhead(), NULL, true };
    struct ggml_context * wctx = ggml_init(wp);
    struct ggml_tensor *  wr   = ggml_new_tensor_2d(wctx, GGML_TYPE_Q4_0, K, M);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack_buft());

    struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * wq = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, K, M);       // plain, ggml's vec_dot
    struct ggml_tensor * wi = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0_8_8, K, M);   // type 33, the mul_mat hook
    ggml_quantize_chunk(GGML_TYPE_Q4_0, w, wq->data, 0, M, K, NULL);
    ggml_quantize_chunk(GGML_TYPE_Q4_0_8_8, w, wi->data, 0, M, K, NULL);
    const int before = n_ours_logged + n_upstream_logged;
    ggml_backend_tensor_set(wr, wq->data, 0, ggml_nbytes(wq));
    if (n_ours_logged + n_upstream_logged != before + 1 || (ours ? n_upstream_logged : n_ours_logged) != 0) {
        printf("FAIL K=%d M=%d: expected one %s repack log line (ours %d, upstream %d)\n", K, M,
               ours ? "ggml-ext" : "upstream", n_ours_logged, n_upstream_logged);
        fails++;
    }
    if (ours && memcmp(wr->data, wi->data, ggml_nbytes(wi)) != 0) {
        printf("FAIL K=%d M=%d: runtime-repacked bytes differ from the Q4_0_8_8 tensor's\n", K, M);
        fails++;
    }

    struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, N, planes);
    for (int64_t i = 0; i < ggml_nelements(x); i++) {
        ((float *) x->data)[i] = frand(&seed);
    }
    struct ggml_tensor * yr = ggml_mul_mat(ctx, wr, x);
    struct ggml_tensor * yq = ggml_mul_mat(ctx, wq, x);
    struct ggml_tensor * yi = ggml_mul_mat(ctx, wi, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, yr);
    ggml_build_forward_expand(gf, yq);
    ggml_build_forward_expand(gf, yi);
    if (ggml_graph_compute_with_ctx(ctx, gf, nth) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        exit(1);
    }
    double maxdiff = 0, maxref = 0;
    for (int64_t i = 0; i < ggml_nelements(yq); i++) {
        const double a = ((float *) yr->data)[i], b = ((float *) yq->data)[i];
        maxdiff = isfinite(a) ? fmax(maxdiff, fabs(a - b)) : INFINITY;
        maxref  = fmax(maxref, fabs(b));
    }
    *rel = maxdiff / maxref;
    // Q8_0 activations of the same values on both sides (up to ties in the quantizers);
    // a layout or indexing error is of order 1.
    if (!(*rel < 2e-3)) {
        printf("FAIL K=%d M=%d N=%d planes=%d threads=%d: relative difference to plain Q4_0 %g\n", K, M, N, planes,
               nth, *rel);
        fails++;
    }
    if (ours && memcmp(yr->data, yi->data, ggml_nbytes(yi)) != 0) {
        printf("FAIL K=%d M=%d N=%d planes=%d threads=%d: not bit-identical to the Q4_0_8_8 weight's result\n", K, M,
               N, planes, nth);
        fails++;
    }
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_free(ctx);
    free(w);
    return fails;
}

int main(int argc, char ** argv) {
    if (argc != 2 || (strcmp(argv[1], "ours") && strcmp(argv[1], "upstream"))) {
        fprintf(stderr, "usage: %s ours|upstream\n", argv[0]);
        return 2;
    }
    ours = !strcmp(argv[1], "ours");
    ggml_log_set(on_log, NULL);
    if (!repack_buft()) {
        printf("FAIL: no CPU_REPACK buffer type in this build\n");
        return 1;
    }
    int fails = 0, runs = 0;
    // rows that do not divide by 8 stay out of the repack buffer; ones that do go in
    if (offered(64, 12) || offered(64, 4) || !offered(64, 8)) {
        printf("FAIL: repack buffer placement: 12 rows %d, 4 rows %d, 8 rows %d\n", offered(64, 12), offered(64, 4),
               offered(64, 8));
        fails++;
    }
    const int rows[]      = { 1, 2, 3, 4, 5, 7, 8, 13, 33 };
    const int shapes[][2] = { { 64, 8 }, { 256, 24 }, { 576, 192 }, { 1536, 64 } };
    double    worst       = 0;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
            for (int planes = 1; planes <= 2; planes++) {
                for (int nth = 1; nth <= 4; nth += 1 + (planes == 2)) {
                    double rel = 0;
                    fails += run(shapes[si][0], shapes[si][1], rows[ri], planes, nth, &rel);
                    runs++;
                    worst = fmax(worst, rel);
                }
            }
        }
    }
    printf("%s repack: %d mul_mat runs, %d failed checks (largest relative difference to plain Q4_0 %.3g%s)\n",
           ours ? "ggml-ext" : "upstream", runs, fails, worst,
           ours ? "; bytes and results bit-identical to Q4_0_8_8's" : "");
    return fails ? 1 : 0;
}
