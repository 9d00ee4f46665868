// The any-precision GEMV kernels against their scalar twin (and the twin against a double-precision
// dot product of the dequantized rows): every compiled-in kernel (AVX2 and AVX-512 on x86, NEON on aarch64) and the
// dispatcher, for every precision 1..8 of parents up to 8, several row lengths and row ranges.
// Prints "kernel <name>" and "ok <cases>"; exits 1 on the first mismatch.
#include "common/fp16.h"
#include "formats/anyprec/anyprec_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t) (rng_state >> 33);
}

static float rndf(void) { return (float) ((double) rnd() / 2147483648.0 - 1.0); }

static int check(const char * name, ggml_ext_anyprec_gemv_fn fn, const uint8_t * planes, const ggml_ext_fp16_t * tables,
                 int64_t r0, int64_t nr, int64_t n_rows, int64_t k, int seed, int bits, const float * x) {
    float * want = malloc(sizeof(float) * (size_t) nr);
    float * got  = malloc(sizeof(float) * (size_t) nr);
    float * deq  = malloc(sizeof(float) * (size_t) (nr * k));
    int     bad  = 0;
    if (ggml_ext_anyprec_gemv_ref(planes, tables, r0, nr, n_rows, k, seed, bits, x, want) != 0 ||
        fn(planes, tables, r0, nr, n_rows, k, seed, bits, x, got) != 0 ||
        ggml_ext_anyprec_dequantize(planes, tables, r0, nr, n_rows, k, seed, 8, bits, deq) != 0) {
        fprintf(stderr, "%s: refused k=%lld bits=%d\n", name, (long long) k, bits);
        bad = 1;
    }
    for (int64_t r = 0; r < nr && !bad; r++) {
        double dot = 0.0, mag = 0.0;
        for (int64_t j = 0; j < k; j++) {
            dot += (double) deq[r * k + j] * (double) x[j];
            mag += fabs((double) deq[r * k + j] * (double) x[j]);
        }
        const double tol = 1e-5 * mag + 1e-30;
        if (fabs((double) want[r] - dot) > tol || fabs((double) got[r] - (double) want[r]) > tol) {
            fprintf(stderr, "%s: row %lld k=%lld seed=%d bits=%d: ref %.9g %s %.9g exact %.9g\n", name,
                    (long long) (r0 + r), (long long) k, seed, bits, want[r], name, got[r], dot);
            bad = 1;
        }
    }
    free(want);
    free(got);
    free(deq);
    return bad;
}

// a kernel's several-token GEMV over n_tok rows against its one-row GEMV per row: equal bit for bit
static int check_tokens(const char * name, ggml_ext_anyprec_gemv_fn one, ggml_ext_anyprec_gemv_tokens_fn many,
                        const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr, int64_t n_rows,
                        int64_t k, int seed, int bits, const float * xall, int n_tok) {
    const float * xs[8];
    float *       ys[8];
    float *       want = malloc(sizeof(float) * (size_t) (nr * n_tok));
    float *       got  = malloc(sizeof(float) * (size_t) (nr * n_tok));
    int           bad  = 0;
    for (int t = 0; t < n_tok; t++) {
        xs[t] = xall + (int64_t) t * k;
        ys[t] = got + (int64_t) t * nr;
        bad   = bad || one(planes, tables, r0, nr, n_rows, k, seed, bits, xs[t], want + t * nr) != 0;
    }
    bad = bad || many(planes, tables, r0, nr, n_rows, k, seed, bits, n_tok, xs, ys) != 0;
    for (int64_t i = 0; i < nr * n_tok && !bad; i++) {
        if (memcmp(&want[i], &got[i], sizeof(float)) != 0) {
            fprintf(stderr, "%s tokens: row %lld of token %lld, k=%lld seed=%d bits=%d n_tok=%d: %.9g, one row at a time %.9g\n",
                    name, (long long) (r0 + i % nr), (long long) (i / nr), (long long) k, seed, bits, n_tok, got[i], want[i]);
            bad = 1;
        }
    }
    free(want);
    free(got);
    return bad;
}

