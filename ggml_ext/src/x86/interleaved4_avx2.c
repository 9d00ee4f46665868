// AVX2 kernels of the interleaved Q4_0 family: Q8_0 activation quantizers and
// GEMV/GEMM for Q4_0_4_4, Q4_0_4_8 and Q4_0_8_8. Scalar twins: ../generic/.
//
// Weights: byte ^ 0x88 gives the original nibbles q = w + 8, multiplied with signed
// activations by pmaddubsw (four products per int16 lane sum stay below 2^15), the
// -8 * sum(a) term comes from the activation table (interleaved4_x86.h).
// Q4_0_4_8 and Q4_0_8_8 keep two int32 lanes per column (the two 4-byte halves of each
// 8-byte chunk) through the float accumulation and add them once at the end.
//
// Interleaved IQ4_NL runs the same kernels with fam = 1: one pshufb per 32 bytes decodes
// the nibbles to the signed kvalues, and as |kvalue| * |a| pairs can reach 2 * 127 * 127,
// each pmaddubsw takes |w| and sign(a, w) and is widened to int32 at once (pmaddwd);
// no correction term.
#include "x86/interleaved4_x86.h"

#if defined(GGML_EXT_HAVE_AVX2)

#    define INLINE GGML_EXT_INLINE

typedef ggml_ext_interleaved4_act_sums    act_sums;
typedef ggml_ext_interleaved4_act_sums_x4 act_sums_x4;

// ---------------------------------------------------------------- activations

// roundf(): nearest, ties away from zero (the reference); exact for |v| < 2^23.
INLINE __m256i round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t    = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 up   = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one  = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, one)));
}

// One Q8_0 block: d = amax / 127, q = roundf(x / d), as the reference.
INLINE void quantize_block(const float * x, ggml_ext_fp16_t * d_out, int8_t * q) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256       v[4];
    __m256       amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
    m4        = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4        = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d  = _mm_cvtss_f32(m4) / 127;
    const float id = d ? 1.0f / d : 0.0f;
    *d_out         = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    const __m256 vid = _mm256_set1_ps(id);
    __m256i      i[4];
    for (int j = 0; j < 4; j++) {
        i[j] = round_away(_mm256_mul_ps(v[j], vid));
    }
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256((__m256i *) q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

static void quantize_row_q8_0_avx2(const float * x, void * vy, int64_t k) {
    ggml_ext_block_q8_0 * y = (ggml_ext_block_q8_0 *) vy;
    for (int64_t i = 0; i < k / 32; i++) {
        quantize_block(x + 32 * i, &y[i].d, y[i].qs);
    }
}

INLINE void quantize_mat_x4(const float * x, void * vy, int64_t k, int B) {
    ggml_ext_block_q8_0x4 * y = (ggml_ext_block_q8_0x4 *) vy;
    for (int64_t i = 0; i < k / 32; i++) {
        int8_t q[4][32];
        for (int r = 0; r < 4; r++) {
            quantize_block(x + r * k + 32 * i, &y[i].d[r], q[r]);
        }
        for (int c = 0; c < 32 / B; c++) {  // chunk c of row r -> chunk slot 4c + r
            for (int r = 0; r < 4; r++) {
                memcpy(y[i].qs + (4 * c + r) * B, q[r] + c * B, (size_t) B);
            }
        }
    }
}

static void quantize_mat_q8_0_4x4_avx2(const float * x, void * vy, int64_t k) {
    quantize_mat_x4(x, vy, k, 4);
}

static void quantize_mat_q8_0_4x8_avx2(const float * x, void * vy, int64_t k) {
    quantize_mat_x4(x, vy, k, 8);
}

// ---------------------------------------------------------------- weights

// 32 stored bytes -> weights. fam 0 (Q4_0): the original nibbles (0..15); fam 1
// (IQ4_NL): kvalues[nibble] (signed).
INLINE void unpack(int fam, const uint8_t * p, __m256i * lo, __m256i * hi) {
    const __m256i m = _mm256_set1_epi8(0x0f);
    if (fam) {
        const __m256i tbl = _mm256_broadcastsi128_si256(ggml_ext_iq4_nl_table(0));
        const __m256i raw = _mm256_loadu_si256((const __m256i *) p);
        *lo               = _mm256_shuffle_epi8(tbl, _mm256_and_si256(raw, m));
        *hi               = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m));
        return;
    }
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) p), _mm256_set1_epi8((char) 0x88));
    *lo             = _mm256_and_si256(u, m);
    *hi             = _mm256_and_si256(_mm256_srli_epi16(u, 4), m);
}

