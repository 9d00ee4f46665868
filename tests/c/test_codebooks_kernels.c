// Codebooks kernels (CB2 / CB3 x Q8_K) against the scalar reference: every implementation compiled
// into this build and usable on this CPU (formats/codebooks/dispatch.c) must give the scalar
// twin's numbers for several activation-row counts (GEMV: 1 row; GEMM: 2..19 rows, across the
// kernels' 8-row passes) and weight-row counts, on weights quantized by the reference quantizer.
// The scalar twin itself is checked against a double-precision dot of the dequantized weights and
// activations. Prints "implementations: ..." and "N passed, M failed"; exit status 1 on a failure.
#include "common/fp16.h"
#include "formats/codebooks/codebooks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static void check(int ok, const char * what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL: %s\n", what);
    }
}

static uint32_t rng = 12345u;
static float frand(void) {  // roughly normal, deterministic
    float s = 0.0f;
    for (int i = 0; i < 4; i++) {
        rng = rng * 1664525u + 1013904223u;
        s += (float) (rng >> 8) / 16777216.0f - 0.5f;
    }
    return s;
}

int main(void) {
    printf("implementations:");
    for (int i = 0; i < ggml_ext_codebooks_impl_count(); i++) {
        const struct ggml_ext_codebooks_impl * p = ggml_ext_codebooks_impl_get(i);
        if (!p->usable || p->usable()) {
            printf(" %s", p->name);
        }
    }
    printf("\n");
    printf("dispatched: cb2 %s, cb3 %s\n", ggml_ext_codebooks_dispatched(2), ggml_ext_codebooks_dispatched(3));

    const int n = 512, NC = 13, NR = 19;
    float *   xw = malloc(sizeof(float) * n * NC);
    float *   xa = malloc(sizeof(float) * n * NR);
    for (int i = 0; i < n * NC; i++) {
        xw[i] = 0.02f * frand() * (i % 97 == 0 ? 8.0f : 1.0f);  // a few outliers
    }
    for (int i = 0; i < n * NR; i++) {
        xa[i] = frand() * (i % 31 == 0 ? 6.0f : 1.0f);
    }
    ggml_ext_block_q8_K * qa = malloc(sizeof(ggml_ext_block_q8_K) * (n / 256) * NR);
    for (int r = 0; r < NR; r++) {
        ggml_ext_codebooks_quantize_row_q8_K(xa + r * n, qa + r * (n / 256), n);
    }
    // Q8_K bytes: the scale, the rounding and the sums
    {
        int ok = 1;
        for (int r = 0; r < NR && ok; r++) {
            for (int b = 0; b < n / 256 && ok; b++) {
                const ggml_ext_block_q8_K * y = &qa[r * (n / 256) + b];
                for (int j = 0; j < 256; j++) {
                    ok = ok && fabsf(y->qs[j] * y->d - xa[r * n + b * 256 + j]) <= 0.5001f * y->d;
                }
                for (int g = 0; g < 16; g++) {
                    int sum = 0;
                    for (int j = 0; j < 16; j++) {
                        sum += y->qs[16 * g + j];
                    }
                    ok = ok && sum == y->bsums[g];
                }
            }
        }
        check(ok, "Q8_K quantization within half a step, bsums exact");
    }

    for (int bits = 2; bits <= 3; bits++) {
        const size_t bs  = ggml_ext_codebooks_block_size(bits);
        uint8_t *    qw  = malloc(bs * (n / 256) * NC);
        float *      dqw = malloc(sizeof(float) * n * NC);
        check(ggml_ext_codebooks_quantize(bits, xw, qw, NC, n, NULL) == bs * (n / 256) * NC, "quantize");
        ggml_ext_codebooks_dequantize(bits, qw, dqw, (n / 256) * NC);

        float * ref = malloc(sizeof(float) * NR * NC);
        float * out = malloc(sizeof(float) * NR * NC);
        ggml_ext_codebooks_impl_generic.mm[bits - 2](n, ref, NC, qw, qa, NR, NC);

        // the scalar twin against a double-precision dot of what the bytes mean
        double worst = 0.0;
        for (int r = 0; r < NR; r++) {
            for (int c = 0; c < NC; c++) {
                double e = 0.0, mag = 0.0;
                for (int b = 0; b < n / 256; b++) {
                    const ggml_ext_block_q8_K * a = &qa[r * (n / 256) + b];
                    for (int j = 0; j < 256; j++) {
                        const double p = (double) dqw[c * n + b * 256 + j] * a->qs[j] * a->d;
                        e += p;
                        mag += fabs(p);
                    }
                }
                worst = fmax(worst, fabs(e - ref[r * NC + c]) / (mag + 1e-30));
            }
        }
        char what[160];
        snprintf(what, sizeof(what), "cb%d generic vs dequantized double dot (worst rel %.3g)", bits, worst);
        check(worst < 1e-5, what);

        for (int i = 1; i < ggml_ext_codebooks_impl_count(); i++) {
            const struct ggml_ext_codebooks_impl * p = ggml_ext_codebooks_impl_get(i);
            if (!p->mm[bits - 2] || (p->usable && !p->usable())) {
                continue;
            }
            const int nrs[] = { 1, 2, 7, 8, 9, 19 };
            for (size_t k = 0; k < sizeof(nrs) / sizeof(nrs[0]); k++) {
                const int nr = nrs[k];
                for (int nc = 1; nc <= NC; nc += 6) {
                    memset(out, 0, sizeof(float) * NR * NC);
                    p->mm[bits - 2](n, out, NC, qw, qa, nr, nc);
                    int ok = 1;
                    for (int r = 0; r < nr; r++) {
                        for (int c = 0; c < nc; c++) {
                            const float a = out[r * NC + c], e = ref[r * NC + c];
                            ok = ok && fabsf(a - e) <= 1e-5f * (fabsf(e) + 1e-3f);
                        }
                    }
                    snprintf(what, sizeof(what), "cb%d %s vs generic, %d activation rows x %d weight rows", bits,
                             p->name, nr, nc);
                    check(ok, what);
                }
            }
        }
        free(qw);
        free(dqw);
        free(ref);
        free(out);
    }
    free(xw);
    free(xa);
    free(qa);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
