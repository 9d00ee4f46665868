// AVX2 kernels of the codebooks family (CB2 / CB3 x Q8_K), the paper's design: the codebook index and
// the code of every weight are merged with bit operations into one table index, and one byte-table
// lookup (pshufb) decodes 16 weights of any sub-group from tables that stay in registers for the whole
// call -- CB2's 4 codebooks x 4 entries are exactly one 16-byte table (index c << 2 | q), CB3's 4 x 8
// are two (index c << 3 | q: two pshufb and a blend on bit 4).
//
// A 256-bit register holds two sub-groups of 16 weights, s = 2p in the low lane and 2p + 1 in the
// high lane (their activations are 32 consecutive bytes). Both lanes take the same 16 code bytes
// (one broadcast load per four sub-groups) and shift them right by their own bit pair (vpsrlvq), a
// mask keeps the code; once per block the 16 sub-groups' c << 2 (CB3: c << 3) and multipliers l + 1
// are unpacked into 16 bytes each, and a pair's codebook bits (every byte of a lane) and its (l + 1)
// int16 lanes are one pshufb each. Products with the int8 activations are vpmaddubsw
// (|w| x sign(a, w): at most 2 * 127 * 127, no saturation), then vpmaddwd by the multipliers, summed
// in int32 over the block and scaled once per block by d_w * d_a. Each pair is decoded once and
// multiplied into up to 4 activation rows' sums at once (GEMM); only those sums, the pair and its
// multipliers are live, so nothing of a decoded block goes to memory.
//
// On this repository's 2-core EPYC (Zen 1) the 1-token GEMV runs at ~0.55-0.6x ggml's Q2_K vec_dot
// (scripts/bench_codebooks_kernels.py): the lookup costs a pshufb plus the index bits, and the signed
// x signed product needs abs + sign around vpmaddubsw, where Q2_K's unsigned codes go straight in.
#include "common/simd.h"
#include "formats/codebooks/codebooks.h"

#ifdef GGML_EXT_HAVE_AVX2

#    include "common/fp16.h"
#    include "formats/codebooks/codebooks_tables.h"

#    include <immintrin.h>

#    define ROWS 4  // activation rows per pass over the weights (their sums stay in registers)

GGML_EXT_INLINE float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x        = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x        = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

// The merged tables: CB2 one 16-byte table (entry c * 4 + q), CB3 two (entries c * 8 + q, 0-15 and
// 16-31), each broadcast to both lanes.
GGML_EXT_INLINE void load_tables(int bits, __m256i * lo, __m256i * hi) {
    int8_t t[32];
    for (int c = 0; c < 4; c++) {
        for (int q = 0; q < 8; q++) {
            if (bits == 2 && q < 4) {
                t[4 * c + q] = ggml_ext_cb2_tables[c][q];
            } else if (bits == 3) {
                t[8 * c + q] = ggml_ext_cb3_tables[c][q];
            }
        }
    }
    *lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) t));
    *hi = bits == 3 ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (t + 16))) : *lo;
}

// The multipliers l + 1 of sub-groups 0..15 as bytes 0..15 of both lanes.
GGML_EXT_INLINE __m256i block_multipliers(const uint8_t * scales) {
    const __m128i sc = _mm_loadl_epi64((const __m128i *) scales);
    const __m128i mk = _mm_set1_epi8(15);
    const __m128i m  = _mm_unpacklo_epi8(_mm_and_si128(sc, mk), _mm_and_si128(_mm_srli_epi16(sc, 4), mk));
    return _mm256_broadcastsi128_si256(_mm_add_epi8(m, _mm_set1_epi8(1)));
}

