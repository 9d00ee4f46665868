// NEON + dotprod kernels of the interleaved Q4_0 family: Q8_0 activation quantizers, and
// GEMV and GEMM for all three layouts with SDOT (vdotq_laneq_s32 for Q4_0_4_4, whose 4-byte
// chunks meet one activation lane each; vdotq_s32 against 8-byte broadcasts for the B = 8
// layouts). SMMLA GEMMs: interleaved4_i8mm.c. Scalar twins: ../generic/.
// Interleaved IQ4_NL runs the same kernels with fam = 1 (TBL decode, see the header).
#include "arm/interleaved4_arm.h"

#if defined(GGML_EXT_HAVE_NEON_DOTPROD)

// ---------------------------------------------------------------- activations

// One Q8_0 block as the reference: d = amax / 127, q = roundf(x / d) (vcvtaq: ties away).
INLINE void quantize_block(const float * x, ggml_ext_fp16_t * d_out, int8x16_t * q0, int8x16_t * q1) {
    float32x4_t v[8];
    float32x4_t amax = vdupq_n_f32(0.0f);
    for (int j = 0; j < 8; j++) {
        v[j] = vld1q_f32(x + 4 * j);
        amax = vmaxq_f32(amax, vabsq_f32(v[j]));
    }
    const float d  = vmaxvq_f32(amax) / 127;
    const float id = d ? 1.0f / d : 0.0f;
    *d_out         = vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(d))), 0);
    int16x8_t h[4];
    for (int j = 0; j < 4; j++) {
        const int32x4_t i0 = vcvtaq_s32_f32(vmulq_n_f32(v[2 * j], id));
        const int32x4_t i1 = vcvtaq_s32_f32(vmulq_n_f32(v[2 * j + 1], id));
        h[j]               = vcombine_s16(vmovn_s32(i0), vmovn_s32(i1));
    }
    *q0 = vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1]));
    *q1 = vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3]));
}

static void quantize_row_q8_0_neon(const float * x, void * vy, int64_t k) {
    ggml_ext_block_q8_0 * y = (ggml_ext_block_q8_0 *) vy;
    for (int64_t i = 0; i < k / 32; i++) {
        int8x16_t q0, q1;
        quantize_block(x + 32 * i, &y[i].d, &q0, &q1);
        vst1q_s8(y[i].qs, q0);
        vst1q_s8(y[i].qs + 16, q1);
    }
}

// Row r's 4-byte chunk c goes to slot 4c + r: a 4x4 transpose of 32-bit lanes.
static void quantize_mat_q8_0_4x4_neon(const float * x, void * vy, int64_t k) {
    ggml_ext_block_q8_0x4 * y = (ggml_ext_block_q8_0x4 *) vy;
    for (int64_t i = 0; i < k / 32; i++) {
        int32x4_t R[2][4];
        for (int r = 0; r < 4; r++) {
            int8x16_t q0, q1;
            quantize_block(x + r * k + 32 * i, &y[i].d[r], &q0, &q1);
            R[0][r] = vreinterpretq_s32_s8(q0);
            R[1][r] = vreinterpretq_s32_s8(q1);
        }
        for (int hf = 0; hf < 2; hf++) {
            const int64x2_t t0 = vreinterpretq_s64_s32(vtrn1q_s32(R[hf][0], R[hf][1]));
            const int64x2_t t1 = vreinterpretq_s64_s32(vtrn2q_s32(R[hf][0], R[hf][1]));
            const int64x2_t t2 = vreinterpretq_s64_s32(vtrn1q_s32(R[hf][2], R[hf][3]));
            const int64x2_t t3 = vreinterpretq_s64_s32(vtrn2q_s32(R[hf][2], R[hf][3]));
            int8_t *        o  = y[i].qs + 64 * hf;
            vst1q_s8(o + 0, vreinterpretq_s8_s64(vzip1q_s64(t0, t2)));
            vst1q_s8(o + 16, vreinterpretq_s8_s64(vzip1q_s64(t1, t3)));
            vst1q_s8(o + 32, vreinterpretq_s8_s64(vzip2q_s64(t0, t2)));
            vst1q_s8(o + 48, vreinterpretq_s8_s64(vzip2q_s64(t1, t3)));
        }
    }
}

