// AVX2 GEMV of the any-precision bitplanes (formats/anyprec/anyprec_impl.h). Per 32 weights: one 32-bit
// word of each of the first b planes; each word's bits are spread to one byte per weight (pshufb
// replicates byte j/8 of the word into byte j, AND with 1 << (j%8), compare: the bit-transpose as 32
// byte lanes), the bytes OR-ed into the codes with the plane's weight 2^(b-1-k); then 4 x 8 codes are
// widened and looked up in the row's float table and multiply-accumulated with x, into four accumulators
// (one per 8-weight group: the FMAs' latency does not serialise the row). The lookup is a register permute
// where the table fits (b <= 3: one vpermps; b = 4: two and a blend), a gather from memory above: a gather
// costs several times a permute on most x86 cores. Several tokens (ggml_ext_anyprec_gemv_tokens): the codes and
// entries of each 32 weights serve two activation rows, each row summed in the one-row order.
#include "formats/anyprec/anyprec_impl.h"

#if defined(GGML_EXT_HAVE_AVX2)
#    include "common/fp16.h"

#    include <immintrin.h>
#    include <string.h>

// rows r0 .. r0 + nr for G activation rows x[0..G) into y[0..G) (G constant once inlined): each 32 weights' codes
// and table entries built once and multiplied into every row's four accumulators, in the one-row order (so each
// row's result is the one-row call's, bit for bit)
GGML_EXT_INLINE void apq_rows(const uint8_t * planes, const ggml_ext_fp16_t * tab, int64_t r0, int64_t nr,
                              int64_t row_bytes, size_t plane_bytes, int bits, const float * const * x,
                              float * const * y, const int G) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,   // lane 0: bytes 0, 1
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);  // lane 1: bytes 2, 3
    const __m256i bitsel = _mm256_set1_epi64x((long long) 0x8040201008040201ull);
    __m256i       weight[GGML_EXT_ANYPREC_MAX_BITS];
    for (int k = 0; k < bits; k++) {
        weight[k] = _mm256_set1_epi8((char) (1 << (bits - 1 - k)));
    }
    float lut[256] = { 0 };  // zero past the table: t0 / t1 load 16 entries whatever b
    for (int64_t r = 0; r < nr; r++) {
        const ggml_ext_fp16_t * t = tab + (r0 + r) * (1 << bits);
        if (bits >= 3) {
            for (int c = 0; c < (1 << bits); c += 8) {
                _mm256_storeu_ps(lut + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (t + c))));
            }
        } else {
            for (int c = 0; c < (1 << bits); c++) {
                lut[c] = ggml_ext_fp16_to_fp32(t[c]);
            }
        }
        const uint8_t * row = planes + (size_t) (r0 + r) * (size_t) row_bytes;
        const __m256    t0  = _mm256_loadu_ps(lut), t1 = _mm256_loadu_ps(lut + 8);
        __m256          acc[2][4];
        for (int q = 0; q < G; q++) {
            for (int g = 0; g < 4; g++) {
                acc[q][g] = _mm256_setzero_ps();
            }
        }
        for (int64_t i = 0; i < row_bytes; i += 4) {
            __m256i codes = _mm256_setzero_si256();
            for (int k = 0; k < bits; k++) {
                uint32_t w;
                memcpy(&w, row + (size_t) k * plane_bytes + (size_t) i, 4);
                __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int) w), spread);
                v         = _mm256_cmpeq_epi8(_mm256_and_si256(v, bitsel), bitsel);
                codes     = _mm256_or_si256(codes, _mm256_and_si256(v, weight[k]));
            }
            const __m128i lo = _mm256_castsi256_si128(codes);
            const __m128i hi = _mm256_extracti128_si256(codes, 1);
            const __m256i c[4] = { _mm256_cvtepu8_epi32(lo), _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
                                   _mm256_cvtepu8_epi32(hi), _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)) };
            for (int g = 0; g < 4; g++) {
                __m256 v;
                if (bits <= 3) {
                    v = _mm256_permutevar8x32_ps(t0, c[g]);
                } else if (bits == 4) {  // bit 3 of the code picks the upper 8 entries (blendv reads the sign)
                    v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, c[g]), _mm256_permutevar8x32_ps(t1, c[g]),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(c[g], 28)));
                } else {
                    v = _mm256_i32gather_ps(lut, c[g], 4);
                }
                for (int q = 0; q < G; q++) {
                    acc[q][g] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x[q] + 8 * i + 8 * g), acc[q][g]);
                }
            }
        }
        // the four accumulators, then ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) of their lanes
        for (int q = 0; q < G; q++) {
            const __m256 a = _mm256_add_ps(_mm256_add_ps(acc[q][0], acc[q][1]), _mm256_add_ps(acc[q][2], acc[q][3]));
            __m128       s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            s              = _mm_add_ps(s, _mm_movehl_ps(s, s));
            y[q][r]        = _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
        }
    }
}

// a pass of up to two rows: their 8 accumulators and the constants fill the 16 registers
static void rows_avx2(const uint8_t * planes, const struct ggml_ext_anyprec_gemv_geo * g, int64_t r0, int64_t nr,
                      int bits, const float * const * x, float * const * y, int G) {
    if (G >= 2) {
        apq_rows(planes, g->tab, r0, nr, g->row_bytes, g->plane_bytes, bits, x, y, 2);
    } else {
        apq_rows(planes, g->tab, r0, nr, g->row_bytes, g->plane_bytes, bits, x, y, 1);
    }
}

int ggml_ext_anyprec_gemv_tokens_avx2(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                      int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                      const float * const * x, float * const * y) {
    return ggml_ext_anyprec_gemv_tokens_by(rows_avx2, 2, planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits,
                                           n_tok, x, y);
}

int ggml_ext_anyprec_gemv_avx2(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                               int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x, float * y) {
    return ggml_ext_anyprec_gemv_tokens_avx2(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, 1, &x, &y);
}
#endif