// IQ4_NL: s8 x s8 byte pairs summed into int16 (|sum| <= 2 * 127 * 127), then int32.
INLINE __m256i dot2_s8(__m256i w, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1));
}

// Four byte products summed per int32 lane. Q4_0: u8 x s8, summed in int16 first
// (4 x 2 x 15 x 128 < 2^15); IQ4_NL: s8 x s8.
INLINE __m256i dot4(int fam, __m256i w0, __m256i a0, __m256i w1, __m256i a1, __m256i w2, __m256i a2, __m256i w3,
                    __m256i a3) {
    if (fam) {
        return _mm256_add_epi32(_mm256_add_epi32(dot2_s8(w0, a0), dot2_s8(w1, a1)),
                                _mm256_add_epi32(dot2_s8(w2, a2), dot2_s8(w3, a3)));
    }
    const __m256i p = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w0, a0), _mm256_maddubs_epi16(w1, a1)),
                                       _mm256_add_epi16(_mm256_maddubs_epi16(w2, a2), _mm256_maddubs_epi16(w3, a3)));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// The correction term of a lane (Q4_0), none for IQ4_NL.
INLINE __m256i add_corr(int fam, __m256i p, __m256i corr) {
    return fam ? p : _mm256_add_epi32(p, corr);
}

// B = 8: four columns (half h of H) of one block: chunk c of column j at qs + 32 (c H + h) + 8 j.
typedef struct {
    __m256i lo0, hi0, lo1, hi1;
} half_b8;

INLINE half_b8 load_half_b8(int fam, const uint8_t * qs, int H, int h) {
    half_b8 w;
    unpack(fam, qs + 32 * h, &w.lo0, &w.hi0);
    unpack(fam, qs + 32 * (H + h), &w.lo1, &w.hi1);
    return w;
}

// A[c]: activation bytes 8c..8c+7 in every 64-bit lane. Result: two int32 lanes per column.
INLINE __m256i dot_half_b8(int fam, const half_b8 * w, const __m256i A[4]) {
    return dot4(fam, w->lo0, A[0], w->lo1, A[1], w->hi0, A[2], w->hi1, A[3]);
}

// Weight deltas of one block as floats (H = 1: four, in the low half).
INLINE __m256 load_scales(const uint8_t * blk, int H) {
    if (H == 2) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) blk));
    }
    return _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *) blk)));
}

INLINE __m256i pair_idx(int h) {
    return _mm256_setr_epi32(4 * h, 4 * h, 4 * h + 1, 4 * h + 1, 4 * h + 2, 4 * h + 2, 4 * h + 3, 4 * h + 3);
}

// [c0, c0', c1, c1', c2, c2', c3, c3'] -> [c0 + c0', ..., c3 + c3']
INLINE __m128 fold_pairs(__m256 acc) {
    const __m256 h = _mm256_hadd_ps(acc, acc);
    return _mm_castpd_ps(
        _mm_unpacklo_pd(_mm_castps_pd(_mm256_castps256_ps128(h)), _mm_castps_pd(_mm256_extractf128_ps(h, 1))));
}

INLINE void store4(float * out, __m128 v, int add) {
    _mm_storeu_ps(out, add ? _mm_add_ps(v, _mm_loadu_ps(out)) : v);
}

// ---------------------------------------------------------------- Q4_0_4_8 / Q4_0_8_8

