// ggml's CPU mul_mat on interleaved Q4_0 weights (types 31-33) and interleaved IQ4_NL
// weights (36-38) through the patched ggml_compute_forward_mul_mat hook, against the same
// weights as plain Q4_0 / IQ4_NL through stock ggml, for activation row counts that exercise the 4-row GEMM, the GEMV
// leftovers and both together, batched src1 planes, and 1-4 threads.
// Built and run by tests/formats/test_interleaved4_q4_0_gguf.py against our installed libggml.
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-ext.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float frand(unsigned * s) {
    *s = *s * 1103515245u + 12345u;
    return ((float) ((*s >> 8) & 0xffff) / 65535.0f) * 2.0f - 1.0f;
}

// Largest |a - b| relative to the largest |b| over the result.
static double run(enum ggml_type plain, enum ggml_type t, int K, int M, int N, int planes, int nth, double * scale) {
    struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);

    float * w = malloc(sizeof(float) * K * M);
    unsigned seed = 1234u + (unsigned) (K * 7 + M);
    for (int i = 0; i < K * M; i++) {
        w[i] = frand(&seed);
    }
    struct ggml_tensor * wq = ggml_new_tensor_2d(ctx, plain, K, M);
    struct ggml_tensor * wi = ggml_new_tensor_2d(ctx, t, K, M);
    // the interleaved IQ4_NL types quantize with ggml-ext's IQ4_NL quantizer (then repack): the
    // plain reference must hold the same weights, so it takes that quantizer too, not ggml's
    if (plain == GGML_TYPE_IQ4_NL) {
        ggml_ext_quantize_iq4_nl(w, wq->data, M, K, NULL);
    } else {
        ggml_quantize_chunk(plain, w, wq->data, 0, M, K, NULL);
    }
    ggml_quantize_chunk(t, w, wi->data, 0, M, K, NULL);

    struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, N, planes);
    for (int64_t i = 0; i < ggml_nelements(x); i++) {
        ((float *) x->data)[i] = frand(&seed);
    }
    struct ggml_tensor * yq = ggml_mul_mat(ctx, wq, x);
    struct ggml_tensor * yi = ggml_mul_mat(ctx, wi, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, yq);
    ggml_build_forward_expand(gf, yi);
    if (ggml_graph_compute_with_ctx(ctx, gf, nth) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        exit(1);
    }
    double maxdiff = 0, maxref = 0;
    for (int64_t i = 0; i < ggml_nelements(yq); i++) {
        const double a = ((float *) yi->data)[i], b = ((float *) yq->data)[i];
        if (!isfinite(a)) {
            return INFINITY;
        }
        maxdiff = fmax(maxdiff, fabs(a - b));
        maxref  = fmax(maxref, fabs(b));
    }
    *scale = maxref;
    free(w);
    ggml_free(ctx);
    return maxdiff / maxref;
}

int main(void) {
    const enum ggml_type types[] = { GGML_TYPE_Q4_0_4_4,   GGML_TYPE_Q4_0_4_8,   GGML_TYPE_Q4_0_8_8,
                                     GGML_TYPE_IQ4_NL_4_4, GGML_TYPE_IQ4_NL_4_8, GGML_TYPE_IQ4_NL_8_8 };
    const int            rows[]  = { 1, 2, 3, 4, 5, 7, 8, 13, 33 };
    const int            shapes[][2] = { { 64, 8 }, { 256, 24 }, { 576, 192 }, { 1536, 64 } };
    int                  fails   = 0, runs = 0;
    double               worst   = 0;
    for (int ti = 0; ti < 6; ti++) {
        const enum ggml_type plain = ti < 3 ? GGML_TYPE_Q4_0 : GGML_TYPE_IQ4_NL;
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
                for (int planes = 1; planes <= 2; planes++) {
                    for (int nth = 1; nth <= 4; nth += 1 + (planes == 2)) {
                        double     scale;
                        const double rel = run(plain, types[ti], shapes[si][0], shapes[si][1], rows[ri], planes, nth, &scale);
                        runs++;
                        worst = fmax(worst, rel);
                        // Both sides use Q8_0 activations of the same values up to the rounding of
                        // ties in their quantizers; a layout or indexing error is of order 1.
                        if (!(rel < 2e-3)) {
                            fails++;
                            printf("FAIL %s vs %s K=%d M=%d N=%d planes=%d threads=%d: relative difference %g\n",
                                   ggml_type_name(types[ti]), ggml_type_name(plain), shapes[si][0], shapes[si][1], rows[ri], planes, nth, rel);
                        }
                    }
                }
            }
        }
    }
    printf("%d of %d mul_mat runs agree with plain Q4_0 / IQ4_NL (largest relative difference %.3g)\n", runs - fails, runs, worst);
    return fails ? 1 : 0;
}