// Row r's 8-byte chunk c goes to slot 4c + r: 16-byte line 2c = rows 0, 1; 2c + 1 = rows 2, 3.
static void quantize_mat_q8_0_4x8_neon(const float * x, void * vy, int64_t k) {
    ggml_ext_block_q8_0x4 * y = (ggml_ext_block_q8_0x4 *) vy;
    for (int64_t i = 0; i < k / 32; i++) {
        int64x2_t R[2][4];
        for (int r = 0; r < 4; r++) {
            int8x16_t q0, q1;
            quantize_block(x + r * k + 32 * i, &y[i].d[r], &q0, &q1);
            R[0][r] = vreinterpretq_s64_s8(q0);
            R[1][r] = vreinterpretq_s64_s8(q1);
        }
        for (int hf = 0; hf < 2; hf++) {
            int8_t * o = y[i].qs + 64 * hf;
            vst1q_s8(o + 0, vreinterpretq_s8_s64(vzip1q_s64(R[hf][0], R[hf][1])));
            vst1q_s8(o + 16, vreinterpretq_s8_s64(vzip1q_s64(R[hf][2], R[hf][3])));
            vst1q_s8(o + 32, vreinterpretq_s8_s64(vzip2q_s64(R[hf][0], R[hf][1])));
            vst1q_s8(o + 48, vreinterpretq_s8_s64(vzip2q_s64(R[hf][2], R[hf][3])));
        }
    }
}

// ---------------------------------------------------------------- Q4_0_4_4 (SDOT by lane)

// 16-byte line k of a block = bytes 4k..4k+3 of columns 0-3: lane k of the activation's
// first 16 bytes meets its low nibbles, lane k of the last 16 its high nibbles.
typedef struct {
    int8x16_t lo[4], hi[4];
} w4x4;

INLINE w4x4 load_4x4(int fam, const uint8_t * qs) {
    w4x4 w;
    GGML_EXT_UNROLL
    for (int k = 0; k < 4; k++) {
        const int8x16_t b = vld1q_s8((const int8_t *) qs + 16 * k);
        w.lo[k]           = wlo(fam, b);
        w.hi[k]           = whi(fam, b);
    }
    return w;
}

// G row groups (4 columns each) at once, sharing the activation loads and their delta.
INLINE void gemv_4x4_pass(int fam, int G, const ggml_ext_block_q4_0x4 * w, int nb, const ggml_ext_block_q8_0 * a, float * out) {
    float32x4_t acc[2] = { vdupq_n_f32(0.0f), vdupq_n_f32(0.0f) };
    for (int b = 0; b < nb; b++) {
        // activation dword k (bytes 4k..) of each half is lane k: a plain load
        const int8x16_t   al = vld1q_s8(a[b].qs);
        const int8x16_t   ah = vld1q_s8(a[b].qs + 16);
        const float32x4_t da = dup_d(&a[b].d);
        GGML_EXT_UNROLL
        for (int gi = 0; gi < G; gi++) {
            const ggml_ext_block_q4_0x4 * wg = w + (size_t) gi * nb + b;
            const w4x4                    wb = load_4x4(fam, wg->qs);
            int32x4_t                     p  = vdotq_laneq_s32(vdupq_n_s32(0), wb.lo[0], al, 0);
            p                                = vdotq_laneq_s32(p, wb.lo[1], al, 1);
            p                                = vdotq_laneq_s32(p, wb.lo[2], al, 2);
            p                                = vdotq_laneq_s32(p, wb.lo[3], al, 3);
            int32x4_t q                      = vdotq_laneq_s32(vdupq_n_s32(0), wb.hi[0], ah, 0);
            q                                = vdotq_laneq_s32(q, wb.hi[1], ah, 1);
            q                                = vdotq_laneq_s32(q, wb.hi[2], ah, 2);
            q                                = vdotq_laneq_s32(q, wb.hi[3], ah, 3);
            acc[gi] = vfmaq_f32(acc[gi], wcvt(fam, vaddq_s32(p, q)), vmulq_f32(load_d4(wg->d), da));
        }
    }
    for (int gi = 0; gi < G; gi++) {
        vst1q_f32(out + 4 * gi, acc[gi]);
    }
}