// c_s << 2 (CB2) / c_s << 3 (CB3) of sub-groups s = 0..15 as bytes 0..15 of both lanes: each codebook byte
// cb[k] copied to bytes 4k .. 4k + 3, then byte 4k + j shifted (16-bit shifts, masked) so that its bit pair
// 2j, 2j + 1 lands on bits 2, 3 (CB3: 3, 4).
GGML_EXT_INLINE __m256i block_codebooks(const int bits, const uint8_t * cb) {
    uint32_t c4;
    memcpy(&c4, cb, 4);
    const __m128i r  = _mm_shuffle_epi8(_mm_cvtsi32_si128((int) c4), _mm_set_epi8(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
    const int     m  = bits == 2 ? 0x0c : 0x18;
    const __m128i m0 = _mm_set1_epi32(m), m1 = _mm_set1_epi32(m << 8), m2 = _mm_set1_epi32(m << 16), m3 = _mm_set1_epi32(m << 24);
    __m128i       v;
    if (bits == 2) {  // byte j: bits 2j.. -> 2..: shifts +2, 0, -2, -4
        v = _mm_or_si128(_mm_or_si128(_mm_and_si128(_mm_slli_epi16(r, 2), m0), _mm_and_si128(r, m1)),
                         _mm_or_si128(_mm_and_si128(_mm_srli_epi16(r, 2), m2), _mm_and_si128(_mm_srli_epi16(r, 4), m3)));
    } else {  // -> 3..: shifts +3, +1, -1, -3
        v = _mm_or_si128(_mm_or_si128(_mm_and_si128(_mm_slli_epi16(r, 3), m0), _mm_and_si128(_mm_slli_epi16(r, 1), m1)),
                         _mm_or_si128(_mm_and_si128(_mm_srli_epi16(r, 1), m2), _mm_and_si128(_mm_srli_epi16(r, 3), m3)));
    }
    return _mm256_broadcastsi128_si256(v);
}

// The constants of one kernel call.
struct ctx {
    __m256i tlo, thi, m3, m1, sh_even, sh_odd;
};

GGML_EXT_INLINE struct ctx make_ctx(const int bits) {
    struct ctx k;
    load_tables(bits, &k.tlo, &k.thi);
    k.m3  = _mm256_set1_epi8(3);
    k.m1  = _mm256_set1_epi8(1);
    // Sub-group pair p = (2p, 2p + 1): bit pairs 2 * (2p & 3) and 2 * ((2p + 1) & 3) of a qs chunk.
    k.sh_even   = _mm256_set_epi64x(2, 2, 0, 0);  // p even: sub-groups 4k, 4k + 1
    k.sh_odd    = _mm256_set_epi64x(6, 6, 4, 4);  // p odd: 4k + 2, 4k + 3
    return k;
}

// The 32 weights of sub-groups 2p (low lane) and 2p + 1 (high lane) of block y as int8, and their
// multipliers (l + 1) as int16 in *mv (mb, cbb: block_multipliers, block_codebooks).
GGML_EXT_INLINE __m256i decode_pair(const int bits, const struct ctx * k, const ggml_ext_block_cb3 * y, __m256i mb,
                                    __m256i cbb, const int p, __m256i * mv) {
    const int     kq = p >> 1;  // qs chunk / codebook byte of sub-groups 4kq .. 4kq + 3
    const __m256i sh = (p & 1) ? k->sh_odd : k->sh_even;
    const __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (y->qs + 16 * kq)));
    // c << 2 (CB3: c << 3) of sub-group 2p in every byte of the low lane, of 2p + 1 in the high one
    const __m256i cbs = _mm256_shuffle_epi8(cbb, _mm256_set_epi8(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                                                 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                                                 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p, 2 * p, 2 * p,
                                                                 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p,
                                                                 2 * p, 2 * p, 2 * p, 2 * p));
    __m256i idx = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi64(qs, sh), k->m3), cbs);
    __m256i w;
    if (bits == 2) {
        w = _mm256_shuffle_epi8(k->tlo, idx);
    } else {
        const int     s0 = 2 * p;
        const __m256i hm = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (y->hmask + 16 * (s0 >> 3))));
        const __m256i hb =
            _mm256_and_si256(_mm256_srlv_epi64(hm, _mm256_set_epi64x((s0 + 1) & 7, (s0 + 1) & 7, s0 & 7, s0 & 7)), k->m1);
        idx = _mm256_or_si256(idx, _mm256_slli_epi16(hb, 2));
        // bit 4 of the index (codebooks 2, 3: the second table) moved to bit 7 for the blend
        w = _mm256_blendv_epi8(_mm256_shuffle_epi8(k->tlo, idx), _mm256_shuffle_epi8(k->thi, idx), _mm256_slli_epi16(idx, 3));
    }
    // (l + 1) of sub-group 2p in the low lane, 2p + 1 in the high one, as int16
    *mv = _mm256_shuffle_epi8(mb, _mm256_set_epi8(-1, 2 * p + 1, -1, 2 * p + 1, -1, 2 * p + 1, -1, 2 * p + 1, -1, 2 * p + 1,
                                                  -1, 2 * p + 1, -1, 2 * p + 1, -1, 2 * p + 1, -1, 2 * p, -1, 2 * p, -1, 2 * p,
                                                  -1, 2 * p, -1, 2 * p, -1, 2 * p, -1, 2 * p, -1, 2 * p));
    return w;
}

