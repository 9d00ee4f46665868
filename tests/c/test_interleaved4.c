// Tests of the interleaved Q4_0 and IQ4_NL families (ggml_ext/src/q4_0_interleaved*,
// iq4_nl_interleaved.h; fam 0 and 1 below): every compiled-in
// SIMD kernel against the scalar reference on many shapes (odd block counts, more blocks
// than one x86 chunk, output strides), layout transforms against docs/formats/interleaved4.md, repack round
// trips, refused shapes, and optionally ggml's own Q4_0/Q8_0 output (--ggml-fixture FILE,
// written by tests/kernels/test_interleaved4_kernels.py through libggml-base).
//
// Tolerance of a GEMV/GEMM output y against the exact value (in double) of the same
// quantized weights and activations: |y - exact| <= (nb + 4) * 2^-23 * T, where
// T = sum over blocks of |dw * da| * sum_k |w_k * a_k|: nb float additions and two
// roundings per block term, each at most 2^-24 relative to a partial sum bounded by T,
// with a factor 2 of margin. Integer dot products are exact in every implementation,
// which the "exact" data (power-of-two deltas, small activations: every float operation
// exact) checks bit for bit against the scalar reference.
//
// Prints "N passed, M failed"; exits 1 on any failure.

#include "formats/interleaved4/interleaved4_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__F16C__)
#    include <immintrin.h>
#endif
#if defined(__aarch64__)
#    include <arm_neon.h>
#endif

static int n_passed, n_failed;

static void check(int ok, const char * fmt, ...) {
    if (ok) {
        n_passed++;
        return;
    }
    n_failed++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

// ---------------------------------------------------------------- helpers

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) {  // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rndf(void) {  // uniform in [-1, 1)
    return (float) ((double) (rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float rnd_gauss(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        s += rndf();
    }
    return s;
}

static void * xmalloc(size_t n) {
    void * p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

// Compiled in and runnable on this CPU (SVE-256 code is not, with other vector lengths).
static int usable(const struct ggml_ext_interleaved4_impl * im) {
    return !im->usable || im->usable();
}

static const int LN[3] = { 4, 4, 8 };
static const int LB[3] = { 4, 8, 8 };
static const char * LNAME[3] = { "4x4", "4x8", "8x8" };

// Independent of the library: where byte j of row r's block lands, per docs/formats/interleaved4.md.
static size_t interleaved_offset(int N, int B, int r, int j) {
    return (size_t) N * 2 + (size_t) ((j / B) * N + r) * B + j % B;
}

// Activations for GEMM, from four Q8_0 rows, per the header's description.
static void interleave_q8_0(const ggml_ext_block_q8_0 * rows, int nb, int B, ggml_ext_block_q8_0x4 * out) {
    for (int b = 0; b < nb; b++) {
        for (int r = 0; r < 4; r++) {
            out[b].d[r] = rows[(size_t) r * nb + b].d;
            for (int j = 0; j < 32; j++) {
                out[b].qs[((j / B) * 4 + r) * B + j % B] = rows[(size_t) r * nb + b].qs[j];
            }
        }
    }
}

// ---------------------------------------------------------------- fp16

static uint16_t hw_fp32_to_fp16(float f, int * have) {
#if defined(__F16C__)
    *have = 1;
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#elif defined(__aarch64__)
    *have = 1;
    return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(f))), 0);
#else
    *have = 0;
    (void) f;
    return 0;
#endif
}

static void test_fp16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = ggml_ext_fp16_to_fp32((uint16_t) h);
        if (isnan(f)) {
            bad += ((h >> 10) & 0x1f) != 0x1f || (h & 0x3ff) == 0;
            continue;
        }
        bad += ggml_ext_fp32_to_fp16(f) != h;
    }
    check(bad == 0, "fp16 -> fp32 -> fp16 round trip: %d mismatches", bad);

    int have = 0;
    hw_fp32_to_fp16(1.0f, &have);
    if (!have) {
        return;
    }
    int mism = 0;
    for (int i = 0; i < 400000; i++) {
        uint32_t x = (uint32_t) rnd();
        if (i & 1) {  // concentrate on the half-precision range and its rounding edges
            x = (x & 0x80001fffu) | ((uint32_t) (100 + rnd() % 48) << 23) | ((uint32_t) (rnd() % 1024) << 13);
        }
        float f;
        memcpy(&f, &x, sizeof(f));
        if (isnan(f)) {
            continue;
        }
        mism += ggml_ext_fp32_to_fp16(f) != hw_fp32_to_fp16(f, &have);
    }
    check(mism == 0, "fp32 -> fp16 vs hardware: %d mismatches", mism);
}

// ---------------------------------------------------------------- Q4_0 / Q8_0 reference

static void test_reference_quantizers(void) {
    // max-magnitude value -5 at index 3: d = -5 / -8 = 0.625, q = round(x / d) + 8
    float x[32] = { 0 };
    x[0]  = 1.25f;   // 2 -> 10
    x[3]  = -5.0f;   // -8 -> 0
    x[16] = 4.375f;  // 7 -> 15
    x[17] = 5.0f;    // 8 -> 16 clamps to 15
    ggml_ext_block_q4_0 y;
    ggml_ext_quantize_row_q4_0_ref(x, &y, 32);
    check(ggml_ext_fp16_to_fp32(y.d) == 0.625f, "q4_0 d = %g", ggml_ext_fp16_to_fp32(y.d));
    check(y.qs[0] == (10 | 15 << 4) && y.qs[1] == (8 | 15 << 4) && y.qs[3] == (0 | 8 << 4),
          "q4_0 nibbles %02x %02x %02x", y.qs[0], y.qs[1], y.qs[3]);

    float z[32] = { 0 };
    ggml_ext_quantize_row_q4_0_ref(z, &y, 32);
    int zero_ok = ggml_ext_fp16_to_fp32(y.d) == 0.0f;  // -0.0: max / -8 with max = 0, as ggml
    for (int j = 0; j < 16; j++) {
        zero_ok &= y.qs[j] == 0x88;
    }
    check(zero_ok, "q4_0 of zeros: d 0, all nibbles 8");

    for (int j = 0; j < 32; j++) {  // amax 127: d = 1, ties round away from zero
        x[j] = (float) (j - 16) + 0.5f;
    }
    x[31] = 127.0f;
    ggml_ext_block_q8_0 q;
    ggml_ext_quantize_row_q8_0_ref(x, &q, 32);
    int tie_ok = ggml_ext_fp16_to_fp32(q.d) == 1.0f;
    for (int j = 0; j < 31; j++) {
        tie_ok &= q.qs[j] == (int8_t) (j - 16 + (j >= 16 ? 1 : 0));
    }
    check(tie_ok && q.qs[31] == 127, "q8_0 rounds ties away from zero");
}

