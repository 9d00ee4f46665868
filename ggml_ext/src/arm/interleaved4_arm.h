// Shared by the Arm kernels of the interleaved4 family (NEON dotprod, i8mm, SVE).
//
// Weights: the stored byte is the Q4_0 byte XOR 0x88, so each nibble is the signed weight
// w = q - 8; (byte << 4) and (byte & 0xf0) are the two weights times 16 as int8, and the
// int32 dot product is divided by 16 once, inside the int -> float conversion
// (vcvtq_n_f32_s32 with 4 fractional bits, exact).
#pragma once

#include "formats/interleaved4/interleaved4_impl.h"

#if defined(GGML_EXT_HAVE_NEON_DOTPROD)

#    include <arm_neon.h>

#    define INLINE GGML_EXT_INLINE

INLINE int8x16_t lo16(int8x16_t b) {  // low nibble weights times 16
    return vshlq_n_s8(b, 4);
}

INLINE int8x16_t hi16(int8x16_t b) {  // high nibble weights times 16
    return vandq_s8(b, vdupq_n_s8((int8_t) 0xf0));
}

// The kernels serve both families through fam (a constant after inlining): 0 = Q4_0 as
// above, 1 = IQ4_NL, whose plain nibbles index kvalues with one TBL each (vqtbl1q_s8)
// and whose products need no division.
static const int8_t ggml_ext_arm_kvalues_iq4nl[16] = { GGML_EXT_IQ4_NL_VALUES };

INLINE int8x16_t wlo(int fam, int8x16_t b) {  // low nibble weights (Q4_0: times 16)
    if (fam) {
        return vqtbl1q_s8(vld1q_s8(ggml_ext_arm_kvalues_iq4nl), vandq_u8(vreinterpretq_u8_s8(b), vdupq_n_u8(0x0f)));
    }
    return lo16(b);
}

INLINE int8x16_t whi(int fam, int8x16_t b) {  // high nibble weights (Q4_0: times 16)
    if (fam) {
        return vqtbl1q_s8(vld1q_s8(ggml_ext_arm_kvalues_iq4nl), vshrq_n_u8(vreinterpretq_u8_s8(b), 4));
    }
    return hi16(b);
}

INLINE float32x4_t wcvt(int fam, int32x4_t p) {  // integer dot product -> float (Q4_0: / 16, exact)
    return fam ? vcvtq_f32_s32(p) : vcvtq_n_f32_s32(p, 4);
}

INLINE float32x4_t load_d4(const ggml_ext_fp16_t * d) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d)));
}

INLINE float32x4_t dup_d(const ggml_ext_fp16_t * d) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_dup_u16(d)));
}

INLINE int8x16_t dup64(const int8_t * p) {  // 8 bytes in both halves
    return vreinterpretq_s8_u64(vld1q_dup_u64((const uint64_t *) (const void *) p));
}

// GEMM of 4T activation rows (T tiles of four, interleaved) x N columns over nb blocks,
// w at the row group's first block; s[r * bs + c].
#    define GGML_EXT_INTERLEAVED4_ARM_TILE_ARGS const ggml_ext_block_q8_0x4 *a, int nb, const uint8_t *w, float *s, size_t bs
typedef void (*ggml_ext_interleaved4_arm_tile_fn)(GGML_EXT_INTERLEAVED4_ARM_TILE_ARGS);

#    define GGML_EXT_INTERLEAVED4_ARM_COLBLOCK_BYTES (256 * 1024)

// Column blocks of about COLBLOCK_BYTES of weights outermost, so that a block stays in L2
// while all tiles pass over it; tiles of 4T rows (tileT), then single 4-row tiles (tile1).
// Always inlined with always-inlined tiles: the tiles' loops are compiled in place.
GGML_EXT_INLINE void ggml_ext_interleaved4_arm_gemm_driver(int N, int T, ggml_ext_interleaved4_arm_tile_fn tileT, ggml_ext_interleaved4_arm_tile_fn tile1,
                                                           int n, float * s, size_t bs, const void * vx, const void * vy, int nr,
                                                           int nc) {
    const int                     nb    = n / 32, ng = nc / N, nt = nr / 4;
    const size_t                  group = (size_t) nb * N * sizeof(ggml_ext_block_q4_0);  // bytes of one row group
    const int                     GB    = group >= GGML_EXT_INTERLEAVED4_ARM_COLBLOCK_BYTES ? 1 : (int) (GGML_EXT_INTERLEAVED4_ARM_COLBLOCK_BYTES / group);
    const ggml_ext_block_q8_0x4 * a     = (const ggml_ext_block_q8_0x4 *) vy;
    for (int g0 = 0; g0 < ng; g0 += GB) {
        const int g1 = g0 + GB < ng ? g0 + GB : ng;
        int       ti = 0;
        for (; ti + T <= nt; ti += T) {
            for (int g = g0; g < g1; g++) {
                tileT(a + (size_t) ti * nb, nb, (const uint8_t *) vx + g * group, s + (size_t) 4 * ti * bs + (size_t) g * N, bs);
            }
        }
        for (; ti < nt; ti++) {
            for (int g = g0; g < g1; g++) {
                tile1(a + (size_t) ti * nb, nb, (const uint8_t *) vx + g * group, s + (size_t) 4 * ti * bs + (size_t) g * N, bs);
            }
        }
    }
}

#endif  // GGML_EXT_HAVE_NEON_DOTPROD