INLINE void gemv_4x4_dotprod(int fam, int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    const int nb = n / 32, ng = nc / 4;
    for (int y = 0; y < nr; y++) {
        const ggml_ext_block_q8_0 *   a = (const ggml_ext_block_q8_0 *) vy + (size_t) y * nb;
        const ggml_ext_block_q4_0x4 * w = (const ggml_ext_block_q4_0x4 *) vx;
        int                           g = 0;
        for (; g + 2 <= ng; g += 2) {
            gemv_4x4_pass(fam, 2, w + (size_t) g * nb, nb, a, s + (size_t) y * bs + (size_t) g * 4);
        }
        if (g < ng) {
            gemv_4x4_pass(fam, 1, w + (size_t) g * nb, nb, a, s + (size_t) y * bs + (size_t) g * 4);
        }
    }
}

// Activations interleaved with B = 4: line k holds dword k of rows 0-3 in lanes 0-3,
// so one activation line feeds the same SDOT by lane for all four rows. T tiles of four
// rows (T = 1, 2) share each unpacked weight block.
INLINE void gemm_4x4_tiles(int fam, int T, const ggml_ext_block_q8_0x4 * a, int nb, const ggml_ext_block_q4_0x4 * w, float * s,
                           size_t bs) {
    float32x4_t acc[4][4];
    GGML_EXT_UNROLL
    for (int t = 0; t < 4; t++) {
        GGML_EXT_UNROLL
        for (int r = 0; r < 4; r++) {
            acc[t][r] = vdupq_n_f32(0.0f);
        }
    }
    for (int b = 0; b < nb; b++) {
        const w4x4        wb = load_4x4(fam, w[b].qs);
        const float32x4_t dw = load_d4(w[b].d);
        GGML_EXT_UNROLL
        for (int t = 0; t < T; t++) {
            const ggml_ext_block_q8_0x4 * at = a + (size_t) t * nb + b;
            int32x4_t                     p[4];
            GGML_EXT_UNROLL
            for (int r = 0; r < 4; r++) {
                p[r] = vdupq_n_s32(0);
            }
            // activation line k (dword k of rows 0-3) meets weight line k's low nibbles,
            // line 4 + k its high nibbles; one pair of lines live at a time
            GGML_EXT_UNROLL
            for (int k = 0; k < 4; k++) {
                GGML_EXT_LOAD_BARRIER();
                const int8x16_t al = vld1q_s8(at->qs + 16 * k);
                const int8x16_t ah = vld1q_s8(at->qs + 16 * (4 + k));
                p[0]               = vdotq_laneq_s32(p[0], wb.lo[k], al, 0);
                p[1]               = vdotq_laneq_s32(p[1], wb.lo[k], al, 1);
                p[2]               = vdotq_laneq_s32(p[2], wb.lo[k], al, 2);
                p[3]               = vdotq_laneq_s32(p[3], wb.lo[k], al, 3);
                p[0]               = vdotq_laneq_s32(p[0], wb.hi[k], ah, 0);
                p[1]               = vdotq_laneq_s32(p[1], wb.hi[k], ah, 1);
                p[2]               = vdotq_laneq_s32(p[2], wb.hi[k], ah, 2);
                p[3]               = vdotq_laneq_s32(p[3], wb.hi[k], ah, 3);
            }
            const float32x4_t da = load_d4(at->d);
            acc[t][0] = vfmaq_f32(acc[t][0], wcvt(fam, p[0]), vmulq_laneq_f32(dw, da, 0));
            acc[t][1] = vfmaq_f32(acc[t][1], wcvt(fam, p[1]), vmulq_laneq_f32(dw, da, 1));
            acc[t][2] = vfmaq_f32(acc[t][2], wcvt(fam, p[2]), vmulq_laneq_f32(dw, da, 2));
            acc[t][3] = vfmaq_f32(acc[t][3], wcvt(fam, p[3]), vmulq_laneq_f32(dw, da, 3));
        }
    }
    for (int t = 0; t < T; t++) {
        for (int r = 0; r < 4; r++) {
            vst1q_f32(s + (size_t) (4 * t + r) * bs, acc[t][r]);
        }
    }
}