// --ggml-fixture: int64 n, n floats, ggml's Q4_0 (n/32 * 18 bytes), ggml's dequantized Q4_0
// (n floats), ggml's Q8_0 (n/32 * 34 bytes), all made by libggml-base from the floats.
static void test_ggml_fixture(const char * path) {
    FILE * f = fopen(path, "rb");
    check(f != NULL, "open fixture %s", path);
    if (!f) {
        return;
    }
    int64_t n = 0;
    int     ok = fread(&n, sizeof(n), 1, f) == 1 && n > 0 && n % 32 == 0;
    const int64_t nb = ok ? n / 32 : 0;
    float * x = xmalloc((size_t) n * sizeof(float));
    ggml_ext_block_q4_0 * q4 = xmalloc((size_t) nb * sizeof(*q4));
    float * dq = xmalloc((size_t) n * sizeof(float));
    ggml_ext_block_q8_0 * q8 = xmalloc((size_t) nb * sizeof(*q8));
    ok = ok && fread(x, sizeof(float), (size_t) n, f) == (size_t) n && fread(q4, sizeof(*q4), (size_t) nb, f) == (size_t) nb &&
         fread(dq, sizeof(float), (size_t) n, f) == (size_t) n && fread(q8, sizeof(*q8), (size_t) nb, f) == (size_t) nb;
    fclose(f);
    check(ok, "read fixture %s", path);
    if (ok) {
        ggml_ext_block_q4_0 * mq4 = xmalloc((size_t) nb * sizeof(*mq4));
        ggml_ext_block_q8_0 * mq8 = xmalloc((size_t) nb * sizeof(*mq8));
        float *               mdq = xmalloc((size_t) n * sizeof(float));
        ggml_ext_quantize_row_q4_0_ref(x, mq4, n);
        ggml_ext_dequantize_row_q4_0(q4, mdq, n);
        ggml_ext_quantize_row_q8_0_ref(x, mq8, n);
        int64_t first = -1;
        for (int64_t b = 0; b < nb && first < 0; b++) {
            if (memcmp(&mq4[b], &q4[b], sizeof(*q4)) != 0) {
                first = b;
            }
        }
        check(first < 0, "Q4_0 identical to ggml's quantize_row_q4_0_ref on %lld blocks (first differing block %lld)",
              (long long) nb, (long long) first);
        // bit for bit, except that NaNs (0 * inf from deltas that overflow fp16) only need to
        // be NaN: their sign is the CPU's (x86 makes -NaN, Arm +NaN)
        int64_t dq_bad = 0;
        for (int64_t i = 0; i < n; i++) {
            dq_bad += isnan(mdq[i]) ? !isnan(dq[i]) : memcmp(&mdq[i], &dq[i], sizeof(float)) != 0;
        }
        check(dq_bad == 0, "Q4_0 dequantize identical to ggml's (%lld differ)", (long long) dq_bad);
        check(memcmp(mq8, q8, (size_t) nb * sizeof(*q8)) == 0, "Q8_0 identical to ggml's quantize_row_q8_0_ref");
        // and every compiled-in activation quantizer gives the same Q8_0 bytes
        for (int i = 1; i < ggml_ext_interleaved4_impl_count(); i++) {
            const struct ggml_ext_interleaved4_impl * im = ggml_ext_interleaved4_impl_get(i);
            if (im->quantize_row_q8_0 && usable(im)) {
                memset(mq8, 0, (size_t) nb * sizeof(*mq8));
                im->quantize_row_q8_0(x, mq8, n);
                check(memcmp(mq8, q8, (size_t) nb * sizeof(*q8)) == 0, "%s Q8_0 identical to ggml's", im->name);
            }
        }
        printf("ggml fixture: %lld blocks compared\n", (long long) nb);
        free(mq4);
        free(mq8);
        free(mdq);
    }
    free(x);
    free(q4);
    free(dq);
    free(q8);
}

// ---------------------------------------------------------------- layout transforms

static void random_q4_0(ggml_ext_block_q4_0 * b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        b[i].d = ggml_ext_fp32_to_fp16(rndf());
        for (int j = 0; j < 16; j++) {
            b[i].qs[j] = (uint8_t) rnd();
        }
    }
}

