// Shared by the x86 kernels of the interleaved Q4_0 and IQ4_NL families (AVX2, AVX-512 VNNI).
//
// x86 has no signed x signed byte dot product below AVX-VNNI-INT8, but it has
// unsigned x signed (pmaddubsw, vpdpbusd). XORing a stored byte with 0x88 gives back the
// original Q4_0 nibbles q = w + 8 (0..15), so sum(w * a) = sum(q * a) - 8 * sum(a).
// The -8 * sum(a) terms depend on the activations only: they are computed once per
// block and activation row into a table and reused by every column group, split the way
// the kernels' int32 lanes split a block (so every lane holds an exact partial dot
// product). The same table carries the activation deltas as floats. IQ4_NL kernels that
// use vpdpbusd store kvalues + 128 (1..241) and need -128 * sum(a) instead: the table's
// multiplier m is 8 or 128 (a kernel that needs no correction ignores it).
//
// GEMV tables cover up to KC_GEMV blocks (the whole row in practice: a chunked row would
// be read in strided pieces, which halves the memory bandwidth). GEMM tables cover
// KC_GEMM blocks of one 4-row tile, and GEMM walks the columns in blocks of about
// COLBLOCK_BYTES of weights, so that a block stays in L2 while every tile passes over it.
#pragma once

#include "formats/interleaved4/interleaved4_impl.h"

#if defined(GGML_EXT_HAVE_AVX2)

#    include <immintrin.h>

#    define GGML_EXT_INTERLEAVED4_KC_GEMV        1024  // blocks: K up to 32768 in one pass (32 KiB of table)
#    define GGML_EXT_INTERLEAVED4_KC_GEMM        128   // blocks per tile table (18 KiB)
#    define GGML_EXT_INTERLEAVED4_COLBLOCK_BYTES (256 * 1024)

// dword l of a 32-byte activation row is bytes 4l..4l+3, P_l its sum.
// quad[g] = -m (P_g + P_{g+4}), pair[e] = quad[e] + quad[e+2], full = -m * sum(a).

// One activation row, one block (GEMV).
typedef struct {
    int32_t quad[4];
    int32_t pair[2];
    int32_t full;
    float   d;
} ggml_ext_interleaved4_act_sums;

// Four interleaved activation rows, one block (GEMM); row r's entries at index r.
typedef struct {
    int32_t pair[4][2];
    int32_t quad[4][4];
    int32_t full[4][2];  // [r][0]
    float   d[4];
} ggml_ext_interleaved4_act_sums_x4;

// Sums of the 8 dwords of 32 signed bytes.
static inline __m256i ggml_ext_interleaved4_dword_sums(__m256i v) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), v);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

static inline __m256i ggml_ext_interleaved4_times_minus(__m256i v, int m) {
    return _mm256_mullo_epi32(v, _mm256_set1_epi32(-m));
}

// Table for nb plain Q8_0 blocks of one activation row.
static inline void ggml_ext_interleaved4_prep_row(const ggml_ext_block_q8_0 * a, int nb, int m, ggml_ext_interleaved4_act_sums * t) {
    for (int b = 0; b < nb; b++) {
        int32_t P[8];
        _mm256_storeu_si256((__m256i *) P, ggml_ext_interleaved4_dword_sums(_mm256_loadu_si256((const __m256i *) a[b].qs)));
        for (int g = 0; g < 4; g++) {
            t[b].quad[g] = -m * (P[g] + P[g + 4]);
        }
        t[b].pair[0] = t[b].quad[0] + t[b].quad[2];
        t[b].pair[1] = t[b].quad[1] + t[b].quad[3];
        t[b].full    = t[b].pair[0] + t[b].pair[1];
        t[b].d       = _cvtsh_ss(a[b].d);
    }
}

