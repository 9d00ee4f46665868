// Byte compatibility with llama.cpp: the pinned tree's own interleaved Q4_0 kernels
// (ggml/src/ggml-cpu/arch/{x86,arm}/repack.cpp, compiled unmodified and linked in) run on
// weights repacked by ggml_ext_repack_q4_0 and must give the matmul of the original Q4_0
// rows, and agree with our scalar reference; our scalar GEMM also reads the activations
// that upstream's own quantize_mat interleaved.
// Upstream kernels that fall back to its scalar code on this target are skipped (x86:
// only Q4_0_8_8 has SIMD kernels; Arm without SVE: Q4_0_4_4 and Q4_0_4_8; Arm with SVE
// run at 256-bit vectors: all three).
//
// The same for interleaved IQ4_NL (ggml_ext_repack_iq4_nl) against upstream's IQ4_NL
// kernels: iq4_nl_8x8 (x86 AVX2), iq4_nl_4x4 (Arm dotprod).
//
// usage: test_q4_0_upstream_compat LAYOUT[,LAYOUT...]   (4x4, 4x8, 8x8, iq4_nl_4x4, iq4_nl_8x8)
// Agreement: |upstream - ours| and |upstream - exact| <= (nb + 4) * 2^-22 * T, with
// T = sum |dw da w a| (all accumulate exact integer block sums, in different float orders).
// Prints "N passed, M failed"; exits 1 on any failure.

#include "formats/interleaved4/interleaved4_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

// ---- from the pinned tree's arch/*/repack.cpp (extern "C" there). Weak: a target whose
// upstream object has no SIMD kernel for a layout leaves it out (x86: 4x4 and 4x8).
#define WEAK __attribute__((weak))
WEAK void ggml_gemv_q4_0_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemv_q4_0_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemv_q4_0_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemm_q4_0_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemm_q4_0_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemm_q4_0_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemv_iq4_nl_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemm_iq4_nl_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemv_iq4_nl_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_gemm_iq4_nl_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
WEAK void ggml_quantize_mat_q8_0_4x4(const float * x, void * vy, int64_t k);
WEAK void ggml_quantize_mat_q8_0_4x8(const float * x, void * vy, int64_t k);

// ---- what the upstream object refers to: ggml's fp16 tables, and on Arm without SVE the
// scalar Q4_0_8_8 kernels of upstream's repack.cpp (not linked here), whose semantics are
// our scalar reference's. The Q4_0_8_8 layout is not checked on such builds.
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[1 << 8];