static void test_layouts(void) {
    static const int rows_mult[] = { 1, 2, 3, 5 };
    static const int ncols_list[] = { 32, 96, 224, 544 };
    for (int L = 0; L < 3; L++) {
        const int N = LN[L], B = LB[L];
        const struct ggml_ext_interleaved4_layout_traits * tr = ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, (enum ggml_ext_interleaved4_layout) L);
        check(tr && tr->nrows == N && tr->chunk == B && tr->block_size == (size_t) N * 18 && tr->type_id == 31 + L &&
                  tr->gemv && tr->gemm && tr->quantize_mat,
              "%s traits", LNAME[L]);
        for (int ri = 0; ri < 4; ri++) {
            for (int ci = 0; ci < 4; ci++) {
                const int64_t nrows = (int64_t) rows_mult[ri] * N, ncols = ncols_list[ci], nb = ncols / 32;
                const size_t  nblk  = (size_t) (nrows * nb);
                ggml_ext_block_q4_0 * src  = xmalloc(nblk * sizeof(*src));
                ggml_ext_block_q4_0 * back = xmalloc(nblk * sizeof(*back));
                uint8_t *             il   = xmalloc(nblk * sizeof(*src));
                random_q4_0(src, nblk);
                const int rc = ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) L, il, src, nrows, ncols);
                // every byte where docs/formats/interleaved4.md puts it: deltas, then chunks, XOR 0x88
                int misplaced = 0;
                for (int64_t g = 0; g < nrows / N; g++) {
                    for (int64_t b = 0; b < nb; b++) {
                        const uint8_t * blk = il + (size_t) (g * nb + b) * N * 18;
                        for (int r = 0; r < N; r++) {
                            const ggml_ext_block_q4_0 * s = &src[(g * N + r) * nb + b];
                            misplaced += memcmp(blk + 2 * r, &s->d, 2) != 0;
                            for (int j = 0; j < 16; j++) {
                                misplaced += blk[interleaved_offset(N, B, r, j)] != (uint8_t) (s->qs[j] ^ 0x88);
                            }
                        }
                    }
                }
                const int rc2 = ggml_ext_unpack_q4_0((enum ggml_ext_interleaved4_layout) L, back, il, nrows, ncols);
                check(rc == 0 && rc2 == 0 && misplaced == 0 && memcmp(src, back, nblk * sizeof(*src)) == 0,
                      "%s repack %lldx%lld: layout as docs/formats/interleaved4.md (%d misplaced), lossless round trip", LNAME[L],
                      (long long) nrows, (long long) ncols, misplaced);

                // dequantize(interleaved) == dequantize(Q4_0); quantize_interleaved == repack(quantize)
                float * x   = xmalloc((size_t) (nrows * ncols) * sizeof(float));
                float * y0  = xmalloc((size_t) (nrows * ncols) * sizeof(float));
                float * y1  = xmalloc((size_t) (nrows * ncols) * sizeof(float));
                uint8_t * il2 = xmalloc(nblk * sizeof(*src));
                ggml_ext_dequantize_row_q4_0(src, y0, nrows * ncols);
                const int rc3 = ggml_ext_dequantize_q4_0_interleaved((enum ggml_ext_interleaved4_layout) L, il, y1, nrows, ncols);
                check(rc3 == 0 && memcmp(y0, y1, (size_t) (nrows * ncols) * sizeof(float)) == 0,
                      "%s dequantize(interleaved) == dequantize(Q4_0) %lldx%lld", LNAME[L], (long long) nrows,
                      (long long) ncols);
                for (int64_t i = 0; i < nrows * ncols; i++) {
                    x[i] = rnd_gauss() * (i % 97 == 0 ? 8.0f : 1.0f);
                }
                ggml_ext_quantize_row_q4_0_ref(x, src, nrows * ncols);
                ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) L, il, src, nrows, ncols);
                const int rc4 = ggml_ext_quantize_q4_0_interleaved((enum ggml_ext_interleaved4_layout) L, x, il2, nrows, ncols);
                check(rc4 == 0 && memcmp(il, il2, nblk * sizeof(*src)) == 0, "%s quantize_interleaved == repack(quantize) %lldx%lld",
                      LNAME[L], (long long) nrows, (long long) ncols);
                free(x);
                free(y0);
                free(y1);
                free(il2);
                free(src);
                free(back);
                free(il);
            }
        }

        // refused shapes leave the destination untouched
        ggml_ext_block_q4_0 src[64];
        uint8_t             dst[64 * 18];
        float               xf[64 * 32] = { 0 };
        random_q4_0(src, 64);
        const int64_t bad_rows[] = { 0, -N, N - 1, N + 1, N + N / 2, 2, 3 * N - 2 };
        for (size_t i = 0; i < sizeof(bad_rows) / sizeof(bad_rows[0]); i++) {
            const int64_t nrows = bad_rows[i];
            if (nrows > 0 && nrows % N == 0) {
                continue;
            }
            memset(dst, 0xa5, sizeof(dst));
            const int r1 = ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) L, dst, src, nrows, 32);
            const int r2 = ggml_ext_unpack_q4_0((enum ggml_ext_interleaved4_layout) L, (ggml_ext_block_q4_0 *) dst, src, nrows, 32);
            const int r3 = ggml_ext_quantize_q4_0_interleaved((enum ggml_ext_interleaved4_layout) L, xf, dst, nrows, 32);
            const int r4 = ggml_ext_dequantize_q4_0_interleaved((enum ggml_ext_interleaved4_layout) L, src, xf, nrows, 32);
            int untouched = 1;
            for (size_t k = 0; k < sizeof(dst); k++) {
                untouched &= dst[k] == 0xa5;
            }
            check(r1 == GGML_EXT_INTERLEAVED4_ERR_ROWS && r2 == r1 && r3 == r1 && r4 == r1 && untouched,
                  "%s refuses %lld rows", LNAME[L], (long long) nrows);
        }
        check(ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) L, dst, src, N, 48) == GGML_EXT_INTERLEAVED4_ERR_COLS &&
                  ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) L, dst, src, N, 0) == GGML_EXT_INTERLEAVED4_ERR_COLS,
              "%s refuses row lengths that are not a positive multiple of 32", LNAME[L]);
    }
    ggml_ext_block_q4_0 src[8];
    uint8_t             dst[8 * 18];
    check(ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) 3, dst, src, 8, 32) == GGML_EXT_INTERLEAVED4_ERR_LAYOUT &&
              ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, (enum ggml_ext_interleaved4_layout) 3) == NULL,
          "unknown layout refused");
}

