// AVX-512 VNNI kernels of the interleaved Q4_0 family: GEMV/GEMM for Q4_0_4_4,
// Q4_0_4_8 and Q4_0_8_8 on 64-byte vectors with vpdpbusd (u8 x s8 -> s32, no
// saturation). One 64-byte load holds a whole Q4_0_4_x block or half a Q4_0_8_8 block;
// each column keeps 2 (B = 8) or 4 (B = 4) int32 lanes through the float accumulation,
// whose sums are formed once at the end. The int32 accumulator of a block starts at the
// -8 * sum(a) correction of its lanes (table in interleaved4_x86.h).
// Activation quantizers are the AVX2 ones. Scalar twins: ../generic/.
//
// Interleaved IQ4_NL runs the same kernels (fam = 1): the nibbles index kvalues + 128
// (1..241, unsigned) with one vpshufb each instead of the XOR, and the correction is
// -128 * sum(a) (tables built with m = 128); everything else is shared.
#include "x86/interleaved4_x86.h"

#if defined(GGML_EXT_HAVE_AVX512VNNI)

#    define INLINE GGML_EXT_INLINE

typedef ggml_ext_interleaved4_act_sums    act_sums;
typedef ggml_ext_interleaved4_act_sums_x4 act_sums_x4;

// 64 stored bytes -> unsigned weights for vpdpbusd. fam 0 (Q4_0): the original nibbles
// (0..15), (x ^ 0x88) & 0x0f in one ternlog. fam 1 (IQ4_NL): kvalues[nibble] + 128.
INLINE void unpack(int fam, const uint8_t * p, __m512i * lo, __m512i * hi) {
    const __m512i raw = _mm512_loadu_si512((const void *) p);
    const __m512i m   = _mm512_set1_epi8(0x0f);
    if (fam) {
        const __m512i tbl = _mm512_broadcast_i32x4(ggml_ext_iq4_nl_table(1));
        *lo               = _mm512_shuffle_epi8(tbl, _mm512_and_si512(raw, m));
        *hi               = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m));
        return;
    }
    const __m512i x88 = _mm512_set1_epi8((char) 0x88);
    *lo               = _mm512_ternarylogic_epi32(raw, x88, m, 0x28);  // (a ^ b) & c
    *hi               = _mm512_ternarylogic_epi32(_mm512_srli_epi16(raw, 4), x88, m, 0x28);
}

INLINE __m512i bcast64(const void * p) {
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi64(v);
}

INLINE __m512i load128(const void * p) {
    return _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *) p));
}

INLINE __m512 scales4(const uint8_t * blk, float da) {  // four weight deltas times da
    return _mm512_castps128_ps512(_mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *) blk)), _mm_set1_ps(da)));
}

INLINE __m256 hi256(__m512 v) {  // AVX512F only (no DQ)
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

INLINE void store4(float * out, __m128 v, int add) {
    _mm_storeu_ps(out, add ? _mm_add_ps(v, _mm_loadu_ps(out)) : v);
}

// 16 lanes, column c at lanes 2c, 2c+1 -> 8 columns
INLINE void store_pairs8(float * out, __m512 acc, int add) {
    const __m512 t = _mm512_add_ps(acc, _mm512_permute_ps(acc, 0xb1));
    const __m256 v = _mm512_castps512_ps256(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), t));
    _mm256_storeu_ps(out, add ? _mm256_add_ps(v, _mm256_loadu_ps(out)) : v);
}

// 16 lanes, column c at lanes 2c, 2c+1, 8+2c, 9+2c -> 4 columns
INLINE void store_pairs4(float * out, __m512 acc, int add) {
    const __m512 t = _mm512_add_ps(acc, _mm512_permute_ps(acc, 0xb1));
    const __m256 u = _mm256_add_ps(_mm512_castps512_ps256(t), hi256(t));
    const __m256 v = _mm256_permutevar8x32_ps(u, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0));
    store4(out, _mm256_castps256_ps128(v), add);
}

