// Shared by the x86 kernels of the interleaved Q4_0 family (AVX2 and AVX-512 VNNI).
//
// x86 has no signed x signed byte dot product below AVX-VNNI-INT8, but it has
// unsigned x signed (pmaddubsw, vpdpbusd). XORing a stored byte with 0x88 gives back the
// original Q4_0 nibbles q = w + 8 (0..15), so sum(w * a) = sum(q * a) - 8 * sum(a).
// The -8 * sum(a) terms depend on the activations only: they are computed once per
// block and activation row into a small table (for a chunk of up to KC blocks) and
// reused by every column group, split the way the kernels' int32 lanes split a block
// (so every lane holds an exact partial dot product). The same table carries the
// activation deltas as floats.
#pragma once

#include "../q4_0_interleaved_impl.h"

#if defined(GGML_EXT_Q4_0_AVX2)

#    include <immintrin.h>

#define GGML_EXT_Q4_0_KC 128  // blocks per chunk of the shared dimension (4096 weights)

// Per block and activation row. dword l of a 32-byte activation row is bytes 4l..4l+3,
// P_l its sum. quad[g] = -8 (P_g + P_{g+4}), pair[e] = quad[e] + quad[e+2],
// full = pair[0] + pair[1] = -8 * sum(a).
typedef struct {
    int32_t quad[4];
    int32_t pair[2];
    int32_t full;
    float   d;
} ggml_ext_q4_0_act_sums;

static inline void ggml_ext_q4_0_act_sums_set(ggml_ext_q4_0_act_sums * t, const int32_t P[8], ggml_ext_fp16_t d) {
    for (int g = 0; g < 4; g++) {
        t->quad[g] = -8 * (P[g] + P[g + 4]);
    }
    t->pair[0] = t->quad[0] + t->quad[2];
    t->pair[1] = t->quad[1] + t->quad[3];
    t->full    = t->pair[0] + t->pair[1];
    t->d       = _cvtsh_ss(d);
}

// Sums of the 8 dwords of 32 signed bytes.
static inline __m256i ggml_ext_q4_0_dword_sums(__m256i v) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), v);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

// Table for nb plain Q8_0 blocks of one activation row.
static inline void ggml_ext_q4_0_prep_row(const ggml_ext_block_q8_0 * a, int nb, ggml_ext_q4_0_act_sums * t) {
    for (int b = 0; b < nb; b++) {
        int32_t P[8];
        _mm256_storeu_si256((__m256i *) P, ggml_ext_q4_0_dword_sums(_mm256_loadu_si256((const __m256i *) a[b].qs)));
        ggml_ext_q4_0_act_sums_set(&t[b], P, a[b].d);
    }
}

// Table t[b * 4 + r] for nb blocks of four interleaved rows (chunk B = 4 or 8).
static inline void ggml_ext_q4_0_prep_x4(const ggml_ext_block_q8_0x4 * a, int nb, int B, ggml_ext_q4_0_act_sums * t) {
    for (int b = 0; b < nb; b++) {
        int32_t D[32];  // D[m]: sum of dword m of the 128 interleaved bytes
        for (int v = 0; v < 4; v++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *) (a[b].qs + 32 * v));
            _mm256_storeu_si256((__m256i *) (D + 8 * v), ggml_ext_q4_0_dword_sums(x));
        }
        for (int r = 0; r < 4; r++) {
            int32_t P[8];
            for (int l = 0; l < 8; l++) {
                // dword l of row r: B = 4 -> chunk l; B = 8 -> half l%2 of chunk l/2
                P[l] = B == 4 ? D[4 * l + r] : D[(4 * (l / 2) + r) * 2 + l % 2];
            }
            ggml_ext_q4_0_act_sums_set(&t[b * 4 + r], P, a[b].d[r]);
        }
    }
}

static inline int ggml_ext_q4_0_min(int a, int b) {
    return a < b ? a : b;
}

static inline __m256i ggml_ext_q4_0_bcast64(const void * p) {
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi64x(v);
}

#endif  // GGML_EXT_Q4_0_AVX2