// IQ4_NL: the same placement without XOR, round trips, dequantize through kvalues, refusals.
static void test_layouts_iq4_nl(void) {
    static const int8_t kv[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };
    check(memcmp(kv, ggml_ext_kvalues_iq4nl, 16) == 0, "IQ4_NL kvalues as docs/formats/interleaved4.md");
    for (int L = 0; L < 3; L++) {
        const int N = LN[L], B = LB[L];
        const struct ggml_ext_interleaved4_layout_traits * tr = ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_IQ4_NL, (enum ggml_ext_interleaved4_layout) L);
        char name[16];
        snprintf(name, sizeof(name), "IQ4_NL_%d_%d", N, B);
        check(tr && tr->nrows == N && tr->chunk == B && tr->block_size == (size_t) N * 18 && tr->type_id == 36 + L &&
                  !strcmp(tr->name, name) && tr->gemv && tr->gemm && tr->quantize_mat,
              "iq4_nl %s traits", LNAME[L]);
        const int64_t nrows = 3 * N, ncols = 224, nb = ncols / 32;
        const size_t  nblk  = (size_t) (nrows * nb);
        ggml_ext_block_iq4_nl * src  = xmalloc(nblk * sizeof(*src));
        ggml_ext_block_iq4_nl * back = xmalloc(nblk * sizeof(*src));
        uint8_t *               il   = xmalloc(nblk * sizeof(*src));
        float *                 y0   = xmalloc((size_t) (nrows * ncols) * sizeof(float));
        float *                 y1   = xmalloc((size_t) (nrows * ncols) * sizeof(float));
        random_q4_0(src, nblk);
        const int rc  = ggml_ext_repack_iq4_nl((enum ggml_ext_interleaved4_layout) L, il, src, nrows, ncols);
        int       misplaced = 0;
        for (int64_t g = 0; g < nrows / N; g++) {
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t * blk = il + (size_t) (g * nb + b) * N * 18;
                for (int r = 0; r < N; r++) {
                    const ggml_ext_block_iq4_nl * s = &src[(g * N + r) * nb + b];
                    misplaced += memcmp(blk + 2 * r, &s->d, 2) != 0;
                    for (int j = 0; j < 16; j++) {
                        misplaced += blk[interleaved_offset(N, B, r, j)] != s->qs[j];
                    }
                }
            }
        }
        const int rc2 = ggml_ext_unpack_iq4_nl((enum ggml_ext_interleaved4_layout) L, back, il, nrows, ncols);
        check(rc == 0 && rc2 == 0 && misplaced == 0 && memcmp(src, back, nblk * sizeof(*src)) == 0,
              "iq4_nl %s repack: layout as docs/formats/interleaved4.md, no XOR (%d misplaced), lossless round trip", LNAME[L], misplaced);
        int bad_dq = 0;
        for (size_t i = 0; i < nblk; i++) {  // dequantize against the table, independently
            float d = ggml_ext_fp16_to_fp32(src[i].d), v[32];
            ggml_ext_dequantize_row_iq4_nl(&src[i], v, 32);
            for (int j = 0; j < 16; j++) {
                bad_dq += v[j] != d * kv[src[i].qs[j] & 15] || v[j + 16] != d * kv[src[i].qs[j] >> 4];
            }
        }
        check(bad_dq == 0, "iq4_nl dequantize_row: %d values off d * kvalues[q]", bad_dq);
        ggml_ext_dequantize_row_iq4_nl(src, y0, nrows * ncols);
        const int rc3 = ggml_ext_dequantize_iq4_nl_interleaved((enum ggml_ext_interleaved4_layout) L, il, y1, nrows, ncols);
        check(rc3 == 0 && memcmp(y0, y1, (size_t) (nrows * ncols) * sizeof(float)) == 0,
              "iq4_nl %s dequantize(interleaved) == dequantize(IQ4_NL)", LNAME[L]);
        const int64_t bad_rows[] = { 0, -N, N - 1, N + 1, N + N / 2, 2, 3 * N - 2 };
        for (size_t i = 0; i < sizeof(bad_rows) / sizeof(bad_rows[0]); i++) {
            const int64_t nr = bad_rows[i];
            if (nr > 0 && nr % N == 0) {
                continue;
            }
            memset(il, 0xa5, nblk * sizeof(*src));
            const int r1 = ggml_ext_repack_iq4_nl((enum ggml_ext_interleaved4_layout) L, il, src, nr, 32);
            const int r2 = ggml_ext_unpack_iq4_nl((enum ggml_ext_interleaved4_layout) L, (ggml_ext_block_iq4_nl *) il, src, nr, 32);
            const int r3 = ggml_ext_dequantize_iq4_nl_interleaved((enum ggml_ext_interleaved4_layout) L, src, y0, nr, 32);
            int untouched = 1;
            for (size_t k = 0; k < nblk * sizeof(*src); k++) {
                untouched &= il[k] == 0xa5;
            }
            check(r1 == GGML_EXT_INTERLEAVED4_ERR_ROWS && r2 == r1 && r3 == r1 && untouched, "iq4_nl %s refuses %lld rows", LNAME[L],
                  (long long) nr);
        }
        check(ggml_ext_repack_iq4_nl((enum ggml_ext_interleaved4_layout) L, il, src, N, 48) == GGML_EXT_INTERLEAVED4_ERR_COLS,
              "iq4_nl %s refuses row lengths not a multiple of 32", LNAME[L]);
        free(src);
        free(back);
        free(il);
        free(y0);
        free(y1);
    }
    check(ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_IQ4_NL, (enum ggml_ext_interleaved4_layout) 3) == NULL, "iq4_nl unknown layout refused");
}

// ---------------------------------------------------------------- activation quantizers