// 16 lanes, column c at lanes c, 4+c, 8+c, 12+c -> 4 columns
INLINE void store_quads4(float * out, __m512 acc, int add) {
    const __m256 u = _mm256_add_ps(_mm512_castps512_ps256(acc), hi256(acc));
    store4(out, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)), add);
}

// ---------------------------------------------------------------- Q4_0_8_8

static const int32_t idx_pairs8[16] = { 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7 };

// lanes 2c, 2c+1: column c; int32 lanes meet activation dwords (0, 2, 4, 6) and (1, 3, 5, 7)
INLINE __m512i dot_8x8(const __m512i W[4], __m512i acc, __m512i A0, __m512i A1, __m512i A2, __m512i A3) {
    acc = _mm512_dpbusd_epi32(acc, W[0], A0);  // bytes 0-7 low nibbles: weights 0-7
    acc = _mm512_dpbusd_epi32(acc, W[2], A1);  // bytes 8-15 low: weights 8-15
    acc = _mm512_dpbusd_epi32(acc, W[1], A2);  // bytes 0-7 high: weights 16-23
    return _mm512_dpbusd_epi32(acc, W[3], A3);
}

INLINE __m512 scales8(const uint8_t * blk) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) blk));
    return _mm512_permutexvar_ps(_mm512_loadu_si512(idx_pairs8), _mm512_castps256_ps512(d));
}

INLINE void gemv_group_8x8_f(int fam, const act_sums * t, const ggml_ext_block_q8_0 * a, const uint8_t * w, int kn, float * out, int add) {
    const size_t blk = sizeof(ggml_ext_block_q4_0x8);
    __m512       acc = _mm512_setzero_ps();
    for (int b = 0; b < kn; b++, w += blk) {
        const int8_t * q = a[b].qs;
        __m512i        W[4];
        unpack(fam, w + 16, &W[0], &W[1]);
        unpack(fam, w + 80, &W[2], &W[3]);
        const __m512i p  = dot_8x8(W, bcast64(t[b].pair), bcast64(q), bcast64(q + 8), bcast64(q + 16), bcast64(q + 24));
        const __m512  sc = _mm512_mul_ps(scales8(w), _mm512_set1_ps(t[b].d));
        acc              = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc);
    }
    store_pairs8(out, acc, add);
}

INLINE void gemm_tile_8x8_f(int fam, const act_sums_x4 * t, const ggml_ext_block_q8_0x4 * a, const uint8_t * w, int kn, float * s,
                          size_t bs, int add) {
    const size_t blk    = sizeof(ggml_ext_block_q4_0x8);
    __m512       acc[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps() };
    for (int b = 0; b < kn; b++, w += blk) {
        const int8_t * q = a[b].qs;  // chunk c of row r at q + 8 (4c + r)
        __m512i        W[4];
        unpack(fam, w + 16, &W[0], &W[1]);
        unpack(fam, w + 80, &W[2], &W[3]);
        const __m512 sc = scales8(w);
        GGML_EXT_UNROLL
        for (int r = 0; r < 4; r++) {
            const __m512i p = dot_8x8(W, bcast64(t[b].pair[r]), bcast64(q + 8 * r), bcast64(q + 8 * (4 + r)),
                                      bcast64(q + 8 * (8 + r)), bcast64(q + 8 * (12 + r)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sc, _mm512_set1_ps(t[b].d[r])), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        store_pairs8(s + (size_t) r * bs, acc[r], add);
    }
}

// ---------------------------------------------------------------- Q4_0_4_8

// One load: columns 0-3 of chunk 0 (bytes 0-7) in lanes 0-7, of chunk 1 (bytes 8-15) in
// lanes 8-15, two lanes per column. Activation: chunk 0 in the low half, 1 in the high
// (2 and 3 for the high nibbles).
static const int64_t idx_halves[8]  = { 0, 0, 0, 0, 1, 1, 1, 1 };
static const int32_t idx_pairs4[16] = { 0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3 };

INLINE __m512i dot_4x8(__m512i acc, __m512i Wlo, __m512i Alo, __m512i Whi, __m512i Ahi) {
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, Wlo, Alo), Whi, Ahi);
}

