// KVQuant kernels, AVX2 + FMA (scalar twin: ../generic/kvquant.c): 4-bit layers, head_dim a multiple
// of 16; the outliers' corrections per token (kvquant.h's shared helpers) use the token's cos/sin.
//
// Keys. A head block's byte j holds rotation pair j: slot j (low nibble) and slot j + hd/2 (high), so
// eight bytes give eight pairs (a, b). With ka = da ha + ma, kb = db hb + mb (da, db: the table's
// values; h, m: the channel's half range and middle) and the pair's angle's cosine c and sine s,
//     q . R k = c (qa ka + qb kb) + s (qb ka - qa kb) = c (P da + Q db + U) + s (R da - S db + W)
// with P = qa ha, Q = qb hb, R = qb ha, S = qa hb, U = qa ma + qb mb, W = qb ma - qa mb per query
// head and pair, computed once per call. The angle's (c, s) of consecutive positions follow by one
// complex multiplication by the pair's step (cos, sin of its angle per position); every 16 tokens, and
// where positions are not consecutive, they are computed afresh (sincos8: reduction by pi/2 in three
// parts, Taylor polynomials on [-pi/4, pi/4]). The 16-entry value table is two 8-lane permutes.
//
// Values. out[c] = sum_t w_t (values[i_tc] half_t + mid_t): per token the scalars w_t half_t and a
// running sum of w_t mid_t added to every channel at the end.
#include "formats/kvquant/kvquant.h"

#if defined(GGML_EXT_HAVE_AVX2)
#    include <immintrin.h>
#    include <math.h>
#    include <stdlib.h>

#    define INLINE GGML_EXT_INLINE
#    define MAXG   4  // query heads per pass (one KV head's group is done in passes of MAXG)

INLINE __m256 lut16(__m256 lo8, __m256 hi8, __m256i idx) {
    const __m256 a = _mm256_permutevar8x32_ps(lo8, idx);
    const __m256 b = _mm256_permutevar8x32_ps(hi8, idx);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

INLINE void sincos8(__m256 x, __m256 * s, __m256 * c) {
    const __m256 j  = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.636619772367581343f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256       r  = _mm256_fnmadd_ps(j, _mm256_set1_ps(1.5703125f), x);
    r               = _mm256_fnmadd_ps(j, _mm256_set1_ps(4.837512969970703125e-4f), r);
    r               = _mm256_fnmadd_ps(j, _mm256_set1_ps(7.54978995489188216e-8f), r);
    const __m256 r2 = _mm256_mul_ps(r, r);
    __m256       sp = _mm256_fmadd_ps(r2, _mm256_set1_ps(1.0f / 362880), _mm256_set1_ps(-1.0f / 5040));
    sp              = _mm256_fmadd_ps(r2, sp, _mm256_set1_ps(1.0f / 120));
    sp              = _mm256_fmadd_ps(r2, sp, _mm256_set1_ps(-1.0f / 6));
    sp              = _mm256_fmadd_ps(_mm256_mul_ps(r2, r), sp, r);
    __m256 cp       = _mm256_fmadd_ps(r2, _mm256_set1_ps(-1.0f / 3628800), _mm256_set1_ps(1.0f / 40320));
    cp              = _mm256_fmadd_ps(r2, cp, _mm256_set1_ps(-1.0f / 720));
    cp              = _mm256_fmadd_ps(r2, cp, _mm256_set1_ps(1.0f / 24));
    cp              = _mm256_fmadd_ps(r2, cp, _mm256_set1_ps(-0.5f));
    cp              = _mm256_fmadd_ps(r2, cp, _mm256_set1_ps(1.0f));
    const __m256i q    = _mm256_cvtps_epi32(j);
    const __m256  swap = _mm256_castsi256_ps(_mm256_slli_epi32(q, 31));  // odd quadrant: sign bit set
    const __m256  s0   = _mm256_blendv_ps(sp, cp, swap);
    const __m256  c0   = _mm256_blendv_ps(cp, sp, swap);
    const __m256i two  = _mm256_set1_epi32(2);
    *s = _mm256_xor_ps(s0, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(q, two), 30)));
    *c = _mm256_xor_ps(c0, _mm256_castsi256_ps(
                               _mm256_slli_epi32(_mm256_and_si256(_mm256_add_epi32(q, _mm256_set1_epi32(1)), two), 30)));
}