// Table for nb blocks of four rows interleaved with chunk B = 4 or 8. The four 32-byte
// loads of a block give dword sums D[v]; B = 8: D[v] holds chunk v (P_2v, P_2v+1) of rows
// 0-3 as [r0 r0 r1 r1 r2 r2 r3 r3]; B = 4: D[v] holds P_2v of rows 0-3, then P_2v+1.
static inline void ggml_ext_interleaved4_prep_x4(const ggml_ext_block_q8_0x4 * a, int nb, int B, int m,
                                         ggml_ext_interleaved4_act_sums_x4 * t) {
    const __m256i rows_pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // B = 4 -> B = 8 lane order
    for (int b = 0; b < nb; b++) {
        __m256i D[4];
        for (int v = 0; v < 4; v++) {
            D[v] = ggml_ext_interleaved4_dword_sums(_mm256_loadu_si256((const __m256i *) (a[b].qs + 32 * v)));
        }
        // per row r, lanes 2r, 2r+1: q01 = (quad0, quad1), q23 = (quad2, quad3)
        __m256i q01 = _mm256_add_epi32(D[0], D[2]);
        __m256i q23 = _mm256_add_epi32(D[1], D[3]);
        if (B == 4) {
            q01 = _mm256_permutevar8x32_epi32(q01, rows_pairs);
            q23 = _mm256_permutevar8x32_epi32(q23, rows_pairs);
        }
        q01                = ggml_ext_interleaved4_times_minus(q01, m);
        q23                = ggml_ext_interleaved4_times_minus(q23, m);
        const __m256i pair = _mm256_add_epi32(q01, q23);
        const __m256i full = _mm256_add_epi32(pair, _mm256_shuffle_epi32(pair, 0xb1));
        const __m256i lo   = _mm256_unpacklo_epi64(q01, q23);  // rows 0 and 2: quad0..3
        const __m256i hi   = _mm256_unpackhi_epi64(q01, q23);  // rows 1 and 3
        _mm256_storeu_si256((__m256i *) t[b].pair, pair);
        _mm256_storeu_si256((__m256i *) t[b].quad[0], _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *) t[b].quad[2], _mm256_permute2x128_si256(lo, hi, 0x31));
        _mm256_storeu_si256((__m256i *) t[b].full, full);
        _mm_storeu_ps(t[b].d, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *) a[b].d)));
    }
}

// Row groups per column block of GEMM (a block of about COLBLOCK_BYTES of weights).
static inline int ggml_ext_interleaved4_colblock(int nb, size_t blk) {
    const size_t group = (size_t) nb * blk;
    return group >= GGML_EXT_INTERLEAVED4_COLBLOCK_BYTES ? 1 : (int) (GGML_EXT_INTERLEAVED4_COLBLOCK_BYTES / group);
}

static inline int ggml_ext_interleaved4_min(int a, int b) {
    return a < b ? a : b;
}

// One row group of N columns against one activation row over kn blocks (w, a, t at the
// chunk's first block); writes (add == 0) or adds to out[0 .. N).
typedef void (*ggml_ext_interleaved4_gemv_group_fn)(const ggml_ext_interleaved4_act_sums * t, const ggml_ext_block_q8_0 * a,
                                            const uint8_t * w, int kn, float * out, int add);

// One row group of N columns against one 4-row tile over kn blocks; s[r * bs + c].
typedef void (*ggml_ext_interleaved4_gemm_tile_fn)(const ggml_ext_interleaved4_act_sums_x4 * t, const ggml_ext_block_q8_0x4 * a,
                                           const uint8_t * w, int kn, float * s, size_t bs, int add);

// m: the correction multiplier of the tables (8 or 128, see the top).
static inline void ggml_ext_interleaved4_gemv_driver(int N, int m, ggml_ext_interleaved4_gemv_group_fn group, int n, float * s, size_t bs,
                                             const void * vx, const void * vy, int nr, int nc) {
    const int              nb  = n / 32;
    const size_t           blk = (size_t) N * sizeof(ggml_ext_block_q4_0);
    ggml_ext_interleaved4_act_sums t[GGML_EXT_INTERLEAVED4_KC_GEMV];
    for (int y = 0; y < nr; y++) {
        const ggml_ext_block_q8_0 * a = (const ggml_ext_block_q8_0 *) vy + (size_t) y * nb;
        for (int kb = 0; kb < nb; kb += GGML_EXT_INTERLEAVED4_KC_GEMV) {
            const int kn = ggml_ext_interleaved4_min(GGML_EXT_INTERLEAVED4_KC_GEMV, nb - kb);
            ggml_ext_interleaved4_prep_row(a + kb, kn, m, t);
            for (int g = 0; g < nc / N; g++) {
                group(t, a + kb, (const uint8_t *) vx + ((size_t) g * nb + kb) * blk, kn, s + (size_t) y * bs + (size_t) g * N,
                      kb > 0);
            }
        }
    }
}