static void test_activation_quantizers(void) {
    static const int nbs[] = { 1, 3, 8, 33 };
    const struct ggml_ext_interleaved4_impl * gen = ggml_ext_interleaved4_impl_get(0);
    for (int t = 0; t < 4; t++) {
        const int nb = nbs[t], k = 32 * nb;
        float *   x  = xmalloc((size_t) 4 * k * sizeof(float));
        for (int i = 0; i < 4 * k; i++) {
            x[i] = rnd_gauss() * (float) (1 << (i / 32 % 5));
        }
        for (int j = 0; j < 32; j++) {  // a block of exact ties (amax 127), a block of zeros
            x[j] = (float) (j % 2 ? 127 : (j - 16)) + (j % 2 ? 0.0f : 0.5f);
            x[k + j] = 0.0f;
        }
        ggml_ext_block_q8_0 *   rows  = xmalloc((size_t) 4 * nb * sizeof(*rows));
        ggml_ext_block_q8_0 *   rows2 = xmalloc((size_t) 4 * nb * sizeof(*rows));
        ggml_ext_block_q8_0x4 * m_ref = xmalloc((size_t) nb * sizeof(*m_ref));
        ggml_ext_block_q8_0x4 * m     = xmalloc((size_t) nb * sizeof(*m));
        gen->quantize_row_q8_0(x, rows, 4 * k);
        for (int B = 4; B <= 8; B += 4) {
            interleave_q8_0(rows, nb, B, m_ref);
            (B == 4 ? gen->quantize_mat_q8_0_4x4 : gen->quantize_mat_q8_0_4x8)(x, m, k);
            check(memcmp(m, m_ref, (size_t) nb * sizeof(*m)) == 0, "generic quantize_mat_q8_0_4x%d layout (nb %d)", B, nb);
        }
        for (int i = 1; i < ggml_ext_interleaved4_impl_count(); i++) {
            const struct ggml_ext_interleaved4_impl * im = ggml_ext_interleaved4_impl_get(i);
            if (!usable(im)) {
                continue;
            }
            if (im->quantize_row_q8_0) {
                memset(rows2, 0, (size_t) 4 * nb * sizeof(*rows2));
                im->quantize_row_q8_0(x, rows2, 4 * k);
                check(memcmp(rows, rows2, (size_t) 4 * nb * sizeof(*rows)) == 0, "%s quantize_row_q8_0 == generic (nb %d)",
                      im->name, nb);
            }
            for (int B = 4; B <= 8; B += 4) {
                ggml_ext_q8_0_x4_fn fn = B == 4 ? im->quantize_mat_q8_0_4x4 : im->quantize_mat_q8_0_4x8;
                if (fn) {
                    interleave_q8_0(rows, nb, B, m_ref);
                    memset(m, 0, (size_t) nb * sizeof(*m));
                    fn(x, m, k);
                    check(memcmp(m, m_ref, (size_t) nb * sizeof(*m)) == 0, "%s quantize_mat_q8_0_4x%d == generic (nb %d)",
                          im->name, B, nb);
                }
            }
        }
        free(x);
        free(rows);
        free(rows2);
        free(m_ref);
        free(m);
    }
}

// ---------------------------------------------------------------- GEMV / GEMM

typedef struct {
    int                     fam;           // 0: Q4_0, 1: IQ4_NL
    int                     L, nb, nc, nr;  // nr: activation rows (GEMM: multiple of 4)
    ggml_ext_block_q4_0 *   w;             // nc rows of nb Q4_0 blocks
    uint8_t *               wi;            // the same, interleaved
    ggml_ext_block_q8_0 *   a;             // nr rows of nb Q8_0 blocks
    ggml_ext_block_q8_0x4 * ax;            // the same, interleaved by 4 rows with the layout's B
    double *                exact, * bound;  // nr x nc
} problem;

static int nibble(const ggml_ext_block_q4_0 * b, int k) {
    return (k < 16 ? (b->qs[k] & 0x0f) : (b->qs[k - 16] >> 4)) - 8;
}

static int weight(int fam, const ggml_ext_block_q4_0 * b, int k) {  // the integer weight k of a block
    return fam ? ggml_ext_kvalues_iq4nl[nibble(b, k) + 8] : nibble(b, k);
}

static void problem_init(problem * p, int fam, int L, int nb, int nc, int nr, int exact_mode) {
    p->fam = fam, p->L = L, p->nb = nb, p->nc = nc, p->nr = nr;
    p->w     = xmalloc((size_t) nc * nb * sizeof(*p->w));
    p->wi    = xmalloc((size_t) nc * nb * sizeof(*p->w));
    p->a     = xmalloc((size_t) nr * nb * sizeof(*p->a));
    p->ax    = xmalloc((size_t) (nr / 4 + 1) * nb * sizeof(*p->ax));
    p->exact = xmalloc((size_t) nr * nc * sizeof(double));
    p->bound = xmalloc((size_t) nr * nc * sizeof(double));
    const int K = 32 * nb;
    if (exact_mode) {  // deltas 1 or 2, activations in [-15, 15] (long rows: [-7, 7]): every float sum exact
        // IQ4_NL weights reach 127: keep 4 * 127 * amax * 32 * nb below 2^24 (longest rows:
        // deltas 1, activations in [-1, 1])
        int       amax = nb > 512 ? 7 : 15;
        const int dvar = !fam || nb <= 1032 / 4;
        if (fam) {
            amax = dvar ? (1032 / nb < 15 ? 1032 / nb : 15) : 1;
        }
        for (int i = 0; i < nc * nb; i++) {
            p->w[i].d = ggml_ext_fp32_to_fp16(dvar && rnd() & 1 ? 2.0f : 1.0f);
            for (int j = 0; j < 16; j++) {
                p->w[i].qs[j] = (uint8_t) rnd();
            }
        }
        for (int i = 0; i < nr * nb; i++) {
            p->a[i].d = ggml_ext_fp32_to_fp16(dvar && rnd() & 1 ? 2.0f : 1.0f);
            for (int j = 0; j < 32; j++) {
                p->a[i].qs[j] = (int8_t) ((int) (rnd() % (2 * amax + 1)) - amax);
            }
        }
    } else {  // quantized Gaussian weights with outliers, activations of varying scale
        float * x = xmalloc((size_t) (nc > nr ? nc : nr) * K * sizeof(float));
        for (int i = 0; i < nc * K; i++) {
            x[i] = rnd_gauss() * (rnd() % 64 == 0 ? 20.0f : 1.0f) * (float) (1 + i / K % 3);
        }
        ggml_ext_quantize_row_q4_0_ref(x, p->w, (int64_t) nc * K);
        if (fam) {  // IQ4_NL: the same deltas, every nibble random (any byte is a valid IQ4_NL pair)
            for (int i = 0; i < nc * nb; i++) {
                p->w[i].d = ggml_ext_fp32_to_fp16(ggml_ext_fp16_to_fp32(p->w[i].d) / 16);
                for (int j = 0; j < 16; j++) {
                    p->w[i].qs[j] = (uint8_t) rnd();
                }
            }
        }
        for (int i = 0; i < nr * K; i++) {
            x[i] = rnd_gauss() * (float) (1 << (i / 32 % 4)) * (rnd() % 128 == 0 ? 30.0f : 1.0f);
        }
        ggml_ext_quantize_row_q8_0_ref(x, p->a, (int64_t) nr * K);
        free(x);
    }
    if (fam) {
        ggml_ext_repack_iq4_nl((enum ggml_ext_interleaved4_layout) L, p->wi, p->w, nc, K);
    } else {
        ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) L, p->wi, p->w, nc, K);
    }
    for (int t = 0; t < nr / 4; t++) {
        interleave_q8_0(p->a + (size_t) 4 * t * nb, nb, LB[L], p->ax + (size_t) t * nb);
    }
    for (int y = 0; y < nr; y++) {
        for (int c = 0; c < nc; c++) {
            double e = 0, t = 0;
            for (int b = 0; b < nb; b++) {
                const ggml_ext_block_q4_0 * wb = &p->w[(size_t) c * nb + b];
                const ggml_ext_block_q8_0 * ab = &p->a[(size_t) y * nb + b];
                const double                sc = (double) ggml_ext_fp16_to_fp32(wb->d) * ggml_ext_fp16_to_fp32(ab->d);
                long                        s = 0, sa = 0;
                for (int k = 0; k < 32; k++) {
                    s += weight(fam, wb, k) * ab->qs[k];
                    sa += labs((long) weight(fam, wb, k) * ab->qs[k]);
                }
                e += sc * (double) s;
                t += fabs(sc) * (double) sa;
            }
            p->exact[(size_t) y * nc + c] = e;
            p->bound[(size_t) y * nc + c] = (nb + 4) * ldexp(t, -23);
        }
    }
}

