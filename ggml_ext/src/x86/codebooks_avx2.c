// AVX2 kernels of the codebooks family (CB2 / CB3 x Q8_K). The scalar reference (src/generic/codebooks.c)
// is the spec; this file computes the same integer block sums with fewer vector operations per weight.
//
// A 256-bit register holds two sub-groups of 16 weights of one pair p: s0 = 2p in the low lane, s1 = 2p + 1
// in the high lane, so their activations are 32 consecutive Q8_K bytes and nothing is permuted. The
// tricks, each counted in vector operations per pair (32 weights), the budget being ggml's Q2_K (~6):
//
//  1. Lane tables from memory, not index arithmetic. The pair's two codebook indices are one nibble
//     of the cb bytes, (cb >> 4p) & 15 = c0 | c1 << 2, so the lookup table of the pair (low lane: codebook
//     c0, high lane: c1) is one 32-byte load from 16 tables built once per call: no per-pair shuffle of
//     the codebook bits and no OR into the index (the previous kernel spent 2 operations there).
//  2. Nibble tables (CB2). Sub-groups 2p and 2p + 1 keep their codes in the same byte of a qs chunk, as
//     one nibble (bits 0-3 for p even, 4-7 for p odd); the low lane's table is indexed by the code in
//     the nibble's low 2 bits, the high lane's by its high 2 bits (each table 4 entries repeated), so
//     both lanes use the same index: x & 15 (p even) or (x >> 4) & 15 (p odd): 1.5 operations per pair.
//  3. Multipliers from memory. Byte p of the scales is l_{2p} | l_{2p + 1} << 4, exactly the pair's two
//     multipliers: a 256-entry table of (l0 + 1) x 8, (l1 + 1) x 8 as int16 lanes (8 KB, built once per
//     call) gives vpmaddwd its operand by a load (Q2_K spends a pshufb there).
//  4. Sign handling. vpmaddubsw multiplies unsigned by signed bytes, and both weights and activations
//     are signed. One activation row (the 1-token GEMV): |a| is computed once per call into a buffer
//     shared by every weight row, so per pair only psign(w, a) remains (1 operation, not abs + sign).
//     Several activation rows (GEMM): |w| once per pair, sign(a, w) per row. Products: at most
//     2 x 127 x 121 per int16 pair, no saturation.
//  5. Sums: vpmaddwd by the multipliers into int32 per block, one float FMA per block by d_w * d_a.
//
// CB2 per pair: 1.5 (code nibble) + pshufb + psign + vpmaddubsw + vpmaddwd + add = 6.5 vector operations
// (the previous kernel: 11), 4 loads (table, multipliers, a, |a|) and ~5 integer operations for the two
// table offsets; ggml's Q2_K: ~5.75 vector operations. CB3 adds the high code bit (vpsrlvq, shift, mask,
// OR) and cannot use nibble tables (3-bit codes: one code per lane index), but needs no blend any more.
//
// Measured on the 2-core Zen 1 EPYC (bench/codebooks/bench_codebooks_kernels.py, docs/RESULTS.md): CB2 GEMV
// ~0.93x ggml's Q2_K (was ~0.59x), CB3 ~0.63x (was ~0.35x). Tried and not kept (same run, same machine):
// multipliers by a pshufb of the block's unpacked scales instead of trick 3 (no faster); abs + sign per
// pair instead of the |a| buffer (slower); two weight rows per pass sharing the activation loads (no
// faster); 32-byte code loads (0.75 operations per pair for the codes) with activations permuted once
// per call to (8h + i, 8h + 4 + i) lane pairs: correct but slower, because each pair's table and
// multiplier offsets then gather bits from two bytes (~12 integer operations per pair).
#include "common/simd.h"
#include "formats/codebooks/codebooks.h"

#ifdef GGML_EXT_HAVE_AVX2

#    include "common/fp16.h"
#    include "formats/codebooks/codebooks_tables.h"

#    include <immintrin.h>
#    include <stdlib.h>

#    define ROWS 4  // activation rows per pass over the weights (their sums stay in registers)

GGML_EXT_INLINE float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x        = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x        = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

// The tables of one call (on the stack: ~8.7 KB, built in well under a microsecond).
struct tabs {
    // pair[c0 | c1 << 2]: low lane codebook c0, high lane codebook c1. CB2 (trick 2): low lane byte j =
    // T[c0][j & 3], high lane byte j = T[c1][j >> 2]. CB3: byte j = T[c][j & 7] in both lanes.
    __m256i pair[16];
    // mul[b] (trick 3): int16 lanes, (b & 15) + 1 in the low lane, (b >> 4) + 1 in the high lane.
    __m256i mul[256];
};