INLINE void gemv_group_b8(int fam, int H, const act_sums * t, const ggml_ext_block_q8_0 * a, const uint8_t * w, int kn, float * out,
                          int add) {
    const int    N      = 4 * H;
    const size_t blk    = (size_t) N * sizeof(ggml_ext_block_q4_0);
    __m256       acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };
    for (int b = 0; b < kn; b++, w += blk) {
        const int8_t * q    = a[b].qs;
        const __m256i  A[4] = { ggml_ext_interleaved4_bcast64(q), ggml_ext_interleaved4_bcast64(q + 8), ggml_ext_interleaved4_bcast64(q + 16),
                                ggml_ext_interleaved4_bcast64(q + 24) };
        const __m256i  corr = ggml_ext_interleaved4_bcast64(t[b].pair);
        const __m256   sc   = _mm256_mul_ps(load_scales(w, H), _mm256_set1_ps(t[b].d));
        GGML_EXT_UNROLL
        for (int h = 0; h < H; h++) {
            const half_b8 wh = load_half_b8(fam, w + 2 * N, H, h);
            const __m256i p  = add_corr(fam, dot_half_b8(fam, &wh, A), corr);
            acc[h]           = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_permutevar8x32_ps(sc, pair_idx(h)), acc[h]);
        }
    }
    for (int h = 0; h < H; h++) {
        store4(out + 4 * h, fold_pairs(acc[h]), add);
    }
}

// Four activation rows x four columns at a time: for Q4_0_8_8 the two column halves are
// separate passes over the blocks, so that 4 accumulators + 4 weight vectors fit the 16
// AVX2 registers (the activations, re-read by the second pass, stay in L1).
INLINE void gemm_tile_b8(int fam, int H, const act_sums_x4 * t, const ggml_ext_block_q8_0x4 * a, const uint8_t * w0, int kn, float * s,
                         size_t bs, int add) {
    const int    N   = 4 * H;
    const size_t blk = (size_t) N * sizeof(ggml_ext_block_q4_0);
    for (int h = 0; h < H; h++) {
        const uint8_t * w      = w0;
        __m256          acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
        for (int b = 0; b < kn; b++, w += blk) {
            const half_b8  wh = load_half_b8(fam, w + 2 * N, H, h);
            const __m256   sp = _mm256_permutevar8x32_ps(load_scales(w, H), pair_idx(h));
            const int8_t * q  = a[b].qs;  // chunk c of row r at q + 8 (4c + r)
            GGML_EXT_UNROLL
            for (int r = 0; r < 4; r++) {
                const __m256i A[4] = { ggml_ext_interleaved4_bcast64(q + 8 * r), ggml_ext_interleaved4_bcast64(q + 8 * (4 + r)),
                                       ggml_ext_interleaved4_bcast64(q + 8 * (8 + r)), ggml_ext_interleaved4_bcast64(q + 8 * (12 + r)) };
                const __m256i p    = add_corr(fam, dot_half_b8(fam, &wh, A), ggml_ext_interleaved4_bcast64(t[b].pair[r]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sp, _mm256_set1_ps(t[b].d[r])), acc[r]);
            }
        }
        for (int r = 0; r < 4; r++) {
            store4(s + (size_t) r * bs + 4 * h, fold_pairs(acc[r]), add);
        }
    }
}

// ---------------------------------------------------------------- Q4_0_4_4

// 32-bit lane l of a 32-byte load of a block's quants holds column l%4, bytes 4(l/4)..,
// so lanes 0-3 meet activation dwords 0, 2, 4, 6 and lanes 4-7 dwords 1, 3, 5, 7.
// A[k]: activation dwords 2k (lanes 0-3) and 2k+1 (lanes 4-7); k = 0, 1 low nibbles.
INLINE __m128i dot_4x4(int fam, const __m256i W[4], const __m256i A[4]) {
    const __m256i p = dot4(fam, W[0], A[0], W[2], A[1], W[1], A[2], W[3], A[3]);
    return _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
}

INLINE void load_4x4(int fam, const uint8_t * qs, __m256i W[4]) {
    unpack(fam, qs, &W[0], &W[1]);       // bytes 0-7: low nibbles (weights 0-7), high (16-23)
    unpack(fam, qs + 32, &W[2], &W[3]);  // bytes 8-15: weights 8-15, 24-31
}

INLINE __m256i dword_pair_idx(int lo, int hi) {
    return _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
}