static void problem_free(problem * p) {
    free(p->w);
    free(p->wi);
    free(p->a);
    free(p->ax);
    free(p->exact);
    free(p->bound);
}

#define SENTINEL (-12345.678f)

// Runs fn into an output with row stride nc + 3 (gaps hold a sentinel) and checks it:
// against the exact result within the bound, against ref bit for bit if ref != NULL.
static void run_and_check(const problem * p, ggml_ext_interleaved4_mm_fn fn, int gemm, const float * ref, float * out,
                          const char * what) {
    const size_t bs = (size_t) p->nc + 3;
    for (size_t i = 0; i < (size_t) p->nr * bs; i++) {
        out[i] = SENTINEL;
    }
    fn(32 * p->nb, out, bs, p->wi, gemm ? (const void *) p->ax : (const void *) p->a, p->nr, p->nc);
    int    bad_tol = 0, bad_bits = 0, bad_gap = 0;
    double worst   = 0;
    for (int y = 0; y < p->nr; y++) {
        for (int c = 0; c < (int) bs; c++) {
            const float v = out[(size_t) y * bs + c];
            if (c >= p->nc) {
                bad_gap += v != SENTINEL;
                continue;
            }
            const double err = fabs((double) v - p->exact[(size_t) y * p->nc + c]);
            const double bnd = p->bound[(size_t) y * p->nc + c];
            bad_tol += !(err <= bnd);
            if (bnd > 0 && err / bnd > worst) {
                worst = err / bnd;
            }
            if (ref) {
                bad_bits += memcmp(&v, &ref[(size_t) y * bs + c], sizeof(v)) != 0;
            }
        }
    }
    check(bad_tol == 0 && bad_bits == 0 && bad_gap == 0,
          "%s %s nb=%d nc=%d nr=%d: %d outside tolerance (worst %.2f of bound), %d differ from generic, %d gap writes",
          what, gemm ? "gemm" : "gemv", p->nb, p->nc, p->nr, bad_tol, worst, bad_bits, bad_gap);
}

