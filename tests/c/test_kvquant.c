// KVQuant kernels: every compiled-in implementation against the scalar reference (generic), on
// random layers (bits 2/3/4, NEOX and normal RoPE, partial rotation, frequency factors, grouped
// query heads, consecutive and scattered positions, outliers). Prints "implementations: ..." and
// "N passed, M failed"; exit status 1 on a failure. Built by tests/kernels/test_kvquant_kernels.py.
#include "formats/kvquant/kvquant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char * const NAMES[] = { "generic", "neon", "avx2" };
static int passed, failed;

static uint64_t rng = 88172645463325252ull;
static float uni(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float) ((rng >> 11) * (1.0 / 9007199254740992.0));
}
static float gauss(void) {
    float u = uni() + 1e-7f, v = uni();
    return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}

static void check(int ok, const char * what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL %s\n", what);
    }
}

static void run_case(int bits, int n_kv, int hd, int mode, int n_dims, int n_q, int n_tok, int scattered, int ff) {
    const int D = n_kv * hd, n = 1 << bits;
    float *   lo = malloc(sizeof(float) * D), * hi = malloc(sizeof(float) * D), * scale = malloc(sizeof(float) * D);
    float     lv[16], vals[16], factors[256];
    for (int c = 0; c < D; c++) {
        scale[c] = 0.2f + 3 * uni();
        const float m = gauss();
        lo[c] = m - 2.5f * scale[c];
        hi[c] = m + 2.5f * scale[c];
    }
    for (int i = 0; i < n; i++) {
        lv[i]   = -1 + 2.0f * i / (n - 1) + (i > 0 && i < n - 1 ? 0.05f * (uni() - 0.5f) : 0);
        vals[i] = lv[i] * 1.02f;
    }
    for (int i = 0; i < 256; i++) {
        factors[i] = 1 + uni();
    }
    struct ggml_ext_kvquant_config cfg = { bits, n_kv, hd, 3, 4, 2, mode, n_dims, 10000.0f, 0.5f + uni(),
                                       ff ? factors : NULL, lo, hi, lv, vals, lv, vals };
    char                       err[200];
    struct ggml_ext_kvquant_layer * L = ggml_ext_kvquant_layer_new(&cfg, err, sizeof err);
    if (!L) {
        printf("FAIL layer: %s\n", err);
        failed++;
        return;
    }
    const size_t kr = ggml_ext_kvquant_k_row_size(L), vr = ggml_ext_kvquant_v_row_size(L);
    uint8_t *    K = malloc(kr * n_tok), * V = malloc(vr * n_tok);
    int32_t *    pos = malloc(sizeof(int32_t) * n_tok);
    float *      x = malloc(sizeof(float) * D), * y = malloc(sizeof(float) * D);
    int          p = (int) (uni() * 3000);
    for (int t = 0; t < n_tok; t++) {
        for (int c = 0; c < D; c++) {
            const float m = (hi[c] + lo[c]) / 2;
            x[c] = m + scale[c] * gauss() * (uni() < 0.03f ? 3 : 1);
        }
        check(ggml_ext_kvquant_quantize_k(L, x, K + kr * t) >= 0, "quantize_k");
        ggml_ext_kvquant_dequantize_k(L, K + kr * t, y);
        for (int c = 0; c < D; c++) {  // inside the thresholds: at most one level step off
            if (x[c] >= lo[c] && x[c] <= hi[c] && fabsf(x[c] - y[c]) > (hi[c] - lo[c]) * 0.8f / (n - 1) + 1e-3f) {
                check(0, "dequantize_k");
                break;
            }
        }
        for (int c = 0; c < D; c++) {
            x[c] = gauss() * (uni() < 0.01f ? 8 : 1);
        }
        check(ggml_ext_kvquant_quantize_v(L, x, V + vr * t) == 0, "quantize_v");
        pos[t] = p;
        p += scattered && uni() < 0.2f ? 1 + (int) (uni() * 50) : 1;
    }
    float * q = malloc(sizeof(float) * n_q * hd), * w = malloc(sizeof(float) * n_q * n_tok);
    for (int i = 0; i < n_q * hd; i++) {
        q[i] = gauss();
    }
    for (int i = 0; i < n_q * n_tok; i++) {
        w[i] = uni() / n_tok;
    }
    float * ref_s = malloc(sizeof(float) * n_q * n_tok), * got_s = malloc(sizeof(float) * n_q * n_tok);
    float * ref_o = malloc(sizeof(float) * n_q * hd), * got_o = malloc(sizeof(float) * n_q * hd);
    for (int head = 0; head < n_kv; head++) {
        ggml_ext_kvquant_force("generic");
        ggml_ext_kvquant_k_scores(L, head, q, n_q, K, kr, pos, n_tok, ref_s);
        ggml_ext_kvquant_v_accumulate(L, head, w, n_q, V, vr, n_tok, ref_o);
        for (size_t i = 1; i < sizeof NAMES / sizeof NAMES[0]; i++) {
            if (ggml_ext_kvquant_force(NAMES[i]) != 0) {
                continue;
            }
            const char * used = ggml_ext_kvquant_kernel(L);
            check(!strcmp(used, bits == 4 && hd % 16 == 0 ? NAMES[i] : "generic"), "dispatch");
            ggml_ext_kvquant_k_scores(L, head, q, n_q, K, kr, pos, n_tok, got_s);
            ggml_ext_kvquant_v_accumulate(L, head, w, n_q, V, vr, n_tok, got_o);
            char what[200];
            snprintf(what, sizeof what, "%s (runs %s) bits %d hd %d mode %d n_dims %d n_q %d head %d", NAMES[i], used,
                     bits, hd, mode, n_dims, n_q, head);
            // tolerance: a relative 2e-5 of the sum of |terms| (key norms ~ 3 scale per channel)
            int ok = 1;
            for (int i2 = 0; i2 < n_q * n_tok && ok; i2++) {
                const float * qg = q + (i2 / n_tok) * hd;
                float         mag = 0;
                for (int c = 0; c < hd; c++) {
                    mag += fabsf(qg[c]) * 20;
                }
                if (!(fabsf(got_s[i2] - ref_s[i2]) <= 2e-5f * mag + 1e-4f)) {
                    printf("  score %d: %g vs %g (mag %g)\n", i2, got_s[i2], ref_s[i2], mag);
                    ok = 0;
                }
            }
            check(ok, what);
            ok = 1;
            for (int i2 = 0; i2 < n_q * hd && ok; i2++) {
                if (!(fabsf(got_o[i2] - ref_o[i2]) <= 1e-4f * (1 + fabsf(ref_o[i2])))) {
                    printf("  out %d: %g vs %g\n", i2, got_o[i2], ref_o[i2]);
                    ok = 0;
                }
            }
            check(ok, what);
        }
    }
    // every KV head in one call (head = -1), each impl against the per-head reference
    {
        float * qa = malloc(sizeof(float) * n_kv * n_q * hd), * wa = malloc(sizeof(float) * n_kv * n_q * n_tok);
        float * sa = malloc(sizeof(float) * n_kv * n_q * n_tok), * oa = malloc(sizeof(float) * n_kv * n_q * hd);
        for (int i = 0; i < n_kv * n_q * hd; i++) {
            qa[i] = gauss();
        }
        for (int i = 0; i < n_kv * n_q * n_tok; i++) {
            wa[i] = uni() / n_tok;
        }
        for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
            if (ggml_ext_kvquant_force(NAMES[i]) != 0) {
                continue;
            }
            ggml_ext_kvquant_k_scores(L, -1, qa, n_q, K, kr, pos, n_tok, sa);
            ggml_ext_kvquant_v_accumulate(L, -1, wa, n_q, V, vr, n_tok, oa);
            ggml_ext_kvquant_force("generic");
            int ok = 1;
            for (int head = 0; head < n_kv && ok; head++) {
                ggml_ext_kvquant_k_scores(L, head, qa + (size_t) head * n_q * hd, n_q, K, kr, pos, n_tok, ref_s);
                ggml_ext_kvquant_v_accumulate(L, head, wa + (size_t) head * n_q * n_tok, n_q, V, vr, n_tok, ref_o);
                for (int i2 = 0; i2 < n_q * n_tok && ok; i2++) {
                    const float * qg  = qa + ((size_t) head * n_q + i2 / n_tok) * hd;
                    float         mag = 0;
                    for (int c = 0; c < hd; c++) {
                        mag += fabsf(qg[c]) * 20;
                    }
                    ok = fabsf(sa[(size_t) head * n_q * n_tok + i2] - ref_s[i2]) <= 2e-5f * mag + 1e-4f;
                }
                for (int i2 = 0; i2 < n_q * hd && ok; i2++) {
                    ok = fabsf(oa[(size_t) head * n_q * hd + i2] - ref_o[i2]) <= 1e-4f * (1 + fabsf(ref_o[i2]));
                }
            }
            char what[160];
            snprintf(what, sizeof what, "%s all heads: bits %d hd %d n_kv %d n_q %d", NAMES[i], bits, hd, n_kv, n_q);
            check(ok, what);
        }
        free(qa); free(wa); free(sa); free(oa);
    }
    ggml_ext_kvquant_force(NULL);
    free(lo); free(hi); free(scale); free(K); free(V); free(pos); free(x); free(y); free(q); free(w);
    free(ref_s); free(got_s); free(ref_o); free(got_o);
    ggml_ext_kvquant_layer_free(L);
}

