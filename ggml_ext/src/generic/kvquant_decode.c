// The scalar reference of the NUQ block decode (formats/kvquant/kvquant_decode.h): one slot at a time,
// through kvquant.h's index accessor; the SIMD decoders (x86/kvquant_decode_avx2.c, arm/kvquant_decode_neon.c)
// are tested against it (tests/c/test_nuq_decode.c).
#include "formats/kvquant/kvquant.h"
#include "formats/kvquant/kvquant_decode.h"

// the product rounded before the sum, as the SIMD decoders do: no fused multiply-add where the
// compiler would contract one (aarch64, x86 built with FMA)
#if defined(__GNUC__) && defined(__x86_64__)
#    define NO_FUSE(p) __asm__("" : "+x"(p))
#elif defined(__GNUC__) && defined(__aarch64__)
#    define NO_FUSE(p) __asm__("" : "+w"(p))
#else
#    define NO_FUSE(p) ((void) 0)
#endif

void ggml_ext_kvquant_block_decode_ref(int bits, const void * blocks, int64_t n_blocks, size_t block_bytes,
                                       const float * table, const float * mid, const float * half, float * out) {
    const size_t dense = (size_t) GGML_EXT_KVQUANT_BLOCK * bits / 8;
    for (int64_t i = 0; i < n_blocks; i++) {
        const uint8_t * blk = (const uint8_t *) blocks + (size_t) i * block_bytes;
        float *         y   = out + i * GGML_EXT_KVQUANT_BLOCK;
        if (mid) {
            const float * m = mid + i * GGML_EXT_KVQUANT_BLOCK, * h = half + i * GGML_EXT_KVQUANT_BLOCK;
            for (int c = 0; c < GGML_EXT_KVQUANT_BLOCK; c++) {
                float p = table[ggml_ext_kvquant_get(blk, bits, GGML_EXT_KVQUANT_BLOCK, c)] * h[c];
                NO_FUSE(p);
                y[c]          = p + m[c];
            }
        } else {
            uint16_t s[2];
            memcpy(s, blk + dense, sizeof(s));
            const float m = ggml_ext_fp16_to_fp32(s[0]), h = ggml_ext_fp16_to_fp32(s[1]);
            for (int c = 0; c < GGML_EXT_KVQUANT_BLOCK; c++) {
                float p = table[ggml_ext_kvquant_get(blk, bits, GGML_EXT_KVQUANT_BLOCK, c)] * h;
                NO_FUSE(p);
                y[c]          = p + m;
            }
        }
    }
}