static void test_kernels(void) {
    // odd block counts, one block, more than one 128-block x86 GEMM chunk (129, 131, 257),
    // and a row longer than the 1024-block x86 GEMV chunk whose row groups exceed the
    // x86 GEMM column block (1100)
    static const int nbs[] = { 1, 2, 3, 5, 7, 17, 33, 64, 129, 131, 257, 1100 };
    char             what[96];
    for (int fam = 0; fam < 2; fam++)
    for (int L = 0; L < 3; L++) {
        const int N = LN[L];
        const char * F = fam ? "iq4_nl" : "q4_0";
        for (int exact_mode = 1; exact_mode >= 0; exact_mode--) {
            for (size_t ni = 0; ni < sizeof(nbs) / sizeof(nbs[0]); ni++) {
                const int nb = nbs[ni];
                const int nc = N * (1 + (int) (ni % 3));           // 1, 2 or 3 row groups
                // activation rows: one 4-row tile, and the 8- and 16-row tiles of the Arm GEMMs
                // with and without leftover 4-row tiles
                static const int nrs[] = { 4, 8, 12, 20, 36 };
                const int        nr    = nrs[ni % 5];
                problem   p;
                problem_init(&p, fam, L, nb, nc, nr, exact_mode);
                const size_t out_n = (size_t) nr * (nc + 3);
                float *      ref_v = xmalloc(out_n * sizeof(float));
                float *      ref_m = xmalloc(out_n * sizeof(float));
                float *      out   = xmalloc(out_n * sizeof(float));
                const struct ggml_ext_interleaved4_impl * gen = ggml_ext_interleaved4_impl_get(0);
                snprintf(what, sizeof(what), "generic %s %s %s", F, LNAME[L], exact_mode ? "exact" : "random");
                run_and_check(&p, gen->gemv[fam][L], 0, NULL, ref_v, what);
                run_and_check(&p, gen->gemm[fam][L], 1, NULL, ref_m, what);
                for (int i = 1; i < ggml_ext_interleaved4_impl_count(); i++) {
                    const struct ggml_ext_interleaved4_impl * im = ggml_ext_interleaved4_impl_get(i);
                    if (!usable(im)) {
                        continue;
                    }
                    snprintf(what, sizeof(what), "%s %s %s %s", im->name, F, LNAME[L], exact_mode ? "exact" : "random");
                    const ggml_ext_interleaved4_mm_fn gv = im->gemv[fam][L];
                    const ggml_ext_interleaved4_mm_fn gm = im->gemm[fam][L];
                    if (gv) {
                        run_and_check(&p, gv, 0, exact_mode ? ref_v : NULL, out, what);
                    }
                    if (gm) {
                        run_and_check(&p, gm, 1, exact_mode ? ref_m : NULL, out, what);
                    }
                }
                if (ni % 4 == 0) {  // the dispatched entry points
                    const struct ggml_ext_interleaved4_layout_traits * tr =
                        fam ? ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_IQ4_NL, (enum ggml_ext_interleaved4_layout) L)
                            : ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, (enum ggml_ext_interleaved4_layout) L);
                    snprintf(what, sizeof(what), "dispatched %s %s %s", F, LNAME[L], exact_mode ? "exact" : "random");
                    run_and_check(&p, tr->gemv, 0, exact_mode ? ref_v : NULL, out, what);
                    run_and_check(&p, tr->gemm, 1, exact_mode ? ref_m : NULL, out, what);
                }
                free(ref_v);
                free(ref_m);
                free(out);
                problem_free(&p);
            }
        }
    }
}

// The dispatch report (ggml_ext_q4_0_dispatched, ggml_ext_iq4_nl_dispatched and the public
// ggml_ext_dispatched_kernel) names the kernel that runs: the named implementation is usable
// here and has the entry, no better usable one has it (the rule of the dispatcher's table,
// best last), and its own entry gives the dispatched entry point's output bit for bit (random
// data, so implementations that sum in another order differ in the last bits).
static const struct ggml_ext_interleaved4_impl * impl_named(const char * name) {
    for (int i = 0; name && i < ggml_ext_interleaved4_impl_count(); i++) {
        if (!strcmp(ggml_ext_interleaved4_impl_get(i)->name, name)) {
            return ggml_ext_interleaved4_impl_get(i);
        }
    }
    return NULL;
}

static ggml_ext_interleaved4_mm_fn impl_entry(const struct ggml_ext_interleaved4_impl * im, int fam, int L, int gemm) {
    return gemm ? im->gemm[fam][L] : im->gemv[fam][L];
}

static void test_dispatch_report(void) {
    for (int fam = 0; fam < 2; fam++)
    for (int L = 0; L < 3; L++) {
        const enum ggml_ext_interleaved4_layout l = (enum ggml_ext_interleaved4_layout) L;
        const struct ggml_ext_interleaved4_layout_traits * tr = fam ? ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_IQ4_NL, l) : ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, l);
        problem p;
        problem_init(&p, fam, L, 33, 2 * LN[L], 8, 0);
        const size_t n    = (size_t) p.nr * (p.nc + 3);
        float *      got  = xmalloc(n * sizeof(float));
        float *      want = xmalloc(n * sizeof(float));
        for (int gemm = 0; gemm < 2; gemm++) {
            const char * name = fam ? ggml_ext_interleaved4_dispatched(GGML_EXT_INTERLEAVED4_IQ4_NL, l, gemm) : ggml_ext_interleaved4_dispatched(GGML_EXT_INTERLEAVED4_Q4_0, l, gemm);
            const char * pub  = ggml_ext_dispatched_kernel(tr->type_id, gemm);
            check(name && pub && !strcmp(name, pub), "%s %s: dispatched_kernel(%d) says %s, the family's report %s",
                  tr->name, gemm ? "gemm" : "gemv", tr->type_id, pub ? pub : "NULL", name ? name : "NULL");
            const struct ggml_ext_interleaved4_impl * im = impl_named(name);
            if (!im || !usable(im) || !impl_entry(im, fam, L, gemm)) {
                check(0, "%s %s: reported %s, which cannot run it here", tr->name, gemm ? "gemm" : "gemv",
                      name ? name : "NULL");
                continue;
            }
            int better = 0;
            for (int i = ggml_ext_interleaved4_impl_count() - 1; ggml_ext_interleaved4_impl_get(i) != im; i--) {
                better += usable(ggml_ext_interleaved4_impl_get(i)) && impl_entry(ggml_ext_interleaved4_impl_get(i), fam, L, gemm);
            }
            check(!better, "%s %s: reported %s, but a better usable implementation has the kernel", tr->name,
                  gemm ? "gemm" : "gemv", name);
            const void * act = gemm ? (const void *) p.ax : (const void *) p.a;
            memset(got, 0, n * sizeof(float));
            memset(want, 0, n * sizeof(float));
            (gemm ? tr->gemm : tr->gemv)(32 * p.nb, got, p.nc + 3, p.wi, act, p.nr, p.nc);
            impl_entry(im, fam, L, gemm)(32 * p.nb, want, p.nc + 3, p.wi, act, p.nr, p.nc);
            check(!memcmp(got, want, n * sizeof(float)), "%s %s: the dispatched entry point's output is not %s's",
                  tr->name, gemm ? "gemm" : "gemv", name);
        }
        free(got);
        free(want);
        problem_free(&p);
    }
    for (int t = 0; t < 64; t++) {  // every other type: no report
        if (!((t >= 31 && t <= 33) || (t >= 36 && t <= 38))) {
            check(!ggml_ext_dispatched_kernel(t, 0) && !ggml_ext_dispatched_kernel(t, 1),
                  "dispatched_kernel(%d) is not NULL", t);
        }
    }
}