void ggml_gemv_q4_0_8x8_q8_0_generic(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void ggml_gemm_q4_0_8x8_q8_0_generic(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);

static int n_generic_calls;  // printed: 0 proves upstream's own SIMD 8x8 code ran

void ggml_gemv_q4_0_8x8_q8_0_generic(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    n_generic_calls++;
    ggml_ext_interleaved4_impl_get(0)->gemv[GGML_EXT_INTERLEAVED4_Q4_0][GGML_EXT_INTERLEAVED4_8X8](n, s, bs, vx, vy, nr, nc);
}

void ggml_gemm_q4_0_8x8_q8_0_generic(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    n_generic_calls++;
    ggml_ext_interleaved4_impl_get(0)->gemm[GGML_EXT_INTERLEAVED4_Q4_0][GGML_EXT_INTERLEAVED4_8X8](n, s, bs, vx, vy, nr, nc);
}

#if defined(__ARM_FEATURE_SVE)
#    include <arm_sve.h>
// ggml-cpu's SVE vector length in bytes: upstream's Q4_0_8_8 kernels run their SVE code
// only where it is 32 (QK8_0), as ours do.
int ggml_cpu_get_sve_cnt(void);

int ggml_cpu_get_sve_cnt(void) {
    return (int) svcntb();
}
#endif

static ggml_ext_interleaved4_mm_fn const up_gemv[3] = { ggml_gemv_q4_0_4x4_q8_0, ggml_gemv_q4_0_4x8_q8_0, ggml_gemv_q4_0_8x8_q8_0 };
static const ggml_ext_interleaved4_mm_fn up_gemm[3] = { ggml_gemm_q4_0_4x4_q8_0, ggml_gemm_q4_0_4x8_q8_0, ggml_gemm_q4_0_8x8_q8_0 };
static ggml_ext_interleaved4_mm_fn const up_gemv_iq4[3] = { ggml_gemv_iq4_nl_4x4_q8_0, NULL, ggml_gemv_iq4_nl_8x8_q8_0 };
static ggml_ext_interleaved4_mm_fn const up_gemm_iq4[3] = { ggml_gemm_iq4_nl_4x4_q8_0, NULL, ggml_gemm_iq4_nl_8x8_q8_0 };

static int n_passed, n_failed;

static uint64_t rng_state = 12345;

static float rndf(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float) ((double) (rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void * xmalloc(size_t n) {
    void * p = malloc(n);
    if (!p) {
        exit(2);
    }
    return p;
}

static int nibble(const ggml_ext_block_q4_0 * b, int k) {
    return (k < 16 ? (b->qs[k] & 0x0f) : (b->qs[k - 16] >> 4)) - 8;
}

static int weight(int fam, const ggml_ext_block_q4_0 * b, int k) {
    return fam ? ggml_ext_kvalues_iq4nl[nibble(b, k) + 8] : nibble(b, k);
}

// activation byte k of row r in an interleaved group (chunk B)
static int8_t act_x4(const ggml_ext_block_q8_0x4 * blk, int B, int r, int k) {
    return blk->qs[((k / B) * 4 + r) * B + k % B];
}

// One shape: nc weight rows, nr activation rows, nb blocks. GEMV on every row, GEMM on all.
static void check_shape(int fam, int L, int nb, int nc, int nr) {
    const int B = L == 0 ? 4 : 8, K = 32 * nb;
    float *   xw = xmalloc((size_t) nc * K * sizeof(float)), *xa = xmalloc((size_t) nr * K * sizeof(float));
    for (int i = 0; i < nc * K; i++) {
        xw[i] = rndf() * (i % 61 == 0 ? 9.0f : 1.0f);
    }
    for (int i = 0; i < nr * K; i++) {
        xa[i] = rndf() * (float) (1 + i % 7);
    }
    ggml_ext_block_q4_0 *   w  = xmalloc((size_t) nc * nb * sizeof(*w));
    uint8_t *               wi = xmalloc((size_t) nc * nb * sizeof(*w));
    ggml_ext_block_q8_0 *   a  = xmalloc((size_t) nr * nb * sizeof(*a));
    ggml_ext_block_q8_0x4 * ax = xmalloc((size_t) nr / 4 * nb * sizeof(*ax));
    float *                 so = xmalloc((size_t) nr * nc * sizeof(float)), *su = xmalloc((size_t) nr * nc * sizeof(float));
    ggml_ext_quantize_row_q4_0_ref(xw, w, (int64_t) nc * K);
    if (fam) {  // IQ4_NL: the same deltas / 16, random nibbles
        for (int i = 0; i < nc * nb; i++) {
            w[i].d = ggml_ext_fp32_to_fp16(ggml_ext_fp16_to_fp32(w[i].d) / 16);
            for (int j = 0; j < 16; j++) {
                rndf();
                w[i].qs[j] = (uint8_t) (rng_state >> 24);
            }
        }
        ggml_ext_repack_iq4_nl((enum ggml_ext_interleaved4_layout) L, wi, w, nc, K);
    } else {
        ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) L, wi, w, nc, K);
    }
    ggml_ext_quantize_row_q8_0_ref(xa, a, (int64_t) nr * K);
    for (int t = 0; t < nr / 4; t++) {  // upstream's own activation interleaving
        (B == 4 ? ggml_quantize_mat_q8_0_4x4 : ggml_quantize_mat_q8_0_4x8)(xa + (size_t) 4 * t * K, ax + (size_t) t * nb, K);
    }
    const struct ggml_ext_interleaved4_impl * gen = ggml_ext_interleaved4_impl_get(0);
    for (int gemm = 0; gemm < 2; gemm++) {
        const void * act = gemm ? (const void *) ax : (const void *) a;
        for (int i = 0; i < nr * nc; i++) {
            so[i] = su[i] = NAN;
        }
        if (fam) {
            (gemm ? gen->gemm[1][L] : gen->gemv[1][L])(K, so, (size_t) nc, wi, act, nr, nc);
        } else {
            (gemm ? gen->gemm[0][L] : gen->gemv[0][L])(K, so, (size_t) nc, wi, act, nr, nc);
        }
        if (gemm) {
            (fam ? up_gemm_iq4 : up_gemm)[L](K, su, (size_t) nc, wi, act, nr, nc);
        } else {
            for (int y = 0; y < nr; y++) {  // upstream's GEMV: one activation row per call
                (fam ? up_gemv_iq4 : up_gemv)[L](K, su + (size_t) y * nc, (size_t) nc, wi, a + (size_t) y * nb, 1, nc);
            }
        }
        int bad = 0;
        for (int y = 0; y < nr; y++) {
            for (int c = 0; c < nc; c++) {
                double t = 0, e = 0;  // bound, and the exact value from the unpacked Q4_0 rows
                for (int b = 0; b < nb; b++) {
                    const ggml_ext_block_q4_0 * wb = &w[(size_t) c * nb + b];
                    const ggml_ext_fp16_t da = gemm ? ax[(size_t) (y / 4) * nb + b].d[y % 4] : a[(size_t) y * nb + b].d;
                    long sa = 0, sd = 0;
                    for (int k = 0; k < 32; k++) {
                        const int8_t q = gemm ? act_x4(&ax[(size_t) (y / 4) * nb + b], B, y % 4, k) : a[(size_t) y * nb + b].qs[k];
                        sa += labs((long) weight(fam, wb, k) * q);
                        sd += (long) weight(fam, wb, k) * q;
                    }
                    const double sc = (double) ggml_ext_fp16_to_fp32(wb->d) * ggml_ext_fp16_to_fp32(da);
                    t += fabs(sc) * (double) sa;
                    e += sc * (double) sd;
                }
                const double bound = (nb + 4) * ldexp(t, -22);
                const double u     = su[(size_t) y * nc + c];
                bad += !(fabs((double) so[(size_t) y * nc + c] - u) <= bound) || !(fabs(u - e) <= bound);
            }
        }
        if (bad) {
            n_failed++;
            fprintf(stderr, "FAIL: upstream %s %s%s nb=%d nc=%d nr=%d: %d outputs disagree with ours or the exact matmul\n",
                    gemm ? "gemm" : "gemv", fam ? "iq4_nl " : "", L == 0 ? "4x4" : L == 1 ? "4x8" : "8x8", nb, nc, nr, bad);
        } else {
            n_passed++;
        }
    }
    free(xw);
    free(xa);
    free(w);
    free(wi);
    free(a);
    free(ax);
    free(so);
    free(su);
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s LAYOUT[,LAYOUT...] (4x4, 4x8, 8x8, iq4_nl_4x4, iq4_nl_8x8)\n", argv[0]);
        return 2;
    }
    for (int h = 0; h < (1 << 16); h++) {
        ggml_table_f32_f16[h] = ggml_ext_fp16_to_fp32((ggml_ext_fp16_t) h);
    }
    static const char * names[6] = { "4x4", "4x8", "8x8", "iq4_nl_4x4", "iq4_nl_4x8", "iq4_nl_8x8" };
    static const int    nbs[]    = { 1, 3, 17, 129 };
    for (int F = 0; F < 6; F++) {
        const int fam = F / 3, L = F % 3;
        int       wanted = 0;  // exact comma-separated names
        for (const char * p = argv[1]; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
            const size_t n = strlen(names[F]);
            wanted |= !strncmp(p, names[F], n) && (p[n] == ',' || p[n] == '\0');
        }
        if (!wanted) {
            continue;
        }
        const int N = L == 2 ? 8 : 4;
        if (!(fam ? up_gemv_iq4 : up_gemv)[L] || !(fam ? up_gemm_iq4 : up_gemm)[L] ||
            !(L == 0 ? ggml_quantize_mat_q8_0_4x4 : ggml_quantize_mat_q8_0_4x8)) {
            n_failed++;
            fprintf(stderr, "FAIL: the upstream object has no %s kernels on this target\n", names[F]);
            continue;
        }
        for (int i = 0; i < 4; i++) {
            // column counts around upstream's 16-column and row counts around its 16-row tiles
            check_shape(fam, L, nbs[i], N * (1 + i) + (i % 2 ? 16 : 0), 4 * (1 + i) + (i >= 2 ? 16 : 0));
        }
    }
    printf("upstream 8x8 scalar fallback calls: %d\n", n_generic_calls);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed || !n_passed ? 1 : 0;
}
