// AVX2 kernels of the codebooks family (CB2 / CB3 x Q8_K): a 256-bit register holds two sub-groups
// of 16 weights, one per 128-bit lane. Each lane shifts its bit pair of the 16 code bytes down
// (vpsrlvq: a different shift per lane), masks it (CB3: ORs in the high bit from hmask the same way),
// and decodes the codes with one pshufb into that lane's codebook (each lane loads the 16-byte table
// of its sub-group's codebook). The products with the int8 activations are vpmaddubsw (|w| x sign(a, w):
// at most 2 * 127 * 127, no saturation), then vpmaddwd with the sub-groups' multipliers l + 1, summed in
// int32 over the block and scaled once per block by d_w * d_a. Each weight block is decoded once for up
// to 8 activation rows.
#include "common/simd.h"
#include "formats/codebooks/codebooks.h"

#ifdef GGML_EXT_HAVE_AVX2

#    include "common/fp16.h"
#    include "formats/codebooks/codebooks_tables.h"

#    include <immintrin.h>

#    define ROWS 8  // activation rows per pass over the weights

// tab[c]: codebook c's entries at byte positions 0..entries-1 (pshufb's index is the code).
static void load_tables(int bits, int8_t tab[4][16]) {
    memset(tab, 0, 4 * 16);
    for (int c = 0; c < 4; c++) {
        for (int q = 0; q < (bits == 2 ? 4 : 8); q++) {
            tab[c][q] = bits == 2 ? ggml_ext_cb2_tables[c][q] : ggml_ext_cb3_tables[c][q];
        }
    }
}

GGML_EXT_INLINE float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x        = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x        = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

GGML_EXT_INLINE void mm(const int bits, GGML_EXT_CB_MM_ARGS) {
    int8_t tab[4][16];
    load_tables(bits, tab);
    const int       nb  = n / GGML_EXT_QK_CB;
    const size_t    wbs = bits == 2 ? sizeof(ggml_ext_block_cb2) : sizeof(ggml_ext_block_cb3);
    const __m256i   m3  = _mm256_set1_epi8(3);
    const __m256i   m1  = _mm256_set1_epi8(1);
    const ggml_ext_block_q8_K * ay = (const ggml_ext_block_q8_K *) vy;

    for (int r0 = 0; r0 < nr; r0 += ROWS) {
        const int rn = nr - r0 < ROWS ? nr - r0 : ROWS;
        for (int c = 0; c < nc; c++) {
            const uint8_t * wrow = (const uint8_t *) vx + (size_t) c * nb * wbs;
            __m256          acc[ROWS];
            for (int r = 0; r < rn; r++) {
                acc[r] = _mm256_setzero_ps();
            }
            for (int b = 0; b < nb; b++) {
                const ggml_ext_block_cb3 * y = (const ggml_ext_block_cb3 *) (wrow + b * wbs);
                __m256i                    wabs[8], wv[8], mv[8];
                GGML_EXT_UNROLL
                for (int p = 0; p < 8; p++) {  // sub-groups s0 = 2p (low lane) and s1 = 2p + 1 (high lane)
                    const int s0 = 2 * p, s1 = s0 + 1;
                    const __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (y->qs + 16 * (s0 >> 2))));
                    __m256i code = _mm256_and_si256(
                        _mm256_srlv_epi64(qs, _mm256_set_epi64x(2 * (s1 & 3), 2 * (s1 & 3), 2 * (s0 & 3), 2 * (s0 & 3))), m3);
                    if (bits == 3) {
                        const __m256i hm = _mm256_broadcastsi128_si256(
                            _mm_loadu_si128((const __m128i *) (y->hmask + 16 * (s0 >> 3))));
                        const __m256i hb = _mm256_and_si256(
                            _mm256_srlv_epi64(hm, _mm256_set_epi64x(s1 & 7, s1 & 7, s0 & 7, s0 & 7)), m1);
                        code = _mm256_or_si256(code, _mm256_slli_epi16(hb, 2));
                    }
                    const int c0 = (y->cb[s0 >> 2] >> (2 * (s0 & 3))) & 3;
                    const int c1 = (y->cb[s1 >> 2] >> (2 * (s1 & 3))) & 3;
                    const __m256i t = _mm256_inserti128_si256(
                        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) tab[c0])),
                        _mm_loadu_si128((const __m128i *) tab[c1]), 1);
                    wv[p]   = _mm256_shuffle_epi8(t, code);
                    wabs[p] = _mm256_abs_epi8(wv[p]);
                    const int l0 = ((y->scales[s0 >> 1] >> (4 * (s0 & 1))) & 15) + 1;
                    const int l1 = ((y->scales[s1 >> 1] >> (4 * (s1 & 1))) & 15) + 1;
                    mv[p] = _mm256_set_m128i(_mm_set1_epi16((short) l1), _mm_set1_epi16((short) l0));
                }
                ggml_ext_fp16_t dh;
                memcpy(&dh, &y->d, sizeof(dh));
                const float dw = ggml_ext_fp16_to_fp32(dh);
                for (int r = 0; r < rn; r++) {
                    const ggml_ext_block_q8_K * a = &ay[(size_t) (r0 + r) * nb + b];
                    __m256i isum = _mm256_setzero_si256();
                    GGML_EXT_UNROLL
                    for (int p = 0; p < 8; p++) {
                        const __m256i av = _mm256_loadu_si256((const __m256i *) (a->qs + 32 * p));
                        const __m256i pr = _mm256_maddubs_epi16(wabs[p], _mm256_sign_epi8(av, wv[p]));
                        isum             = _mm256_add_epi32(isum, _mm256_madd_epi16(pr, mv[p]));
                    }
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * a->d), acc[r]);
                }
            }
            for (int r = 0; r < rn; r++) {
                s[(size_t) (r0 + r) * bs + c] = hsum(acc[r]);
            }
        }
    }
}

static void mm_cb2(GGML_EXT_CB_MM_ARGS) {
    mm(2, n, s, bs, vx, vy, nr, nc);
}

static void mm_cb3(GGML_EXT_CB_MM_ARGS) {
    mm(3, n, s, bs, vx, vy, nr, nc);
}

const struct ggml_ext_cb_impl ggml_ext_cb_impl_avx2 = { "avx2", NULL, { mm_cb2, mm_cb3 } };

#endif