int main(void) {
    printf("implementations:");
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
        if (ggml_ext_kvquant_force(NAMES[i]) == 0) {
            printf(" %s", NAMES[i]);
        }
    }
    printf("\n");
    ggml_ext_kvquant_force(NULL);
    for (int bits = 2; bits <= 4; bits++) {
        run_case(bits, 2, 64, GGML_EXT_KVQUANT_ROPE_NEOX, 64, 3, 300, 0, 0);
        run_case(bits, 1, 128, GGML_EXT_KVQUANT_ROPE_NORM, 128, 1, 200, 1, 0);
    }
    run_case(4, 3, 64, GGML_EXT_KVQUANT_ROPE_NEOX, 32, 5, 257, 1, 1);   // partial rotation, 5 query heads, factors
    run_case(4, 1, 256, GGML_EXT_KVQUANT_ROPE_NEOX, 256, 4, 130, 0, 0);  // Gemma-3's head
    run_case(4, 2, 80, GGML_EXT_KVQUANT_ROPE_NORM, 80, 2, 50, 0, 0);     // head_dim 80: five steps of 8 pairs
    run_case(4, 2, 72, GGML_EXT_KVQUANT_ROPE_NORM, 72, 2, 50, 0, 0);     // head_dim 72: the scalar kernels run
    // bad configs are refused with a message
    struct ggml_ext_kvquant_config bad = { 5, 1, 64, 0, 0, 0, 2, 64, 10000, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL };
    char                       err[200] = "";
    check(ggml_ext_kvquant_layer_new(&bad, err, sizeof err) == NULL && err[0], "bits 5 refused");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