INLINE __m512i corr_4x8(const int32_t quad[4]) {  // lanes 0-7: quad 0, 1; lanes 8-15: quad 2, 3
    return _mm512_permutexvar_epi64(_mm512_loadu_si512(idx_halves), load128(quad));
}

INLINE void gemv_group_4x8_f(int fam, const act_sums * t, const ggml_ext_block_q8_0 * a, const uint8_t * w, int kn, float * out, int add) {
    const size_t  blk = sizeof(ggml_ext_block_q4_0x4);
    const __m512i ih  = _mm512_loadu_si512(idx_halves);
    const __m512i ip  = _mm512_loadu_si512(idx_pairs4);
    __m512        acc = _mm512_setzero_ps();
    for (int b = 0; b < kn; b++, w += blk) {
        const int8_t * q = a[b].qs;
        __m512i        lo, hi;
        unpack(fam, w + 8, &lo, &hi);
        const __m512i p  = dot_4x8(corr_4x8(t[b].quad), lo, _mm512_permutexvar_epi64(ih, load128(q)), hi,
                                   _mm512_permutexvar_epi64(ih, load128(q + 16)));
        const __m512  sc = _mm512_permutexvar_ps(ip, scales4(w, t[b].d));
        acc              = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc);
    }
    store_pairs4(out, acc, add);
}

INLINE void gemm_tile_4x8_f(int fam, const act_sums_x4 * t, const ggml_ext_block_q8_0x4 * a, const uint8_t * w, int kn, float * s,
                          size_t bs, int add) {
    const size_t  blk    = sizeof(ggml_ext_block_q4_0x4);
    const __m512i ip     = _mm512_loadu_si512(idx_pairs4);
    __m512        acc[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps() };
    for (int b = 0; b < kn; b++, w += blk) {
        // 64-bit lanes of Q0: chunk 0 of rows 0-3, chunk 1 of rows 0-3; Q1: chunks 2, 3
        const __m512i Q0 = _mm512_loadu_si512((const void *) a[b].qs);
        const __m512i Q1 = _mm512_loadu_si512((const void *) (a[b].qs + 64));
        __m512i       lo, hi;
        unpack(fam, w + 8, &lo, &hi);
        const __m512 dw = _mm512_permutexvar_ps(ip, scales4(w, 1.0f));
        GGML_EXT_UNROLL
        for (int r = 0; r < 4; r++) {
            const __m512i idx = _mm512_setr_epi64(r, r, r, r, 4 + r, 4 + r, 4 + r, 4 + r);
            const __m512i p   = dot_4x8(corr_4x8(t[b].quad[r]), lo, _mm512_permutexvar_epi64(idx, Q0), hi,
                                        _mm512_permutexvar_epi64(idx, Q1));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, _mm512_set1_ps(t[b].d[r])), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        store_pairs4(s + (size_t) r * bs, acc[r], add);
    }
}

// ---------------------------------------------------------------- Q4_0_4_4

// One load: lane l holds column l%4, bytes 4(l/4)..: low nibbles meet activation dword
// l/4, high nibbles dword l/4 + 4. Column c sums lanes c, 4+c, 8+c, 12+c.
static const int32_t idx_quads[16] = { 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3 };

