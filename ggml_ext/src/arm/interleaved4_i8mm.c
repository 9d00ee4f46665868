// i8mm kernels of the interleaved Q4_0 family: GEMM for Q4_0_4_8 and Q4_0_8_8 with SMMLA
// (vmmlaq_s32): one instruction multiplies 2 activation rows by 2 weight columns over 8
// bytes, exactly the 8-byte chunk pairs the B = 8 layouts store. GEMV stays on SDOT
// (interleaved4_neon.c): with one activation row half of every SMMLA would be wasted,
// leaving the same useful work per instruction. Scalar twins: ../generic/.
// Interleaved IQ4_NL: the same GEMMs with fam = 1 (TBL decode, interleaved4_arm.h).
#include "arm/interleaved4_arm.h"

#if defined(GGML_EXT_HAVE_NEON_I8MM)

// vmmlaq_s32(acc, A, W): A = 2 activation rows x 8 bytes, W = 2 weight columns x 8 bytes;
// acc lanes [r0 c0, r0 c1, r1 c0, r1 c1]. Activation line 2c + rp = rows 2rp, 2rp+1 of
// chunk c; weight line c * N/2 + cp = columns 2cp, 2cp+1 of chunk c. Accumulator [rp][cp]
// holds rows 2rp.., columns 2cp..

// The four SMMLA of one block for rows 2rp, 2rp+1 (A: the block's 8 activation lines) and
// columns 2cp, 2cp+1 (unpacked lines: weights 0-7, 8-15, 16-23, 24-31), scaled.
INLINE float32x4_t mmla_block(int fam, float32x4_t acc, const int8x16_t A[8], int rp, int8x16_t wl0, int8x16_t wl1, int8x16_t wh0,
                              int8x16_t wh1, float32x4_t scale) {
    int32x4_t p = vmmlaq_s32(vdupq_n_s32(0), A[rp], wl0);
    p           = vmmlaq_s32(p, A[2 + rp], wl1);
    p           = vmmlaq_s32(p, A[4 + rp], wh0);
    p           = vmmlaq_s32(p, A[6 + rp], wh1);
    return vfmaq_f32(acc, wcvt(fam, p), scale);
}

INLINE void load_act_lines(const ggml_ext_block_q8_0x4 * a, int8x16_t A[8], float32x4_t dap[2]) {
    GGML_EXT_UNROLL
    for (int k = 0; k < 8; k++) {
        A[k] = vld1q_s8(a->qs + 16 * k);
    }
    const float32x4_t da = load_d4(a->d);
    dap[0]               = vzip1q_f32(da, da);  // [a0 a0 a1 a1]
    dap[1]               = vzip2q_f32(da, da);  // [a2 a2 a3 a3]
}

INLINE void store_mmla(float * s, size_t bs, float32x4_t acc01, float32x4_t acc23) {  // rows r, r+1; 4 columns
    vst1q_f32(s, vcombine_f32(vget_low_f32(acc01), vget_low_f32(acc23)));
    vst1q_f32(s + bs, vcombine_f32(vget_high_f32(acc01), vget_high_f32(acc23)));
}

// Q4_0_4_8: T tiles of four rows (T = 1, 2) x 4 columns; the unpacked block (8 registers)
// serves all 4T rows.
INLINE void gemm_4x8_tiles(int fam, int T, const ggml_ext_block_q8_0x4 * a, int nb, const ggml_ext_block_q4_0x4 * w, float * s,
                           size_t bs) {
    float32x4_t acc[2][2][2];  // [tile][rp][cp]
    GGML_EXT_UNROLL
    for (int i = 0; i < 8; i++) {
        acc[i / 4][i / 2 % 2][i % 2] = vdupq_n_f32(0.0f);
    }
    for (int b = 0; b < nb; b++) {
        int8x16_t   wl0[2], wl1[2], wh0[2], wh1[2];
        float32x4_t dwp[2];
        const float32x4_t dw = load_d4(w[b].d);
        GGML_EXT_UNROLL
        for (int cp = 0; cp < 2; cp++) {
            const int8x16_t l0 = vld1q_s8((const int8_t *) w[b].qs + 16 * cp);        // chunk 0
            const int8x16_t l1 = vld1q_s8((const int8_t *) w[b].qs + 16 * (2 + cp));  // chunk 1
            wl0[cp] = wlo(fam, l0), wh0[cp] = whi(fam, l0), wl1[cp] = wlo(fam, l1), wh1[cp] = whi(fam, l1);
            const float32x2_t d2 = cp ? vget_high_f32(dw) : vget_low_f32(dw);
            dwp[cp]              = vcombine_f32(d2, d2);  // [w 2cp, w 2cp+1] twice
        }
        GGML_EXT_UNROLL
        for (int t = 0; t < T; t++) {
            const ggml_ext_block_q8_0x4 * at = a + (size_t) t * nb + b;
            const float32x4_t             da = load_d4(at->d);
            GGML_EXT_UNROLL
            for (int rp = 0; rp < 2; rp++) {
                GGML_EXT_LOAD_BARRIER();  // rows 2rp, 2rp+1: four activation lines live at a time
                const float32x4_t dap = rp ? vzip2q_f32(da, da) : vzip1q_f32(da, da);
                int8x16_t         A[8];
                GGML_EXT_UNROLL
                for (int c = 0; c < 4; c++) {
                    A[2 * c + rp] = vld1q_s8(at->qs + 16 * (2 * c + rp));
                }
                GGML_EXT_UNROLL
                for (int cp = 0; cp < 2; cp++) {
                    acc[t][rp][cp] = mmla_block(fam, acc[t][rp][cp], A, rp, wl0[cp], wl1[cp], wh0[cp], wh1[cp],
                                                vmulq_f32(dwp[cp], dap));
                }
            }
        }
    }
    for (int t = 0; t < T; t++) {
        for (int rp = 0; rp < 2; rp++) {
            store_mmla(s + (size_t) (4 * t + 2 * rp) * bs, bs, acc[t][rp][0], acc[t][rp][1]);
        }
    }
}