INLINE void gemv_group_4x4_f(int fam, const act_sums * t, const ggml_ext_block_q8_0 * a, const uint8_t * w, int kn,
                            float * out, int add) {
    const size_t blk = sizeof(ggml_ext_block_q4_0x4);
    __m128       acc = _mm_setzero_ps();
    for (int b = 0; b < kn; b++, w += blk) {
        const __m256i v    = _mm256_loadu_si256((const __m256i *) a[b].qs);
        const __m256i A[4] = { _mm256_permutevar8x32_epi32(v, dword_pair_idx(0, 1)),
                               _mm256_permutevar8x32_epi32(v, dword_pair_idx(2, 3)),
                               _mm256_permutevar8x32_epi32(v, dword_pair_idx(4, 5)),
                               _mm256_permutevar8x32_epi32(v, dword_pair_idx(6, 7)) };
        __m256i       W[4];
        load_4x4(fam, w + 8, W);
        const __m128i d4 = dot_4x4(fam, W, A);
        const __m128i p  = fam ? d4 : _mm_add_epi32(d4, _mm_set1_epi32(t[b].full));
        const __m128  sc = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *) w)), _mm_set1_ps(t[b].d));
        acc              = _mm_fmadd_ps(_mm_cvtepi32_ps(p), sc, acc);
    }
    store4(out, acc, add);
}

INLINE void gemm_tile_4x4_f(int fam, const act_sums_x4 * t, const ggml_ext_block_q8_0x4 * a, const uint8_t * w, int kn,
                            float * s, size_t bs, int add) {
    const size_t blk    = sizeof(ggml_ext_block_q4_0x4);
    __m128       acc[4] = { _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps() };
    for (int b = 0; b < kn; b++, w += blk) {
        __m256i W[4];
        load_4x4(fam, w + 8, W);
        const __m128 dw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *) w));
        // 32-byte load k holds dwords 2k (rows 0-3) and 2k+1 (rows 0-3) of the activations
        __m256i      V[4];
        GGML_EXT_UNROLL
        for (int k = 0; k < 4; k++) {
            V[k] = _mm256_loadu_si256((const __m256i *) (a[b].qs + 32 * k));
        }
        GGML_EXT_UNROLL
        for (int r = 0; r < 4; r++) {
            const __m256i idx  = dword_pair_idx(r, 4 + r);
            const __m256i A[4] = { _mm256_permutevar8x32_epi32(V[0], idx), _mm256_permutevar8x32_epi32(V[1], idx),
                                   _mm256_permutevar8x32_epi32(V[2], idx), _mm256_permutevar8x32_epi32(V[3], idx) };
            const __m128i d4   = dot_4x4(fam, W, A);
            const __m128i p    = fam ? d4 : _mm_add_epi32(d4, _mm_set1_epi32(t[b].full[r][0]));
            acc[r]             = _mm_fmadd_ps(_mm_cvtepi32_ps(p), _mm_mul_ps(dw, _mm_set1_ps(t[b].d[r])), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        store4(s + (size_t) r * bs, acc[r], add);
    }
}

// ---------------------------------------------------------------- entry points

// The values' flag, then for B = 8 the column halves H = N / 4.
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx2, q4_0, 4, 4, 8, gemv_group_4x4_f, gemm_tile_4x4_f, 0)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx2, q4_0, 4, 8, 8, gemv_group_b8, gemm_tile_b8, 0, 1)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx2, q4_0, 8, 8, 8, gemv_group_b8, gemm_tile_b8, 0, 2)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx2, iq4_nl, 4, 4, 8, gemv_group_4x4_f, gemm_tile_4x4_f, 1)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx2, iq4_nl, 4, 8, 8, gemv_group_b8, gemm_tile_b8, 1, 1)
GGML_EXT_INTERLEAVED4_X86_ENTRIES(avx2, iq4_nl, 8, 8, 8, gemv_group_b8, gemm_tile_b8, 1, 2)

const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_avx2 = {
    .name                  = "avx2",
    .quantize_row_q8_0     = quantize_row_q8_0_avx2,
    .quantize_mat_q8_0_4x4 = quantize_mat_q8_0_4x4_avx2,
    .quantize_mat_q8_0_4x8 = quantize_mat_q8_0_4x8_avx2,
    .gemv                  = GGML_EXT_INTERLEAVED4_TABLE(gemv, avx2),
    .gemm                  = GGML_EXT_INTERLEAVED4_TABLE(gemm, avx2),
};

#else
typedef int ggml_ext_interleaved4_x86_avx2_not_compiled;  // ISO C: no empty translation unit
#endif