INLINE void gemv_group_4x4_f(int fam, const act_sums * t, const ggml_ext_block_q8_0 * a, const uint8_t * w, int kn, float * out, int add) {
    const size_t  blk = sizeof(ggml_ext_block_q4_0x4);
    const __m512i iq  = _mm512_loadu_si512(idx_quads);
    __m512        acc = _mm512_setzero_ps();
    for (int b = 0; b < kn; b++, w += blk) {
        const int8_t * q = a[b].qs;
        __m512i        lo, hi;
        unpack(fam, w + 8, &lo, &hi);
        __m512i p       = _mm512_permutexvar_epi32(iq, load128(t[b].quad));
        p               = _mm512_dpbusd_epi32(p, lo, _mm512_permutexvar_epi32(iq, load128(q)));
        p               = _mm512_dpbusd_epi32(p, hi, _mm512_permutexvar_epi32(iq, load128(q + 16)));
        const __m512 sc = _mm512_broadcast_f32x4(_mm512_castps512_ps128(scales4(w, t[b].d)));
        acc             = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc);
    }
    store_quads4(out, acc, add);
}

INLINE void gemm_tile_4x4_f(int fam, const act_sums_x4 * t, const ggml_ext_block_q8_0x4 * a, const uint8_t * w, int kn, float * s,
                          size_t bs, int add) {
    const size_t  blk    = sizeof(ggml_ext_block_q4_0x4);
    const __m512i iq     = _mm512_loadu_si512(idx_quads);
    __m512        acc[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps() };
    for (int b = 0; b < kn; b++, w += blk) {
        // dword 4l + r of the activations is dword l of row r: Q0 holds l = 0-3, Q1 l = 4-7
        const __m512i Q0 = _mm512_loadu_si512((const void *) a[b].qs);
        const __m512i Q1 = _mm512_loadu_si512((const void *) (a[b].qs + 64));
        __m512i       lo, hi;
        unpack(fam, w + 8, &lo, &hi);
        const __m512 dw = _mm512_broadcast_f32x4(_mm512_castps512_ps128(scales4(w, 1.0f)));
        GGML_EXT_UNROLL
        for (int r = 0; r < 4; r++) {
            const __m512i idx = _mm512_add_epi32(_mm512_slli_epi32(iq, 2), _mm512_set1_epi32(r));
            __m512i       p   = _mm512_permutexvar_epi32(iq, load128(t[b].quad[r]));
            p                 = _mm512_dpbusd_epi32(p, lo, _mm512_permutexvar_epi32(idx, Q0));
            p                 = _mm512_dpbusd_epi32(p, hi, _mm512_permutexvar_epi32(idx, Q1));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, _mm512_set1_ps(t[b].d[r])), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        store_quads4(s + (size_t) r * bs, acc[r], add);
    }
}

// ---------------------------------------------------------------- entry points

// The values' flag V, then the correction multiplier of the tables (Q4_0 8, IQ4_NL 128: vpdpbusd
// needs unsigned weights, see x86/interleaved4_x86.h).
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx512, q4_0, 4, 4, 8, gemv_group_4x4_f, gemm_tile_4x4_f, 0)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx512, q4_0, 4, 8, 8, gemv_group_4x8_f, gemm_tile_4x8_f, 0)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx512, q4_0, 8, 8, 8, gemv_group_8x8_f, gemm_tile_8x8_f, 0)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx512, iq4_nl, 4, 4, 128, gemv_group_4x4_f, gemm_tile_4x4_f, 1)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx512, iq4_nl, 4, 8, 128, gemv_group_4x8_f, gemm_tile_4x8_f, 1)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx512, iq4_nl, 8, 8, 128, gemv_group_8x8_f, gemm_tile_8x8_f, 1)

const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_avx512vnni = {
    .name                  = "avx512-vnni",
    .quantize_row_q8_0     = NULL,  // the AVX2 quantizers are as fast (memory bound)
    .quantize_mat_q8_0_4x4 = NULL,
    .quantize_mat_q8_0_4x8 = NULL,
    .gemv                  = GGML_EXT_INTERLEAVED4_TABLE(gemv, avx512),
    .gemm                  = GGML_EXT_INTERLEAVED4_TABLE(gemm, avx512),
};

#else
typedef int ggml_ext_interleaved4_x86_avx512_not_compiled;  // ISO C: no empty translation unit
#endif