// Column blocks outermost: a block's weights stay in L2 while all tiles pass over them.
static inline void ggml_ext_interleaved4_gemm_driver(int N, int B, int m, ggml_ext_interleaved4_gemm_tile_fn tile, int n, float * s,
                                             size_t bs, const void * vx, const void * vy, int nr, int nc) {
    const int                 nb  = n / 32, ng = nc / N;
    const size_t              blk = (size_t) N * sizeof(ggml_ext_block_q4_0);
    const int                 GB  = ggml_ext_interleaved4_colblock(nb, blk);
    ggml_ext_interleaved4_act_sums_x4 t[GGML_EXT_INTERLEAVED4_KC_GEMM];
    for (int g0 = 0; g0 < ng; g0 += GB) {
        const int g1 = ggml_ext_interleaved4_min(ng, g0 + GB);
        for (int ti = 0; ti < nr / 4; ti++) {
            const ggml_ext_block_q8_0x4 * a = (const ggml_ext_block_q8_0x4 *) vy + (size_t) ti * nb;
            for (int kb = 0; kb < nb; kb += GGML_EXT_INTERLEAVED4_KC_GEMM) {
                const int kn = ggml_ext_interleaved4_min(GGML_EXT_INTERLEAVED4_KC_GEMM, nb - kb);
                ggml_ext_interleaved4_prep_x4(a + kb, kn, B, m, t);
                for (int g = g0; g < g1; g++) {
                    tile(t, a + kb, (const uint8_t *) vx + ((size_t) g * nb + kb) * blk, kn,
                         s + (size_t) 4 * ti * bs + (size_t) g * N, bs, kb > 0);
                }
            }
        }
    }
}

// The entry points of one (values, layout): a group (GEMV) and a tile (GEMM) function with the
// body's constant arguments bound (the trailing arguments: the values' flag, then any of the
// layout's own), and the GEMV and GEMM under the drivers above with table multiplier M. Named
// gemv_<values>_<N>x<B>_<isa> / gemm_..., as GGML_EXT_INTERLEAVED4_TABLE expects.
#    define GGML_EXT_INTERLEAVED4_X86_ENTRIES(isa, values, N, B, M, group_body, tile_body, ...)                                  \
        static void gemv_group_##values##_##N##x##B(const ggml_ext_interleaved4_act_sums * t, const ggml_ext_block_q8_0 * a,  \
                                                    const uint8_t * w, int kn, float * out, int add) {             \
            group_body(__VA_ARGS__, t, a, w, kn, out, add);                                                        \
        }                                                                                                          \
        static void gemm_tile_##values##_##N##x##B(const ggml_ext_interleaved4_act_sums_x4 * t, const ggml_ext_block_q8_0x4 * a, \
                                                   const uint8_t * w, int kn, float * s, size_t bs, int add) {     \
            tile_body(__VA_ARGS__, t, a, w, kn, s, bs, add);                                                       \
        }                                                                                                          \
        static void gemv_##values##_##N##x##B##_##isa(GGML_EXT_INTERLEAVED4_MM_ARGS) {                                       \
            ggml_ext_interleaved4_gemv_driver(N, M, gemv_group_##values##_##N##x##B, n, s, bs, vx, vy, nr, nc);              \
        }                                                                                                          \
        static void gemm_##values##_##N##x##B##_##isa(GGML_EXT_INTERLEAVED4_MM_ARGS) {                                       \
            ggml_ext_interleaved4_gemm_driver(N, B, M, gemm_tile_##values##_##N##x##B, n, s, bs, vx, vy, nr, nc);            \
        }

static inline __m256i ggml_ext_interleaved4_bcast64(const void * p) {
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi64x(v);
}

// The IQ4_NL table in every 128-bit lane, for pshufb: kvalues (signed), or kvalues + 128
// (unsigned, for vpdpbusd).
static inline __m128i ggml_ext_iq4_nl_table(int plus128) {
    const __m128i kv = _mm_setr_epi8(GGML_EXT_IQ4_NL_VALUES);
    return plus128 ? _mm_xor_si128(kv, _mm_set1_epi8((char) 0x80)) : kv;  // + 128 mod 256 == ^ 0x80
}

#endif  // GGML_EXT_HAVE_AVX2
