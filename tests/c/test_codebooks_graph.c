// The codebook types CB2 / CB3 as ggml types (ids 100 / 101, ggml-ext-types.def): ggml graphs on the
// CPU backend run mul_mat through the patched hook (ggml-ext's Q8_K kernels) and get_rows through
// ggml's own get_rows with the types' row-wise to_float (patch 0110), against the same weights
// dequantized by that to_float as F32. Activation row counts 1-33 (one kernel pass of 8 rows and
// partial ones), 1-2 src1 planes, 1-4 threads. Also: the type traits (names, sizes), and that an id
// without a type (43-99, 106-119) reads "reserved" with block size 0.
// Built and run by tests/formats/test_codebooks_gguf.py against our installed libggml.
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

static int fails, runs;

static void expect(int ok, const char * what) {
    runs++;
    if (!ok) {
        fails++;
        printf("FAIL %s\n", what);
    }
}

// mul_mat and get_rows of a K x M matrix of type t against its dequantized F32 twin.
static double run(enum ggml_type t, int K, int M, int N, int planes, int nth, int * rows_exact) {
    struct ggml_init_params ip  = { 256 * 1024 * 1024, NULL, false };
    struct ggml_context *   ctx = ggml_init(ip);
    unsigned                seed = 99u + (unsigned) (K * 5 + M + N);

    float * w = malloc(sizeof(float) * K * M);
    for (int i = 0; i < K * M; i++) {
        w[i] = 0.05f * frand(&seed) * (i % 53 == 0 ? 5.0f : 1.0f);
    }
    struct ggml_tensor * wq = ggml_new_tensor_2d(ctx, t, K, M);
    struct ggml_tensor * wf = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
    ggml_quantize_chunk(t, w, wq->data, 0, M, K, NULL);
    ggml_get_type_traits(t)->to_float(wq->data, (float *) wf->data, (int64_t) K * M);

    struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, N, planes);
    for (int64_t i = 0; i < ggml_nelements(x); i++) {
        ((float *) x->data)[i] = frand(&seed);
    }
    struct ggml_tensor * ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 5);
    for (int i = 0; i < 5; i++) {
        ((int32_t *) ids->data)[i] = (i * 7 + 3) % M;
    }
    struct ggml_tensor * yq = ggml_mul_mat(ctx, wq, x);
    struct ggml_tensor * yf = ggml_mul_mat(ctx, wf, x);
    struct ggml_tensor * gq = ggml_get_rows(ctx, wq, ids);
    struct ggml_tensor * gf = ggml_get_rows(ctx, wf, ids);
    struct ggml_cgraph * g  = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, yq);
    ggml_build_forward_expand(g, yf);
    ggml_build_forward_expand(g, gq);
    ggml_build_forward_expand(g, gf);
    if (ggml_graph_compute_with_ctx(ctx, g, nth) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        exit(1);
    }
    *rows_exact = memcmp(gq->data, gf->data, ggml_nbytes(gf)) == 0;
    double maxdiff = 0, maxref = 0;
    for (int64_t i = 0; i < ggml_nelements(yq); i++) {
        const double a = ((float *) yq->data)[i], b = ((float *) yf->data)[i];
        if (!isfinite(a)) {
            maxdiff = INFINITY;
        }
        maxdiff = fmax(maxdiff, fabs(a - b));
        maxref  = fmax(maxref, fabs(b));
    }
    free(w);
    ggml_free(ctx);
    return maxdiff / maxref;
}

int main(void) {
    char what[200];
    expect(strcmp(ggml_type_name(GGML_TYPE_CB2), "cb2") == 0 && ggml_blck_size(GGML_TYPE_CB2) == 256 &&
               ggml_type_size(GGML_TYPE_CB2) == 78,
           "CB2 traits: cb2, 256 weights, 78 bytes");
    expect(strcmp(ggml_type_name(GGML_TYPE_CB3), "cb3") == 0 && ggml_blck_size(GGML_TYPE_CB3) == 256 &&
               ggml_type_size(GGML_TYPE_CB3) == 110,
           "CB3 traits: cb3, 256 weights, 110 bytes");
    expect(GGML_TYPE_COUNT == 120, "GGML_TYPE_COUNT is 120");
    const int unused[] = { 43, 50, 99, 106, 119 };
    for (size_t i = 0; i < sizeof(unused) / sizeof(unused[0]); i++) {
        snprintf(what, sizeof(what), "id %d reads reserved with block size 0", unused[i]);
        expect(strcmp(ggml_type_name((enum ggml_type) unused[i]), "reserved") == 0 &&
                   ggml_blck_size((enum ggml_type) unused[i]) == 0,
               what);
    }

    const enum ggml_type types[]     = { GGML_TYPE_CB2, GGML_TYPE_CB3 };
    const int            rows[]      = { 1, 2, 8, 9, 33 };
    const int            shapes[][2] = { { 256, 16 }, { 512, 40 }, { 1536, 24 } };
    double               worst       = 0;
    for (int ti = 0; ti < 2; ti++) {
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
                for (int planes = 1; planes <= 2; planes++) {
                    for (int nth = 1; nth <= 4; nth += 1 + (planes == 2)) {
                        int          exact;
                        const double rel = run(types[ti], shapes[si][0], shapes[si][1], rows[ri], planes, nth, &exact);
                        worst            = fmax(worst, rel);
                        // the kernels see the weights exactly and the activations as Q8_K (a relative
                        // step of 1/254 per value); a decoding or indexing error is of order 1
                        snprintf(what, sizeof(what), "%s K=%d M=%d N=%d planes=%d threads=%d: mul_mat rel diff %g",
                                 ggml_type_name(types[ti]), shapes[si][0], shapes[si][1], rows[ri], planes, nth, rel);
                        expect(rel < 2e-2, what);
                        snprintf(what, sizeof(what), "%s K=%d M=%d: get_rows equals the dequantized rows",
                                 ggml_type_name(types[ti]), shapes[si][0], shapes[si][1]);
                        expect(exact, what);
                    }
                }
            }
        }
    }
    printf("kernel: cb2 %s, cb3 %s\n", ggml_ext_dispatched_kernel(GGML_TYPE_CB2, 0),
           ggml_ext_dispatched_kernel(GGML_TYPE_CB3, 1));
    printf("%d of %d checks pass (largest mul_mat relative difference %.3g)\n", runs - fails, runs, worst);
    return fails ? 1 : 0;
}