GGML_EXT_INLINE __m256i dot_pair(__m256i w, __m256i mv, const int8_t * a) {
    const __m256i av = _mm256_loadu_si256((const __m256i *) a);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(av, w)), mv);
}

// RN (1..ROWS, a constant after inlining) activation rows times weight rows [0, nc): each pair of sub-groups
// is decoded once and multiplied into the RN rows' int32 sums at once, so only the sums, the pair and its
// multipliers are live (no decoded block kept in memory).
GGML_EXT_INLINE void mm_rows(const int bits, const int RN, const struct ctx * k, int n, float * s, size_t bs,
                             const void * vx, const ggml_ext_block_q8_K * ay, int nc) {
    const int    nb  = n / GGML_EXT_QK_CB;
    const size_t wbs = bits == 2 ? sizeof(ggml_ext_block_cb2) : sizeof(ggml_ext_block_cb3);
    for (int c = 0; c < nc; c++) {
        const uint8_t * wrow = (const uint8_t *) vx + (size_t) c * nb * wbs;
        __m256          acc[ROWS];
        for (int r = 0; r < RN; r++) {
            acc[r] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; b++) {
            const ggml_ext_block_cb3 * y  = (const ggml_ext_block_cb3 *) (wrow + b * wbs);
            const __m256i              mb = block_multipliers(y->scales);
            const __m256i              cbb = block_codebooks(bits, y->cb);
            __m256i                    isum[ROWS];
            for (int r = 0; r < RN; r++) {
                isum[r] = _mm256_setzero_si256();
            }
            GGML_EXT_UNROLL
            for (int p = 0; p < 8; p++) {
                __m256i       mv;
                const __m256i w = decode_pair(bits, k, y, mb, cbb, p, &mv);
                for (int r = 0; r < RN; r++) {
                    isum[r] = _mm256_add_epi32(isum[r], dot_pair(w, mv, ay[(size_t) r * nb + b].qs + 32 * p));
                }
            }
            ggml_ext_fp16_t dh;
            memcpy(&dh, &y->d, sizeof(dh));
            const float dw = ggml_ext_fp16_to_fp32(dh);
            for (int r = 0; r < RN; r++) {
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(dw * ay[(size_t) r * nb + b].d), acc[r]);
            }
        }
        for (int r = 0; r < RN; r++) {
            s[(size_t) r * bs + c] = hsum(acc[r]);
        }
    }
}

GGML_EXT_INLINE void mm(const int bits, GGML_EXT_CB_MM_ARGS) {
    const struct ctx            k  = make_ctx(bits);
    const ggml_ext_block_q8_K * ay = (const ggml_ext_block_q8_K *) vy;
    const int                   nb = n / GGML_EXT_QK_CB;
    for (int r0 = 0; r0 < nr; r0 += ROWS) {
        const ggml_ext_block_q8_K * a  = ay + (size_t) r0 * nb;
        float *                     sr = s + (size_t) r0 * bs;
        switch (nr - r0 < ROWS ? nr - r0 : ROWS) {  // the row count as a constant: sums in registers
            case 1: mm_rows(bits, 1, &k, n, sr, bs, vx, a, nc); break;
            case 2: mm_rows(bits, 2, &k, n, sr, bs, vx, a, nc); break;
            case 3: mm_rows(bits, 3, &k, n, sr, bs, vx, a, nc); break;
            default: mm_rows(bits, 4, &k, n, sr, bs, vx, a, nc); break;
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
