// Decode of the NUQ4 / NUQ3 / NUQ2 cache blocks (docs/KVQUANT.md "In llama.cpp's cache"): the
// function boundary between the types' row functions (backend/kvquant_base.c, ggml-base: to_float of a
// value head per cell, of a pre-RoPE key row) and the SIMD decoders (x86/kvquant_decode_avx2.c,
// arm/kvquant_decode_neon.c, ggml-cpu), which ggml-cpu hands to ggml-base when it loads
// (ggml_ext_kvquant_set_block_decoder; backend/kvquant_cpu.c).
//
// A block is 64 B-bit indices in kvquant.h's slot order for head_dim 64 (B = 4: byte s % 32, nibble
// s / 32; B = 2: byte s % 16, bits 2 (s / 16); B = 3: the low two bits as B = 2, bit 2 at byte
// 16 + s % 8, bit s / 8), then fp16 mid, fp16 half, u16 kept / dropped outlier counts; block_bytes
// apart (40 / 32 / 24 for B = 4 / 3 / 2). One call decodes n_blocks consecutive blocks:
//   out[64 i + c] = table[index of slot c of block i] * half + mid
// (table: 16 readable floats, the first 2^B used) with the block's own fp16 mid / half (values:
// mid == NULL) or the channel's mid[64 i + c] / half[64 i + c] (keys: per-channel calibrated scales,
// the block's fields unused). The product is rounded before the sum (no fused multiply-add), so every
// decoder gives the scalar reference's bits. Outlier slots are not applied: the caller applies them
// where a block counts any.
#pragma once

#include "ggml-ext.h"

#include <stddef.h>
#include <stdint.h>

#define GGML_EXT_KVQUANT_BLOCK 64

typedef void (*ggml_ext_kvquant_decode_fn)(int bits, const void * blocks, int64_t n_blocks, size_t block_bytes,
                                           const float * table, const float * mid, const float * half, float * out);

// The scalar reference (generic/kvquant_decode.c, ggml-base).
GGML_EXT_API void ggml_ext_kvquant_block_decode_ref(int bits, const void * blocks, int64_t n_blocks, size_t block_bytes,
                                                    const float * table, const float * mid, const float * half,
                                                    float * out);
// The SIMD decoders, where the target compiles them (common/simd.h: GGML_EXT_HAVE_AVX2 / _NEON).
GGML_EXT_API void ggml_ext_kvquant_block_decode_avx2(int bits, const void * blocks, int64_t n_blocks, size_t block_bytes,
                                                     const float * table, const float * mid, const float * half,
                                                     float * out);
GGML_EXT_API void ggml_ext_kvquant_block_decode_neon(int bits, const void * blocks, int64_t n_blocks, size_t block_bytes,
                                                     const float * table, const float * mid, const float * half,
                                                     float * out);

// ggml-base: the decoder the NUQ types' to_float uses (NULL: the scalar reference) and its name, for
// the tests and the kernel report. GGML_EXT_KVQ_DECODE=ref in the environment keeps the reference.
GGML_EXT_API void         ggml_ext_kvquant_set_block_decoder(ggml_ext_kvquant_decode_fn fn, const char * name);
GGML_EXT_API const char * ggml_ext_kvquant_block_decoder(void);