// One GEMV and one GEMM per values (V: their flag): tiles of 16 rows, then of 4.
#define ENTRIES_4X4(values, V)                                                                                   \
    INLINE void tile_##values##_4x4_16rows(GGML_EXT_INTERLEAVED4_ARM_TILE_ARGS) {                                          \
        gemm_4x4_tiles(V, 4, a, nb, (const ggml_ext_block_q4_0x4 *) w, s, bs);                                    \
    }                                                                                                            \
    INLINE void tile_##values##_4x4_4rows(GGML_EXT_INTERLEAVED4_ARM_TILE_ARGS) {                                           \
        gemm_4x4_tiles(V, 1, a, nb, (const ggml_ext_block_q4_0x4 *) w, s, bs);                                    \
    }                                                                                                            \
    static void gemv_##values##_4x4_dotprod(GGML_EXT_INTERLEAVED4_MM_ARGS) {                                               \
        gemv_4x4_dotprod(V, n, s, bs, vx, vy, nr, nc);                                                           \
    }                                                                                                            \
    static void gemm_##values##_4x4_dotprod(GGML_EXT_INTERLEAVED4_MM_ARGS) {                                               \
        ggml_ext_interleaved4_arm_gemm_driver(4, 4, tile_##values##_4x4_16rows, tile_##values##_4x4_4rows, n, s, bs, vx, vy, \
                                              nr, nc);                                                                     \
    }
ENTRIES_4X4(q4_0, 0)
ENTRIES_4X4(iq4_nl, 1)

// ---------------------------------------------------------------- B = 8 layouts, SDOT

// The 16-byte line of column pair p (columns 2p, 2p+1) and chunk c (bytes 8c..8c+7) of a
// block with N columns is line c * N/2 + p. Against 8-byte activation broadcasts A[0..3]
// (bytes 0-7, 8-15, 16-23, 24-31) each column gets two int32 lanes, added pairwise.
typedef struct {
    int8x16_t lo[8], hi[8];  // per line
} wb8;

INLINE void load_b8(int fam, const uint8_t * qs, int N, wb8 * w) {
    GGML_EXT_UNROLL
    for (int i = 0; i < N; i++) {  // N columns x 16 bytes = N lines
        const int8x16_t b = vld1q_s8((const int8_t *) qs + 16 * i);
        w->lo[i]          = wlo(fam, b);
        w->hi[i]          = whi(fam, b);
    }
}

INLINE int32x4_t dot_pair_b8(const wb8 * w, int N, int p, const int8x16_t A[4]) {
    const int l0  = p, l1 = N / 2 + p;  // chunk 0 and chunk 1 lines of this pair
    int32x4_t acc = vdotq_s32(vdupq_n_s32(0), w->lo[l0], A[0]);
    acc           = vdotq_s32(acc, w->lo[l1], A[1]);
    acc           = vdotq_s32(acc, w->hi[l0], A[2]);
    return vdotq_s32(acc, w->hi[l1], A[3]);
}

// columns 4h .. 4h+3
INLINE int32x4_t dot_b8(const wb8 * w, int N, int h, const int8x16_t A[4]) {
    return vpaddq_s32(dot_pair_b8(w, N, 2 * h, A), dot_pair_b8(w, N, 2 * h + 1, A));
}

// G row groups at once (eight columns: one Q4_0_8_8 group or two Q4_0_4_8 groups, or a
// last lone Q4_0_4_8 group), sharing the activation broadcasts and their delta.
INLINE void gemv_b8_pass(int fam, int N, int G, const uint8_t * w, int nb, const ggml_ext_block_q8_0 * a, float * out) {
    const size_t blk    = (size_t) N * sizeof(ggml_ext_block_q4_0);
    const int    quads  = G * N / 4;  // columns / 4
    float32x4_t  acc[2] = { vdupq_n_f32(0.0f), vdupq_n_f32(0.0f) };
    for (int b = 0; b < nb; b++) {
        const int8x16_t   A[4] = { dup64(a[b].qs), dup64(a[b].qs + 8), dup64(a[b].qs + 16), dup64(a[b].qs + 24) };
        const float32x4_t da   = dup_d(&a[b].d);
        GGML_EXT_UNROLL
        for (int gi = 0; gi < G; gi++) {
            const uint8_t * wg = w + ((size_t) gi * nb + b) * blk;
            wb8             wb;
            load_b8(fam, wg + 2 * N, N, &wb);
            GGML_EXT_UNROLL
            for (int h = 0; h < N / 4; h++) {
                const float32x4_t sc = vmulq_f32(load_d4((const ggml_ext_fp16_t *) wg + 4 * h), da);
                acc[gi + h]          = vfmaq_f32(acc[gi + h], wcvt(fam, dot_b8(&wb, N, h, A)), sc);
            }
        }
    }
    for (int q = 0; q < quads; q++) {
        vst1q_f32(out + 4 * q, acc[q]);
    }
}