// Q4_0_4_8 / IQ4_NL_4_8 (V: the values' flag): tiles of 8 rows, then of 4.
#define GEMM_4X8(values, V)                                                                                     \
    INLINE void tile_##values##_4x8_8rows(GGML_EXT_INTERLEAVED4_ARM_TILE_ARGS) {                                          \
        gemm_4x8_tiles(V, 2, a, nb, (const ggml_ext_block_q4_0x4 *) w, s, bs);                                   \
    }                                                                                                           \
    INLINE void tile_##values##_4x8_4rows(GGML_EXT_INTERLEAVED4_ARM_TILE_ARGS) {                                          \
        gemm_4x8_tiles(V, 1, a, nb, (const ggml_ext_block_q4_0x4 *) w, s, bs);                                   \
    }                                                                                                           \
    static void gemm_##values##_4x8_i8mm(GGML_EXT_INTERLEAVED4_MM_ARGS) {                                                 \
        ggml_ext_interleaved4_arm_gemm_driver(4, 2, tile_##values##_4x8_8rows, tile_##values##_4x8_4rows, n, s, bs, vx, vy, \
                                              nr, nc);                                                                    \
    }
GEMM_4X8(q4_0, 0)
GEMM_4X8(iq4_nl, 1)

// Q4_0_8_8: one tile of four rows x 8 columns (8 accumulators); the block is unpacked one
// column pair at a time (a whole unpacked block would take 16 registers).
INLINE void tile_8x8_4rows_f(int fam, const ggml_ext_block_q8_0x4 * a, int nb, const uint8_t * w8, float * s, size_t bs) {
    const ggml_ext_block_q4_0x8 * w = (const ggml_ext_block_q4_0x8 *) w8;
    float32x4_t                   acc[2][4];
    GGML_EXT_UNROLL
    for (int i = 0; i < 8; i++) {
        acc[i / 4][i % 4] = vdupq_n_f32(0.0f);
    }
    for (int b = 0; b < nb; b++) {
        int8x16_t   A[8];
        float32x4_t dap[2];
        load_act_lines(a + b, A, dap);
        const float32x4_t dw[2] = { load_d4(w[b].d), load_d4(w[b].d + 4) };
        GGML_EXT_UNROLL
        for (int cp = 0; cp < 4; cp++) {
            const int8x16_t   l0  = vld1q_s8((const int8_t *) w[b].qs + 16 * cp);        // chunk 0
            const int8x16_t   l1  = vld1q_s8((const int8_t *) w[b].qs + 16 * (4 + cp));  // chunk 1
            const float32x2_t d2  = cp % 2 ? vget_high_f32(dw[cp / 2]) : vget_low_f32(dw[cp / 2]);
            const float32x4_t dwp = vcombine_f32(d2, d2);
            GGML_EXT_UNROLL
            for (int rp = 0; rp < 2; rp++) {
                acc[rp][cp] = mmla_block(fam, acc[rp][cp], A, rp, wlo(fam, l0), wlo(fam, l1), whi(fam, l0), whi(fam, l1), vmulq_f32(dwp, dap[rp]));
            }
        }
    }
    for (int rp = 0; rp < 2; rp++) {
        store_mmla(s + (size_t) 2 * rp * bs, bs, acc[rp][0], acc[rp][1]);
        store_mmla(s + (size_t) 2 * rp * bs + 4, bs, acc[rp][2], acc[rp][3]);
    }
}

#define GEMM_8X8(values, V)                                                                                    \
    INLINE void tile_##values##_8x8_4rows(GGML_EXT_INTERLEAVED4_ARM_TILE_ARGS) {                                         \
        tile_8x8_4rows_f(V, a, nb, w, s, bs);                                                                  \
    }                                                                                                          \
    static void gemm_##values##_8x8_i8mm(GGML_EXT_INTERLEAVED4_MM_ARGS) {                                                \
        ggml_ext_interleaved4_arm_gemm_driver(8, 1, tile_##values##_8x8_4rows, tile_##values##_8x8_4rows, n, s, bs, vx, vy, \
                                              nr, nc);                                                                   \
    }
GEMM_8X8(q4_0, 0)
GEMM_8X8(iq4_nl, 1)

const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_neon_i8mm = {
    .name                  = "neon-i8mm",
    .quantize_row_q8_0     = NULL,
    .quantize_mat_q8_0_4x4 = NULL,
    .quantize_mat_q8_0_4x8 = NULL,
    .gemv                  = { { NULL } },  // SDOT: see the top of this file
    .gemm                  = { { NULL, gemm_q4_0_4x8_i8mm, gemm_q4_0_8x8_i8mm }, { NULL, gemm_iq4_nl_4x8_i8mm, gemm_iq4_nl_8x8_i8mm } },
};

#else
typedef int ggml_ext_interleaved4_arm_i8mm_not_compiled;  // ISO C: no empty translation unit
#endif
