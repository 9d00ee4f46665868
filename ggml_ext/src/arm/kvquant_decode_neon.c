// NUQ block decode, NEON (scalar twin: ../generic/kvquant_decode.c; bytes: formats/kvquant/kvquant_decode.h).
// Sixteen slots per step as one byte vector of indices (B = 4: bytes 16k % 32, nibble k / 2; B = 2, 3:
// bytes 0..15, bits 2k; B = 3 adds bit 2k / 2k + 1 of bytes 16..23 for the low / high eight lanes),
// the 16-float table as a 64-byte TBL (index * 4 + byte), then * half + mid with the product rounded
// first (an empty asm keeps the compiler from fusing it into an FMA).
#include "formats/kvquant/kvquant_decode.h"
#include "common/simd.h"

#if defined(GGML_EXT_HAVE_NEON)
#    include <arm_neon.h>
#    include <string.h>

#    define INLINE GGML_EXT_INLINE

INLINE float32x4_t affine(float32x4_t t, float32x4_t h, float32x4_t m) {
    float32x4_t p = vmulq_f32(t, h);
    __asm__("" : "+w"(p));
    return vaddq_f32(p, m);
}

INLINE float half_to_float(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

INLINE void decode_block(int bits, const uint8_t * blk, uint8x16x4_t tb, const float * mid, const float * half,
                         float * y) {
    float32x4_t hs = vdupq_n_f32(0.0f), ms = vdupq_n_f32(0.0f);
    if (!mid) {
        uint16_t s[2];
        memcpy(s, blk + GGML_EXT_KVQUANT_BLOCK * bits / 8, sizeof(s));
        ms = vdupq_n_f32(half_to_float(s[0]));
        hs = vdupq_n_f32(half_to_float(s[1]));
    }
    // byte lanes of float lane j of quarter q: index of slot 4q + j, times 4, plus 0..3
    static const uint8_t spread[4][16] = {
        { 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3 },
        { 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7 },
        { 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11 },
        { 12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15 },
    };
    static const uint8_t lane_byte[16] = { 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3 };
    const uint8x16_t     lb            = vld1q_u8(lane_byte);
    const uint8x16_t     b0 = vld1q_u8(blk);
    const uint8x16_t     b1 = bits == 4 ? vld1q_u8(blk + 16) : b0;  // a 2-bit block is 24 bytes: no read past it
    uint8x16_t           hb = vdupq_n_u8(0);
    if (bits == 3) {
        const uint8x8_t h8 = vld1_u8(blk + 16);
        hb                 = vcombine_u8(h8, h8);
    }
    GGML_EXT_UNROLL
    for (int k = 0; k < 4; k++) {
        uint8x16_t idx;
        if (bits == 4) {
            const uint8x16_t b = k % 2 ? b1 : b0;
            idx                = k / 2 ? vshrq_n_u8(b, 4) : vandq_u8(b, vdupq_n_u8(15));
        } else {
            idx = vandq_u8(vshlq_u8(b0, vdupq_n_s8((int8_t) (-2 * k))), vdupq_n_u8(3));
            if (bits == 3) {
                const int8x16_t sh = vcombine_s8(vdup_n_s8((int8_t) (-2 * k)), vdup_n_s8((int8_t) (-2 * k - 1)));
                idx = vorrq_u8(idx, vshlq_n_u8(vandq_u8(vshlq_u8(hb, sh), vdupq_n_u8(1)), 2));
            }
        }
        const uint8x16_t i4 = vshlq_n_u8(idx, 2);
        GGML_EXT_UNROLL
        for (int q = 0; q < 4; q++) {
            const uint8x16_t  sel = vaddq_u8(vqtbl1q_u8(i4, vld1q_u8(spread[q])), lb);
            const float32x4_t t   = vreinterpretq_f32_u8(vqtbl4q_u8(tb, sel));
            const int         c   = 16 * k + 4 * q;
            if (mid) {
                hs = vld1q_f32(half + c);
                ms = vld1q_f32(mid + c);
            }
            vst1q_f32(y + c, affine(t, hs, ms));
        }
    }
}

void ggml_ext_kvquant_block_decode_neon(int bits, const void * blocks, int64_t n_blocks, size_t block_bytes,
                                        const float * table, const float * mid, const float * half, float * out) {
    const uint8x16x4_t tb = vld1q_u8_x4((const uint8_t *) table);
    for (int64_t i = 0; i < n_blocks; i++) {
        const uint8_t * blk = (const uint8_t *) blocks + (size_t) i * block_bytes;
        const float *   m   = mid ? mid + i * GGML_EXT_KVQUANT_BLOCK : NULL;
        const float *   h   = mid ? half + i * GGML_EXT_KVQUANT_BLOCK : NULL;
        float *         y   = out + i * GGML_EXT_KVQUANT_BLOCK;
        switch (bits) {  // constant bits inside: the per-step branches fold away
            case 4:
                decode_block(4, blk, tb, m, h, y);
                break;
            case 3:
                decode_block(3, blk, tb, m, h, y);
                break;
            default:
                decode_block(2, blk, tb, m, h, y);
                break;
        }
    }
}
#endif