int main(void) {
    struct {
        const char *         name;
        ggml_ext_anyprec_gemv_fn fn;
    } kernels[] = {
        { "dispatch", ggml_ext_anyprec_gemv },
#if defined(GGML_EXT_HAVE_AVX2)
        { "avx2", ggml_ext_anyprec_gemv_avx2 },
#endif
#if defined(GGML_EXT_HAVE_AVX512)
        { "avx512", ggml_ext_anyprec_gemv_avx512 },
#endif
#if defined(GGML_EXT_HAVE_NEON)
        { "neon", ggml_ext_anyprec_gemv_neon },
#endif
    };
    const int nk = (int) (sizeof(kernels) / sizeof(kernels[0]));
    struct {
        const char *                    name;
        ggml_ext_anyprec_gemv_fn        one;
        ggml_ext_anyprec_gemv_tokens_fn many;
    } tokens[] = {
        { "dispatch", ggml_ext_anyprec_gemv, ggml_ext_anyprec_gemv_tokens },
#if defined(GGML_EXT_HAVE_AVX2)
        { "avx2", ggml_ext_anyprec_gemv_avx2, ggml_ext_anyprec_gemv_tokens_avx2 },
#endif
#if defined(GGML_EXT_HAVE_AVX512)
        { "avx512", ggml_ext_anyprec_gemv_avx512, ggml_ext_anyprec_gemv_tokens_avx512 },
#endif
#if defined(GGML_EXT_HAVE_NEON)
        { "neon", ggml_ext_anyprec_gemv_neon, ggml_ext_anyprec_gemv_tokens_neon },
#endif
    };
    const int nt = (int) (sizeof(tokens) / sizeof(tokens[0]));
    for (int i = 0; i < nk; i++) {
        printf("kernel %s\n", kernels[i].name);
    }
    printf("dispatch runs %s\n", ggml_ext_anyprec_gemv_name());
    const int64_t ks[]  = { 32, 96, 576, 1536 };
    const int64_t n_rows = 9;
    int           cases  = 0;
    for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
        const int64_t k = ks[ki];
        for (int seed = 1; seed <= 8; seed++) {
            const size_t      np     = ggml_ext_anyprec_planes_size(8, n_rows, k);
            const int64_t     ntab   = n_rows * ggml_ext_anyprec_row_table_len(seed, 8);
            uint8_t *         planes = malloc(np);
            ggml_ext_fp16_t * tables = malloc(sizeof(ggml_ext_fp16_t) * (size_t) ntab);
            float *           x      = malloc(sizeof(float) * (size_t) k * 8);  // 8 activation rows
            for (size_t j = 0; j < np; j++) {
                planes[j] = (uint8_t) rnd();
            }
            for (int64_t j = 0; j < ntab; j++) {
                tables[j] = ggml_ext_fp32_to_fp16(rndf() * 0.1f);
            }
            for (int64_t j = 0; j < k * 8; j++) {
                x[j] = rndf() * 4.0f;
            }
            for (int bits = seed; bits <= 8; bits++) {
                for (int i = 0; i < nk; i++) {
                    if (check(kernels[i].name, kernels[i].fn, planes, tables, 0, n_rows, n_rows, k, seed, bits, x) ||
                        check(kernels[i].name, kernels[i].fn, planes, tables, 3, 4, n_rows, k, seed, bits, x)) {
                        return 1;
                    }
                    cases += 2;
                }
                for (int i = 0; i < nt; i++) {
                    for (int n_tok = 1; n_tok <= 8; n_tok++) {
                        if (check_tokens(tokens[i].name, tokens[i].one, tokens[i].many, planes, tables, 0, n_rows,
                                         n_rows, k, seed, bits, x, n_tok) ||
                            check_tokens(tokens[i].name, tokens[i].one, tokens[i].many, planes, tables, 3, 4, n_rows,
                                         k, seed, bits, x, n_tok)) {
                            return 1;
                        }
                        cases += 2;
                    }
                }
            }
            free(planes);
            free(tables);
            free(x);
        }
    }
    // refused arguments
    float y;
    float *       yp = &y;
    const float * xp = NULL;
    if (ggml_ext_anyprec_gemv(NULL, NULL, 0, 1, 1, 40, 3, 3, NULL, &y) != -1 ||
        ggml_ext_anyprec_gemv(NULL, NULL, 0, 1, 1, 32, 4, 3, NULL, &y) != -1 ||
        ggml_ext_anyprec_gemv_tokens(NULL, NULL, 0, 1, 1, 40, 3, 3, 1, &xp, &yp) != -1 ||
        ggml_ext_anyprec_gemv_tokens(NULL, NULL, 0, 1, 1, 32, 4, 3, 1, &xp, &yp) != -1) {
        fprintf(stderr, "bad arguments were not refused\n");
        return 1;
    }
    printf("ok %d\n", cases);
    return 0;
}