INLINE void gemv_b8_dotprod(int fam, int N, int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    const int    nb   = n / 32, ng = nc / N, step = 8 / N;
    const size_t gblk = (size_t) nb * N * sizeof(ggml_ext_block_q4_0);  // bytes of one row group
    for (int y = 0; y < nr; y++) {
        const ggml_ext_block_q8_0 * a = (const ggml_ext_block_q8_0 *) vy + (size_t) y * nb;
        const uint8_t *             w = (const uint8_t *) vx;
        int                         g = 0;
        for (; g + step <= ng; g += step) {
            gemv_b8_pass(fam, N, step, w + g * gblk, nb, a, s + (size_t) y * bs + (size_t) g * N);
        }
        if (g < ng) {
            gemv_b8_pass(fam, N, 1, w + g * gblk, nb, a, s + (size_t) y * bs + (size_t) g * N);
        }
    }
}

// Activations interleaved with B = 8: chunk c of row r at qs + 8 (4c + r). One tile of
// four rows x N columns.
INLINE void gemm_tile_b8_dotprod(int fam, int N, const ggml_ext_block_q8_0x4 * a, int nb, const uint8_t * w, float * s, size_t bs) {
    const size_t blk = (size_t) N * sizeof(ggml_ext_block_q4_0);
    float32x4_t  acc[4][2];
    for (int r = 0; r < 4; r++) {
        acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
    }
    for (int b = 0; b < nb; b++, w += blk) {
        wb8 wb;
        load_b8(fam, w + 2 * N, N, &wb);
        float da[4];
        vst1q_f32(da, load_d4(a[b].d));
        const int8_t * q = a[b].qs;
        GGML_EXT_UNROLL
        for (int r = 0; r < 4; r++) {
            const int8x16_t   A[4] = { dup64(q + 8 * r), dup64(q + 8 * (4 + r)), dup64(q + 8 * (8 + r)), dup64(q + 8 * (12 + r)) };
            const float32x4_t dar  = vdupq_n_f32(da[r]);
            GGML_EXT_UNROLL
            for (int h = 0; h < N / 4; h++) {
                const float32x4_t sc = vmulq_f32(load_d4((const ggml_ext_fp16_t *) w + 4 * h), dar);
                acc[r][h]            = vfmaq_f32(acc[r][h], wcvt(fam, dot_b8(&wb, N, h, A)), sc);
            }
        }
    }
    for (int r = 0; r < 4; r++) {
        for (int h = 0; h < N / 4; h++) {
            vst1q_f32(s + (size_t) r * bs + 4 * h, acc[r][h]);
        }
    }
}

// One GEMV and one GEMM per (values, N) with B = 8 (V: the values' flag).
#define ENTRIES_B8(values, V, N)                                                                          \
    INLINE void tile_##values##_##N##x8(GGML_EXT_INTERLEAVED4_ARM_TILE_ARGS) {                                      \
        gemm_tile_b8_dotprod(V, N, a, nb, w, s, bs);                                                      \
    }                                                                                                     \
    static void gemv_##values##_##N##x8_dotprod(GGML_EXT_INTERLEAVED4_MM_ARGS) {                                    \
        gemv_b8_dotprod(V, N, n, s, bs, vx, vy, nr, nc);                                                  \
    }                                                                                                     \
    static void gemm_##values##_##N##x8_dotprod(GGML_EXT_INTERLEAVED4_MM_ARGS) {                                    \
        ggml_ext_interleaved4_arm_gemm_driver(N, 1, tile_##values##_##N##x8, tile_##values##_##N##x8, n, s, bs, vx, vy, \
                                              nr, nc);                                                              \
    }
ENTRIES_B8(q4_0, 0, 4)
ENTRIES_B8(q4_0, 0, 8)
ENTRIES_B8(iq4_nl, 1, 4)
ENTRIES_B8(iq4_nl, 1, 8)

const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_neon_dotprod = {
    .name                  = "neon-dotprod",
    .quantize_row_q8_0     = quantize_row_q8_0_neon,
    .quantize_mat_q8_0_4x4 = quantize_mat_q8_0_4x4_neon,
    .quantize_mat_q8_0_4x8 = quantize_mat_q8_0_4x8_neon,
    .gemv                  = GGML_EXT_INTERLEAVED4_TABLE(gemv, dotprod),
    .gemm                  = GGML_EXT_INTERLEAVED4_TABLE(gemm, dotprod),
};

#else
typedef int ggml_ext_interleaved4_arm_not_compiled;  // ISO C: no empty translation unit
#endif