INLINE float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x        = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x        = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

// eight pairs' 4-bit indices: low nibbles (slots j..j+7) and high nibbles (slots j+hd/2..)
INLINE void nibbles8(const uint8_t * p, __m256i * lo, __m256i * hi) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) p));
    *lo             = _mm256_and_si256(b, _mm256_set1_epi32(15));
    *hi             = _mm256_srli_epi32(b, 4);
}

static int k_scores(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * q, int n_q, const void * k_rows,
                    size_t stride, const int32_t * pos, int n_tokens, float * scores) {
    const int hd = L->head_dim, h2 = hd / 2, nqh = nh * n_q;
    if (L->bits != 4 || hd % 16) {
        return 0;
    }
    float * co = malloc(sizeof(float) * 6 * h2 * (size_t) nqh);  // per query head: P Q R S U W of each pair
    if (!co) {
        return 0;
    }
    float        cs[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2], sn[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2];
    float        cd[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2], sd[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2];
    const __m256 tlo = _mm256_loadu_ps(L->k_values), thi = _mm256_loadu_ps(L->k_values + 8);
    ggml_ext_kvquant_k_coefficients(L, q, h0, nqh, n_q, co, cd, sd);
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t * row = (const uint8_t *) k_rows + (size_t) t * stride;
        // the (cos, sin) of every pair at this position: afresh every 16 tokens and after a jump, else one
        // step on from the previous token's; shared by every head
        if (t % 16 == 0 || pos[t] != pos[t - 1] + 1) {
            const __m256 pf = _mm256_set1_ps((float) pos[t]);
            for (int j = 0; j < h2; j += 8) {
                __m256 c, s;
                sincos8(_mm256_mul_ps(pf, _mm256_loadu_ps(L->pair_theta + j)), &s, &c);
                _mm256_storeu_ps(cs + j, c);
                _mm256_storeu_ps(sn + j, s);
            }
        } else {
            for (int j = 0; j < h2; j += 8) {
                const __m256 c1 = _mm256_loadu_ps(cs + j), s1 = _mm256_loadu_ps(sn + j);
                const __m256 dc = _mm256_loadu_ps(cd + j), ds = _mm256_loadu_ps(sd + j);
                _mm256_storeu_ps(cs + j, _mm256_fmsub_ps(c1, dc, _mm256_mul_ps(s1, ds)));
                _mm256_storeu_ps(sn + j, _mm256_fmadd_ps(s1, dc, _mm256_mul_ps(c1, ds)));
            }
        }
        for (int h = 0; h < nh; h++) {
            const uint8_t * blk = row + (h0 + h) * L->head_bytes;
            for (int g0 = 0; g0 < n_q; g0 += MAXG) {
                const int ng = n_q - g0 < MAXG ? n_q - g0 : MAXG;
                const float * cg = co + (size_t) (h * n_q + g0) * 6 * h2;
                __m256 acc[MAXG];
                for (int g = 0; g < ng; g++) {
                    acc[g] = _mm256_setzero_ps();
                }
                for (int j = 0; j < h2; j += 8) {
                    const __m256 c = _mm256_loadu_ps(cs + j), s = _mm256_loadu_ps(sn + j);
                    __m256i      ia, ib;
                    nibbles8(blk + j, &ia, &ib);
                    const __m256 da = lut16(tlo, thi, ia), db = lut16(tlo, thi, ib);
                    for (int g = 0; g < ng; g++) {
                        const float * p = cg + (size_t) g * 6 * h2 + j;
                        const __m256  x = _mm256_fmadd_ps(_mm256_loadu_ps(p), da,
                                                          _mm256_fmadd_ps(_mm256_loadu_ps(p + h2), db, _mm256_loadu_ps(p + 4 * h2)));
                        const __m256  y = _mm256_fmadd_ps(_mm256_loadu_ps(p + 2 * h2), da,
                                                          _mm256_fnmadd_ps(_mm256_loadu_ps(p + 3 * h2), db, _mm256_loadu_ps(p + 5 * h2)));
                        acc[g] = _mm256_fmadd_ps(c, x, _mm256_fmadd_ps(s, y, acc[g]));
                    }
                }
                for (int g = 0; g < ng; g++) {
                    scores[(size_t) (h * n_q + g0 + g) * n_tokens + t] = hsum(acc[g]);
                }
            }
            ggml_ext_kvquant_k_row_sparse(L, h0 + h, row, cs, sn, q + (size_t) h * n_q * hd, n_q,
                                          scores + (size_t) h * n_q * n_tokens + t, (size_t) n_tokens);
        }
    }
    free(co);
    return 1;
}