static void build_tabs(const int bits, struct tabs * t) {
    for (int i = 0; i < 16; i++) {
        const int c0 = i & 3, c1 = i >> 2;
        int8_t    b[32];
        for (int j = 0; j < 16; j++) {
            b[j]      = bits == 2 ? ggml_ext_cb2_tables[c0][j & 3] : ggml_ext_cb3_tables[c0][j & 7];
            b[16 + j] = bits == 2 ? ggml_ext_cb2_tables[c1][j >> 2] : ggml_ext_cb3_tables[c1][j & 7];
        }
        t->pair[i] = _mm256_loadu_si256((const __m256i *) b);
    }
    for (int i = 0; i < 256; i++) {
        t->mul[i] = _mm256_setr_m128i(_mm_set1_epi16((short) ((i & 15) + 1)), _mm_set1_epi16((short) ((i >> 4) + 1)));
    }
}

// The 32 weights of pair p of block y (sub-group 2p in the low lane, 2p + 1 in the high lane) as int8.
// x: the pair's qs chunk (16 bytes, sub-groups 4 (p >> 1) .. + 3) in both lanes; hm (CB3): the hmask
// bytes of sub-groups 8 (p >> 2) .. + 7, shifted right by 1 in the high lane (so both lanes hold their
// sub-group's high bit at bit 2 (p & 3)); cb: the block's 4 codebook bytes as one word.
GGML_EXT_INLINE __m256i decode_pair(const int bits, const struct tabs * t, const __m256i x, const __m256i hm,
                                    const uint32_t cb, const int p) {
    // trick 1: the byte offset 32 * ((cb >> 4p) & 15) in two integer operations
    const __m256i tab = _mm256_load_si256(
        (const __m256i *) ((const char *) t->pair + ((((uint64_t) cb << 5) >> (4 * p)) & (15 << 5))));
    if (bits == 2) {  // trick 2: the pair's nibble indexes both lanes' tables
        const __m256i m15 = _mm256_set1_epi8(15);
        const __m256i nib = (p & 1) ? _mm256_and_si256(_mm256_srli_epi16(x, 4), m15) : _mm256_and_si256(x, m15);
        return _mm256_shuffle_epi8(tab, nib);
    }
    // CB3: code bits 0-1 of sub-group 2p (2p + 1) at bits 4 (p & 1) (+ 2) of x; the high lane was not
    // pre-shifted, so shift both lanes by their own count (vpsrlvq), then mask.
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_set_epi64x(4 * (p & 1) + 2, 4 * (p & 1) + 2,
                                                                              4 * (p & 1), 4 * (p & 1))),
                                       _mm256_set1_epi8(3));
    // high bit at bit 2 (p & 3) of hm -> bit 2 (16-bit shifts: bit 2 of each byte only takes bits of its byte)
    __m256i h;
    switch (p & 3) {
        case 0: h = _mm256_slli_epi16(hm, 2); break;
        case 1: h = hm; break;
        case 2: h = _mm256_srli_epi16(hm, 2); break;
        default: h = _mm256_srli_epi16(hm, 4); break;
    }
    const __m256i idx = _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(4)));
    return _mm256_shuffle_epi8(tab, idx);
}

