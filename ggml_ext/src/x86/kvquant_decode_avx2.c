// NUQ block decode, AVX2 (scalar twin: ../generic/kvquant_decode.c; bytes: formats/kvquant/kvquant_decode.h).
// Eight slots per step: their eight index bytes widened to 32-bit lanes and shifted to the slot's bit
// field (B = 4: bytes 8g % 32, nibble g / 4; B = 2, 3: bytes 8g % 16, bits 2 (g / 2); B = 3 adds bit g
// of bytes 16..23 as bit 2), the table as one or two 8-lane permutes, then * half + mid with the
// product rounded first (an empty asm keeps the compiler from fusing it into an FMA).
#include "formats/kvquant/kvquant_decode.h"
#include "common/simd.h"

#if defined(GGML_EXT_HAVE_AVX2)
#    include <immintrin.h>
#    include <string.h>

#    define INLINE GGML_EXT_INLINE

INLINE __m256i widen8(const uint8_t * p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) p));
}

INLINE __m256 affine(__m256 t, __m256 h, __m256 m) {
    __m256 p = _mm256_mul_ps(t, h);
    __asm__("" : "+x"(p));
    return _mm256_add_ps(p, m);
}

INLINE void decode_block(int bits, const uint8_t * blk, __m256 t_lo, __m256 t_hi, const float * mid,
                         const float * half, float * y) {
    __m256 hs = _mm256_setzero_ps(), ms = _mm256_setzero_ps();
    if (!mid) {
        uint16_t s[2];
        memcpy(s, blk + GGML_EXT_KVQUANT_BLOCK * bits / 8, sizeof(s));
        ms = _mm256_set1_ps(_cvtsh_ss(s[0]));
        hs = _mm256_set1_ps(_cvtsh_ss(s[1]));
    }
    const __m256i three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1), fifteen = _mm256_set1_epi32(15);
    const __m256i hb = bits == 3 ? widen8(blk + 16) : _mm256_setzero_si256();
    GGML_EXT_UNROLL
    for (int g = 0; g < 8; g++) {
        __m256 t;
        if (bits == 4) {
            const __m256i idx = _mm256_and_si256(
                _mm256_srl_epi32(widen8(blk + (8 * g) % 32), _mm_cvtsi32_si128(4 * (g / 4))), fifteen);
            const __m256 a = _mm256_permutevar8x32_ps(t_lo, idx);
            const __m256 b = _mm256_permutevar8x32_ps(t_hi, idx);
            t = _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
        } else {
            __m256i idx = _mm256_and_si256(
                _mm256_srl_epi32(widen8(blk + (8 * g) % 16), _mm_cvtsi32_si128(2 * (g / 2))), three);
            if (bits == 3) {
                idx = _mm256_or_si256(
                    idx, _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(hb, _mm_cvtsi32_si128(g)), one), 2));
            }
            t = _mm256_permutevar8x32_ps(t_lo, idx);
        }
        if (mid) {
            hs = _mm256_loadu_ps(half + 8 * g);
            ms = _mm256_loadu_ps(mid + 8 * g);
        }
        _mm256_storeu_ps(y + 8 * g, affine(t, hs, ms));
    }
}

void ggml_ext_kvquant_block_decode_avx2(int bits, const void * blocks, int64_t n_blocks, size_t block_bytes,
                                        const float * table, const float * mid, const float * half, float * out) {
    const __m256 t_lo = _mm256_loadu_ps(table), t_hi = _mm256_loadu_ps(table + 8);
    for (int64_t i = 0; i < n_blocks; i++) {
        const uint8_t * blk = (const uint8_t *) blocks + (size_t) i * block_bytes;
        const float *   m   = mid ? mid + i * GGML_EXT_KVQUANT_BLOCK : NULL;
        const float *   h   = mid ? half + i * GGML_EXT_KVQUANT_BLOCK : NULL;
        float *         y   = out + i * GGML_EXT_KVQUANT_BLOCK;
        switch (bits) {  // constant bits inside: the per-step branches fold away
            case 4:
                decode_block(4, blk, t_lo, t_hi, m, h, y);
                break;
            case 3:
                decode_block(3, blk, t_lo, t_hi, m, h, y);
                break;
            default:
                decode_block(2, blk, t_lo, t_hi, m, h, y);
                break;
        }
    }
}
#endif
