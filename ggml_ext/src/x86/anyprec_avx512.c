// AVX-512 GEMV of the any-precision bitplanes (formats/anyprec/anyprec_impl.h; the scalar twin is
// generic/anyprec.c). Decode reads b bits a weight, so it can run at the memory's speed only if the work per
// weight is a small constant; the AVX2 twin's gather (one per 8 weights, slow on most x86 cores) made it
// compute-bound and flat in b. Here, per 64 weights:
//   * codes: one 64-bit word of each of the first b planes is a mask register (bit n = weight 8i + n, the
//     scalar twin's order); a doubling and a masked byte add of 1 per plane build 64 byte codes (no bit-transpose);
//   * lookup: the row's table (2^b floats) lives in zmm registers and 16 codes at a time index it with
//     permutes instead of memory: one vpermps for b <= 4, one vpermt2ps for b = 5, and above that one
//     vpermt2ps per 32 entries merged by the code's upper bits (3 / 7 / 15 instructions at b = 6 / 7 / 8; at
//     b = 8 the 32-entry quarters are read from L1: kept in registers they leave too few for the rest);
//   * four accumulators (one per 16-weight group), so the FMAs' latency does not serialise the row;
//   * several tokens (a batch of decode streams, up to 8): the codes and table entries of each 64 weights are
//     built once for up to four activation rows (ggml_ext_anyprec_gemv_tokens), each row's sums in the order of
//     the one-token call: the results are the one-token call's, bit for bit.
#include "formats/anyprec/anyprec_impl.h"

#if defined(GGML_EXT_HAVE_AVX512)
#    include "common/fp16.h"

#    include <immintrin.h>
#    include <string.h>

// the table entries of 16 codes (idx: 16 x int32 < 2^B) from the max(1, 2^B / 16) zmm of T. Above 5 bits each
// vpermt2ps gives the entries of one 32-entry quarter (bits 0..4 of the code) and the blends pick by bits 5, 6, 7,
// merged pairwise as soon as both sides exist so that few partial results are live at once (T itself takes up to
// 16 of the 32 registers).
GGML_EXT_INLINE __m512 apq_lookup(__m512i idx, const __m512 * T, const float * mem, const int B) {
    if (B <= 4) {
        return _mm512_permutexvar_ps(idx, T[0]);
    }
    // at 8 bits the 16 table registers would leave too few for the rest: the quarters are read from L1 instead
#    define APQ_P(j)                                                                                 \
        (B == 8 ? _mm512_permutex2var_ps(_mm512_load_ps(mem + 32 * (j)), idx, _mm512_load_ps(mem + 32 * (j) + 16)) \
                : _mm512_permutex2var_ps(T[2 * (j)], idx, T[2 * (j) + 1]))
    if (B == 5) {
        return APQ_P(0);
    }
    const __mmask16 k5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(1 << 5));
    if (B == 6) {
        return _mm512_mask_blend_ps(k5, APQ_P(0), APQ_P(1));
    }
    const __mmask16 k6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(1 << 6));
    const __m512    lo = _mm512_mask_blend_ps(k6, _mm512_mask_blend_ps(k5, APQ_P(0), APQ_P(1)),
                                              _mm512_mask_blend_ps(k5, APQ_P(2), APQ_P(3)));
    if (B == 7) {
        return lo;
    }
    const __mmask16 k7 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(1 << 7));
    const __m512    hi = _mm512_mask_blend_ps(k6, _mm512_mask_blend_ps(k5, APQ_P(4), APQ_P(5)),
                                              _mm512_mask_blend_ps(k5, APQ_P(6), APQ_P(7)));
#    undef APQ_P
    return _mm512_mask_blend_ps(k7, lo, hi);
}