// RN (1..ROWS, a constant after inlining) activation rows times weight rows [0, nc). ABS (a constant):
// absa holds |a| of the one activation row (RN == 1, trick 4). Each pair is decoded once and multiplied into the RN rows'
// int32 sums at once (only the sums, the pair and its operands are live).
GGML_EXT_INLINE void mm_rows(const int bits, const int RN, const int ABS, const struct tabs * t, int n, float * s, size_t bs,
                             const void * vx, const ggml_ext_block_q8_K * ay, const int8_t * absa, int nc) {
    const int    nb  = n / GGML_EXT_QK_CB;
    const size_t wbs = bits == 2 ? sizeof(ggml_ext_block_cb2) : sizeof(ggml_ext_block_cb3);
    for (int c = 0; c < nc; c++) {
        const uint8_t * wrow = (const uint8_t *) vx + (size_t) c * nb * wbs;
        __m256          acc[ROWS];
        for (int r = 0; r < RN; r++) {
            acc[r] = _mm256_setzero_ps();
        }
        // two blocks per iteration: their integer and float steps interleave (~4% on the GEMV, measured)
        _Pragma("GCC unroll 2")
        for (int b = 0; b < nb; b++) {
            const ggml_ext_block_cb3 * y = (const ggml_ext_block_cb3 *) (wrow + b * wbs);
            uint32_t                   cb;
            memcpy(&cb, y->cb, sizeof(cb));
            __m256i isum[ROWS];
            for (int r = 0; r < RN; r++) {
                isum[r] = _mm256_setzero_si256();
            }
            __m256i x = _mm256_setzero_si256(), hm = _mm256_setzero_si256();
            GGML_EXT_UNROLL
            for (int p = 0; p < 8; p++) {
                if ((p & 1) == 0) {
                    x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (y->qs + 16 * (p >> 1))));
                }
                if (bits == 3 && (p & 3) == 0) {
                    hm = _mm256_srlv_epi64(
                        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (y->hmask + 16 * (p >> 2)))),
                        _mm256_set_epi64x(1, 1, 0, 0));
                }
                const __m256i w  = decode_pair(bits, t, x, hm, cb, p);
                const __m256i mv =  // trick 3
                    _mm256_load_si256((const __m256i *) ((const char *) t->mul + ((size_t) y->scales[p] << 5)));
                if (ABS) {  // trick 4, one row: |a| precomputed
                    const __m256i a  = _mm256_loadu_si256((const __m256i *) (ay[b].qs + 32 * p));
                    const __m256i aa = _mm256_loadu_si256((const __m256i *) (absa + (size_t) b * GGML_EXT_QK_CB + 32 * p));
                    isum[0] = _mm256_add_epi32(isum[0], _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(w, a)), mv));
                } else {  // several rows: |w| once
                    const __m256i aw = _mm256_abs_epi8(w);
                    for (int r = 0; r < RN; r++) {
                        const __m256i a = _mm256_loadu_si256((const __m256i *) (ay[(size_t) r * nb + b].qs + 32 * p));
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), mv));
                    }
                }
            }
            ggml_ext_fp16_t dh;
            memcpy(&dh, &y->d, sizeof(dh));
            const float dw = _cvtsh_ss(dh);  // F16C (part of this implementation's target): exact, as the reference's
            for (int r = 0; r < RN; r++) {
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(dw * ay[(size_t) r * nb + b].d), acc[r]);
            }
        }
        for (int r = 0; r < RN; r++) {
            s[(size_t) r * bs + c] = hsum(acc[r]);
        }
    }
}

GGML_EXT_INLINE void mm(const int bits, GGML_EXT_CODEBOOKS_MM_ARGS) {
    struct tabs t;
    build_tabs(bits, &t);
    const ggml_ext_block_q8_K * ay = (const ggml_ext_block_q8_K *) vy;
    const int                   nb = n / GGML_EXT_QK_CB;
    if (nr == 1) {  // trick 4: |a| of the one activation row, once for all weight rows
        // on the stack for rows up to 16K weights (every matrix of the 7B-class models): no allocation per call
        int8_t   stack_absa[16384];
        int8_t * absa = n <= (int) sizeof(stack_absa) ? stack_absa : (int8_t *) malloc((size_t) n);
        if (absa) {
            for (int b = 0; b < nb; b++) {
                for (int j = 0; j < GGML_EXT_QK_CB; j += 32) {
                    _mm256_storeu_si256((__m256i *) (absa + (size_t) b * GGML_EXT_QK_CB + j),
                                        _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *) (ay[b].qs + j))));
                }
            }
        }
        if (absa) {
            mm_rows(bits, 1, 1, &t, n, s, bs, vx, ay, absa, nc);
        } else {  // out of memory: |w| per pair instead
            mm_rows(bits, 1, 0, &t, n, s, bs, vx, ay, NULL, nc);
        }
        if (absa != stack_absa) {
            free(absa);
        }
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += ROWS) {
        const ggml_ext_block_q8_K * a  = ay + (size_t) r0 * nb;
        float *                     sr = s + (size_t) r0 * bs;
        switch (nr - r0 < ROWS ? nr - r0 : ROWS) {  // the row count as a constant: sums in registers
            case 1: mm_rows(bits, 1, 0, &t, n, sr, bs, vx, a, NULL, nc); break;
            case 2: mm_rows(bits, 2, 0, &t, n, sr, bs, vx, a, NULL, nc); break;
            case 3: mm_rows(bits, 3, 0, &t, n, sr, bs, vx, a, NULL, nc); break;
            default: mm_rows(bits, 4, 0, &t, n, sr, bs, vx, a, NULL, nc); break;
        }
    }
}

static void mm_cb2(GGML_EXT_CODEBOOKS_MM_ARGS) {
    mm(2, n, s, bs, vx, vy, nr, nc);
}

static void mm_cb3(GGML_EXT_CODEBOOKS_MM_ARGS) {
    mm(3, n, s, bs, vx, vy, nr, nc);
}

const struct ggml_ext_codebooks_impl ggml_ext_codebooks_impl_avx2 = { "avx2", NULL, { mm_cb2, mm_cb3 } };

#endif