static int v_accumulate(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * w, int n_q,
                        const void * v_rows, size_t stride, int n_tokens, float * out) {
    const int hd = L->head_dim, h2 = hd / 2, nqh = nh * n_q;
    if (L->bits != 4 || hd % 16) {
        return 0;
    }
    float * cst = calloc((size_t) nqh, sizeof(float));  // sum_t w_t mid_t per query head
    if (!cst) {
        return 0;
    }
    const __m256 tlo = _mm256_loadu_ps(L->v_values), thi = _mm256_loadu_ps(L->v_values + 8);
    for (int i = 0; i < nqh * hd; i++) {
        out[i] = 0.0f;
    }
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t * row = (const uint8_t *) v_rows + (size_t) t * stride;
        float           mid, half;
        ggml_ext_kvquant_v_scale(L, row, &mid, &half);
        for (int h = 0; h < nh; h++) {
            const uint8_t * blk = row + (h0 + h) * L->head_bytes;
            for (int g0 = 0; g0 < n_q; g0 += MAXG) {
                const int ng = n_q - g0 < MAXG ? n_q - g0 : MAXG;
                float     a[MAXG];
                for (int g = 0; g < ng; g++) {
                    const float wt = w[(size_t) (h * n_q + g0 + g) * n_tokens + t];
                    a[g]           = wt * half;
                    cst[h * n_q + g0 + g] += wt * mid;
                }
                float * og = out + (size_t) (h * n_q + g0) * hd;
                for (int j = 0; j < h2; j += 8) {
                    __m256i il, ih;
                    nibbles8(blk + j, &il, &ih);
                    const __m256 dl = lut16(tlo, thi, il), dh = lut16(tlo, thi, ih);
                    for (int g = 0; g < ng; g++) {
                        float *      o  = og + (size_t) g * hd;
                        const __m256 ag = _mm256_set1_ps(a[g]);
                        _mm256_storeu_ps(o + j, _mm256_fmadd_ps(ag, dl, _mm256_loadu_ps(o + j)));
                        _mm256_storeu_ps(o + h2 + j, _mm256_fmadd_ps(ag, dh, _mm256_loadu_ps(o + h2 + j)));
                    }
                }
            }
            ggml_ext_kvquant_v_row_sparse(L, h0 + h, row, mid, half, w + (size_t) h * n_q * n_tokens + t, n_q,
                                          (size_t) n_tokens, out + (size_t) h * n_q * hd);
        }
    }
    for (int i = 0; i < nqh; i++) {
        for (int c = 0; c < hd; c++) {
            out[(size_t) i * hd + c] += cst[i];
        }
    }
    free(cst);
    return 1;
}

const struct ggml_ext_kvquant_impl ggml_ext_kvquant_impl_avx2 = { "avx2", k_scores, v_accumulate };

#endif  // GGML_EXT_HAVE_AVX2