// rows r0 .. r0 + nr of precision B for G activation rows x[0..G) into y[0..G) (B and G constants once inlined into
// the switches below): each 64 weights' codes and table entries are built once and multiplied into every row's
// four accumulators, in the same order for each row as for G = 1, so a token's product does not depend on how
// many tokens share the call.
GGML_EXT_INLINE void apq_rows(const uint8_t * planes, const ggml_ext_fp16_t * tab, int64_t r0, int64_t nr,
                              int64_t row_bytes, size_t plane_bytes, const float * const * x, float * const * y,
                              const int B, const int G) {
    const int E  = 1 << B;
    const int NT = E < 16 ? 1 : E / 16;  // table registers (b <= 7)
    const __m512i one = _mm512_set1_epi8(1);
    for (int64_t r = 0; r < nr; r++) {
        const ggml_ext_fp16_t * t = tab + (r0 + r) * E;
        __m512                  T[8];
        _Alignas(64) float      mem[256];
        if (B == 8) {
            for (int j = 0; j < 16; j++) {
                _mm512_store_ps(mem + 16 * j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (t + 16 * j))));
            }
        } else if (E >= 16) {
            for (int j = 0; j < NT; j++) {
                T[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (t + 16 * j)));
            }
        } else {
            float lut[16] = { 0 };
            for (int c = 0; c < E; c++) {
                lut[c] = ggml_ext_fp16_to_fp32(t[c]);
            }
            T[0] = _mm512_loadu_ps(lut);
        }
        const uint8_t * row = planes + (size_t) (r0 + r) * (size_t) row_bytes;
        __m512          acc[4][4];
        for (int g = 0; g < G; g++) {
            for (int q = 0; q < 4; q++) {
                acc[g][q] = _mm512_setzero_ps();
            }
        }
        for (int64_t i = 0; i < row_bytes; i += 8) {
            // 64 weights, or the row's last 32 (rows are multiples of 32 weights)
            const int bytes = row_bytes - i >= 8 ? 8 : 4;
            __m512i   codes = _mm512_setzero_si512();
            for (int k = 0; k < B; k++) {
                uint64_t w = 0;
                memcpy(&w, row + (size_t) k * plane_bytes + (size_t) i, (size_t) bytes);
                // codes = 2 codes + bit: one constant register instead of one per plane (T needs up to 16)
                codes = _mm512_add_epi8(codes, codes);
                codes = _mm512_mask_add_epi8(codes, _cvtu64_mask64(w), codes, one);
            }
            // the 16-weight groups (the extract takes a constant lane)
            const __m512 w0 = apq_lookup(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(codes)), T, mem, B);
            const __m512 w1 = apq_lookup(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes, 1)), T, mem, B);
            for (int g = 0; g < G; g++) {
                const float * xi = x[g] + 8 * i;
                acc[g][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xi), acc[g][0]);
                acc[g][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xi + 16), acc[g][1]);
            }
            if (bytes == 8) {
                const __m512 w2 = apq_lookup(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes, 2)), T, mem, B);
                const __m512 w3 = apq_lookup(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes, 3)), T, mem, B);
                for (int g = 0; g < G; g++) {
                    const float * xi = x[g] + 8 * i;
                    acc[g][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xi + 32), acc[g][2]);
                    acc[g][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xi + 48), acc[g][3]);
                }
            }
        }
        for (int g = 0; g < G; g++) {
            y[g][r] = _mm512_reduce_add_ps(
                _mm512_add_ps(_mm512_add_ps(acc[g][0], acc[g][1]), _mm512_add_ps(acc[g][2], acc[g][3])));
        }
    }
}

// precision B, G rows at a time (G constant per call: the accumulators stay in registers)
GGML_EXT_INLINE void apq_rows_g(const uint8_t * planes, const ggml_ext_fp16_t * tab, int64_t r0, int64_t nr,
                                int64_t row_bytes, size_t plane_bytes, const float * const * x, float * const * y,
                                const int B, int G) {
    switch (G) {
        case 1: apq_rows(planes, tab, r0, nr, row_bytes, plane_bytes, x, y, B, 1); break;
        case 2: apq_rows(planes, tab, r0, nr, row_bytes, plane_bytes, x, y, B, 2); break;
        case 3: apq_rows(planes, tab, r0, nr, row_bytes, plane_bytes, x, y, B, 3); break;
        default: apq_rows(planes, tab, r0, nr, row_bytes, plane_bytes, x, y, B, 4); break;
    }
}

// a pass of up to four rows (at 7 bits their 16 accumulators and the table fill the 32 registers), B constant
static void rows_avx512(const uint8_t * planes, const struct ggml_ext_anyprec_gemv_geo * g, int64_t r0, int64_t nr,
                        int bits, const float * const * x, float * const * y, int G) {
    const ggml_ext_fp16_t * tab = g->tab;
    switch (bits) {
        case 1: apq_rows_g(planes, tab, r0, nr, g->row_bytes, g->plane_bytes, x, y, 1, G); break;
        case 2: apq_rows_g(planes, tab, r0, nr, g->row_bytes, g->plane_bytes, x, y, 2, G); break;
        case 3: apq_rows_g(planes, tab, r0, nr, g->row_bytes, g->plane_bytes, x, y, 3, G); break;
        case 4: apq_rows_g(planes, tab, r0, nr, g->row_bytes, g->plane_bytes, x, y, 4, G); break;
        case 5: apq_rows_g(planes, tab, r0, nr, g->row_bytes, g->plane_bytes, x, y, 5, G); break;
        case 6: apq_rows_g(planes, tab, r0, nr, g->row_bytes, g->plane_bytes, x, y, 6, G); break;
        case 7: apq_rows_g(planes, tab, r0, nr, g->row_bytes, g->plane_bytes, x, y, 7, G); break;
        default: apq_rows_g(planes, tab, r0, nr, g->row_bytes, g->plane_bytes, x, y, 8, G); break;
    }
}

int ggml_ext_anyprec_gemv_tokens_avx512(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                        int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                        const float * const * x, float * const * y) {
    return ggml_ext_anyprec_gemv_tokens_by(rows_avx512, 4, planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits,
                                           n_tok, x, y);
}

int ggml_ext_anyprec_gemv_avx512(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                 int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x, float * y) {
    return ggml_ext_anyprec_gemv_tokens_avx512(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, 1, &x, &y);
}
#endif
