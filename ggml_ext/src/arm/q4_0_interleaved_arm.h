// Shared by the Arm kernels of the interleaved Q4_0 family (NEON dotprod and i8mm).
//
// Weights: the stored byte is the Q4_0 byte XOR 0x88, so each nibble is the signed weight
// w = q - 8; (byte << 4) and (byte & 0xf0) are the two weights times 16 as int8, and the
// int32 dot product is divided by 16 once, inside the int -> float conversion
// (vcvtq_n_f32_s32 with 4 fractional bits, exact).
#pragma once

#include "../q4_0_interleaved_impl.h"

#if defined(GGML_EXT_Q4_0_NEON_DOTPROD)

#    include <arm_neon.h>

#    define INLINE GGML_EXT_INLINE

INLINE int8x16_t lo16(int8x16_t b) {  // low nibble weights times 16
    return vshlq_n_s8(b, 4);
}

INLINE int8x16_t hi16(int8x16_t b) {  // high nibble weights times 16
    return vandq_s8(b, vdupq_n_s8((int8_t) 0xf0));
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

#endif  // GGML_EXT_Q4_0_NEON_DOTPROD