// End to end: floats -> interleaved weights and Q8_0 activations through the public
// entry points, against a float matmul of the dequantized values.
static void test_end_to_end(void) {
    const int K = 32 * 40, M = 24, R = 8;
    float *   W = xmalloc((size_t) M * K * sizeof(float)), *X = xmalloc((size_t) R * K * sizeof(float));
    float *   Wd = xmalloc((size_t) M * K * sizeof(float));
    for (int i = 0; i < M * K; i++) {
        W[i] = rnd_gauss();
    }
    for (int i = 0; i < R * K; i++) {
        X[i] = rnd_gauss();
    }
    for (int fam = 0; fam < 2; fam++)
    for (int L = 0; L < 3; L++) {
        uint8_t *               wi = xmalloc((size_t) M * K / 32 * 18);
        ggml_ext_block_q8_0 *   a  = xmalloc((size_t) R * K / 32 * sizeof(*a));
        ggml_ext_block_q8_0x4 * ax = xmalloc((size_t) R / 4 * K / 32 * sizeof(*ax));
        float *                 ad = xmalloc((size_t) R * K * sizeof(float));
        float *                 sv = xmalloc((size_t) R * M * sizeof(float)), *sm = xmalloc((size_t) R * M * sizeof(float));
        const struct ggml_ext_interleaved4_layout_traits * tr = fam ? ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_IQ4_NL, (enum ggml_ext_interleaved4_layout) L)
                                                            : ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, (enum ggml_ext_interleaved4_layout) L);
        if (fam) {  // random IQ4_NL blocks (no quantizer in this library)
            ggml_ext_block_iq4_nl * q = xmalloc((size_t) M * K / 32 * sizeof(*q));
            random_q4_0(q, (size_t) M * K / 32);
            ggml_ext_repack_iq4_nl((enum ggml_ext_interleaved4_layout) L, wi, q, M, K);
            ggml_ext_dequantize_iq4_nl_interleaved((enum ggml_ext_interleaved4_layout) L, wi, Wd, M, K);
            free(q);
        } else {
            ggml_ext_quantize_q4_0_interleaved((enum ggml_ext_interleaved4_layout) L, W, wi, M, K);
            ggml_ext_dequantize_q4_0_interleaved((enum ggml_ext_interleaved4_layout) L, wi, Wd, M, K);
        }
        ggml_ext_quantize_row_q8_0(X, a, (int64_t) R * K);
        for (int t = 0; t < R / 4; t++) {
            tr->quantize_mat(X + (size_t) 4 * t * K, ax + (size_t) t * K / 32, K);
        }
        for (int i = 0; i < R * K / 32; i++) {
            for (int j = 0; j < 32; j++) {
                ad[i * 32 + j] = a[i].qs[j] * ggml_ext_fp16_to_fp32(a[i].d);
            }
        }
        tr->gemv(K, sv, M, wi, a, R, M);
        tr->gemm(K, sm, M, wi, ax, R, M);
        int bad = 0;
        for (int y = 0; y < R; y++) {
            for (int c = 0; c < M; c++) {
                double e = 0, t = 0;
                for (int k = 0; k < K; k++) {
                    e += (double) Wd[(size_t) c * K + k] * ad[(size_t) y * K + k];
                    t += fabs((double) Wd[(size_t) c * K + k] * ad[(size_t) y * K + k]);
                }
                const double tol = (K / 32 + 8) * ldexp(t, -22);
                bad += !(fabs(sv[y * M + c] - e) <= tol) || !(fabs(sm[y * M + c] - e) <= tol);
            }
        }
        check(bad == 0, "%s end to end (%s): %d outputs off the dequantized matmul", LNAME[L], tr->name, bad);
        free(wi);
        free(a);
        free(ax);
        free(ad);
        free(sv);
        free(sm);
    }
    free(W);
    free(X);
    free(Wd);
}

int main(int argc, char ** argv) {
    const char * fixture = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ggml-fixture") && i + 1 < argc) {
            fixture = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--ggml-fixture FILE]\n", argv[0]);
            return 2;
        }
    }
    // usable implementations; compiled-in ones this CPU cannot run; what the dispatcher picks
    printf("implementations:");
    for (int i = 0; i < ggml_ext_interleaved4_impl_count(); i++) {
        if (usable(ggml_ext_interleaved4_impl_get(i))) {
            printf(" %s", ggml_ext_interleaved4_impl_get(i)->name);
        }
    }
    printf("\nnot usable here:");
    for (int i = 0; i < ggml_ext_interleaved4_impl_count(); i++) {
        if (!usable(ggml_ext_interleaved4_impl_get(i))) {
            printf(" %s", ggml_ext_interleaved4_impl_get(i)->name);
        }
    }
    printf("\n");
    for (int L = 0; L < GGML_EXT_INTERLEAVED4_N_LAYOUTS; L++) {
        const enum ggml_ext_interleaved4_layout l = (enum ggml_ext_interleaved4_layout) L;
        printf("dispatched q4_0 %s: gemv %s, gemm %s\n", LNAME[L], ggml_ext_interleaved4_dispatched(GGML_EXT_INTERLEAVED4_Q4_0, l, 0),
               ggml_ext_interleaved4_dispatched(GGML_EXT_INTERLEAVED4_Q4_0, l, 1));
        printf("dispatched iq4_nl %s: gemv %s, gemm %s\n", LNAME[L], ggml_ext_interleaved4_dispatched(GGML_EXT_INTERLEAVED4_IQ4_NL, l, 0),
               ggml_ext_interleaved4_dispatched(GGML_EXT_INTERLEAVED4_IQ4_NL, l, 1));
    }
    test_fp16();
    test_reference_quantizers();
    if (fixture) {
        test_ggml_fixture(fixture);
    }
    test_layouts();
    test_layouts_iq4_nl();
    test_activation_quantizers();
    test_kernels();
    test_dispatch_report();
    test_end_to_end();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
