// CB2 / CB3 reference quantize and dequantize (scalar C; docs/formats/codebooks.md).
//
// Quantizing one 256-weight block minimises the importance-weighted squared error
//     E = sum_j w_j (x_j - d * m_s * T[c_s][q_j])^2,   m_s = l_s + 1 in 1..16,
// over the super-scale d, and per sub-group s the codebook c_s, the multiplier m_s and the codes q:
//   1. per sub-group and codebook, the best free scale a_{s,c} > 0: start from every scale that maps
//      the sub-group's largest-magnitude weight onto a table entry of its sign, assign each weight
//      its nearest entry, refit a by least squares (sum w x t / sum w t^2), reassign, keep the best;
//   2. d from a grid of 7 around max_s a_s / 16 (every candidate rounded to fp16 first, as stored);
//      for each d, per sub-group every codebook with m in round(a_{s,c}/d) -+ M_SPAN (4), codes
//      reassigned at the actual scale d * m; the d with the lowest total E is kept;
//   3. d refitted by least squares to that assignment (fp16-rounded), choices redone, while E falls.
// Codes are always the nearest entries at the final scale, so dequantize(quantize(x)) is the
// weighted-nearest point of the chosen grid.
#include "formats/codebooks/codebooks.h"

#include "common/fp16.h"
#include "formats/codebooks/codebooks_tables.h"

#include <math.h>
#include <string.h>

_Static_assert(sizeof(ggml_ext_block_cb2) == 78, "CB2 block: fp16 d, 8 scale bytes, 4 codebook bytes, 64 code bytes");
_Static_assert(sizeof(ggml_ext_block_cb3) == 110, "CB3 block: CB2's bytes plus a 32-byte high-bit mask");
_Static_assert(GGML_EXT_CB2_N_CODEBOOKS == 4 && GGML_EXT_CB3_N_CODEBOOKS == 4, "the format has a 2-bit codebook index");
_Static_assert(GGML_EXT_CB2_N_ENTRIES == 4 && GGML_EXT_CB3_N_ENTRIES == 8, "2-bit and 3-bit codes");

#define QK      GGML_EXT_QK_CB
#define G       GGML_EXT_CODEBOOKS_GROUP
#define NG      GGML_EXT_CODEBOOKS_NGROUPS
#define NCB     4
#define MAX_E   8
#define N_D     7   // super-scale candidates
#define M_SPAN  4   // multipliers tried around round(a / d)
#define FP16_MAX 65504.0f

// One code width's tables as floats, with the midpoints between neighbouring entries.
typedef struct {
    int   n;                    // entries per codebook
    float t[NCB][MAX_E];
    float mid[NCB][MAX_E - 1];  // z >= mid[c][k] means index > k (entries sorted ascending)
} tables_t;

static void load_tables(int bits, tables_t * tb) {
    tb->n = bits == 2 ? GGML_EXT_CB2_N_ENTRIES : GGML_EXT_CB3_N_ENTRIES;
    for (int c = 0; c < NCB; c++) {
        for (int k = 0; k < tb->n; k++) {
            tb->t[c][k] = bits == 2 ? (float) ggml_ext_cb2_tables[c][k] : (float) ggml_ext_cb3_tables[c][k];
        }
        for (int k = 0; k + 1 < tb->n; k++) {
            tb->mid[c][k] = 0.5f * (tb->t[c][k] + tb->t[c][k + 1]);
        }
    }
}

static inline int nearest(const tables_t * tb, int c, float z) {
    int q = 0;
    for (int k = 0; k + 1 < tb->n; k++) {
        q += z >= tb->mid[c][k];
    }
    return q;
}

// Weighted error of 16 weights at scale a > 0 with codebook c, codes nearest; codes to q if not NULL.
static float group_error(const tables_t * tb, int c, const float * x, const float * w, float a, uint8_t * q) {
    const float inv = 1.0f / a;
    float       err = 0.0f;
    for (int j = 0; j < G; j++) {
        const int   k = nearest(tb, c, x[j] * inv);
        const float e = x[j] - a * tb->t[c][k];
        err += w[j] * e * e;
        if (q) {
            q[j] = (uint8_t) k;
        }
    }
    return err;
}

// Step 1: the best free scale of one sub-group for codebook c (0 for an all-zero sub-group).
static float best_free_scale(const tables_t * tb, int c, const float * x, const float * w, float * err_out) {
    float amax = 0.0f, xmax = 0.0f;
    for (int j = 0; j < G; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            xmax = x[j];
        }
    }
    float best_a = 0.0f, best_e = INFINITY;
    if (amax == 0.0f) {
        *err_out = 0.0f;
        return 0.0f;
    }
    for (int k = 0; k < tb->n; k++) {
        const float t = tb->t[c][k];
        if (t == 0.0f || (t > 0) != (xmax > 0)) {
            continue;
        }
        float a = xmax / t;
        for (int it = 0; it < 2; it++) {  // assign, refit
            const float inv = 1.0f / a;
            float       sxt = 0.0f, stt = 0.0f;
            for (int j = 0; j < G; j++) {
                const float v = tb->t[c][nearest(tb, c, x[j] * inv)];
                sxt += w[j] * x[j] * v;
                stt += w[j] * v * v;
            }
            if (sxt > 0.0f && stt > 0.0f) {
                a = sxt / stt;
            }
        }
        const float e = group_error(tb, c, x, w, a, NULL);
        if (e < best_e) {
            best_e = e;
            best_a = a;
        }
    }
    if (best_a == 0.0f) {  // no entry of the largest weight's sign: the codebook cannot serve it well
        best_a = amax / 127.0f;
        best_e = group_error(tb, c, x, w, best_a, NULL);
    }
    *err_out = best_e;
    return best_a;
}

typedef struct {
    float   d;
    uint8_t c[NG], l[NG], q[QK];
} choice_t;

static float pick_for_d(const tables_t * tb, const float * x, const float * w, float a[NG][NCB], float d,
                        choice_t * out) {
    float total = 0.0f;
    for (int s = 0; s < NG; s++) {
        const float * xs = x + s * G;
        const float * ws = w + s * G;
        float         best = INFINITY;
        int           bc = 0, bm = 1;
        for (int c = 0; c < NCB; c++) {
            const int m0 = a[s][c] > 0.0f ? (int) lrintf(a[s][c] / d) : 1;
            for (int m = m0 - M_SPAN; m <= m0 + M_SPAN; m++) {
                if (m < 1 || m > 16) {
                    continue;
                }
                const float e = group_error(tb, c, xs, ws, d * (float) m, NULL);
                if (e < best) {
                    best = e;
                    bc   = c;
                    bm   = m;
                }
            }
        }
        total += best;
        if (out) {
            out->c[s] = (uint8_t) bc;
            out->l[s] = (uint8_t) (bm - 1);
            group_error(tb, bc, xs, ws, d * (float) bm, out->q + s * G);
        }
    }
    return total;
}

static void choose_block(const tables_t * tb, const float * x, const float * w, choice_t * ch) {
    float a[NG][NCB];
    float amax_a = 0.0f;
    for (int s = 0; s < NG; s++) {
        float best_e = INFINITY, best_a = 0.0f;
        for (int c = 0; c < NCB; c++) {
            float e;
            a[s][c] = best_free_scale(tb, c, x + s * G, w + s * G, &e);
            if (e < best_e) {
                best_e = e;
                best_a = a[s][c];
            }
        }
        amax_a = fmaxf(amax_a, best_a);
    }
    memset(ch, 0, sizeof(*ch));
    if (amax_a == 0.0f) {  // an all-zero block
        return;
    }
    float best = INFINITY, best_d = 0.0f;
    for (int i = 0; i < N_D; i++) {
        const float f = 0.80f + 0.05f * (float) i;   // 0.80 .. 1.10 of the scale that fits the largest at m = 16
        const float d = ggml_ext_fp16_to_fp32(ggml_ext_fp32_to_fp16(fminf(amax_a / 16.0f * f, FP16_MAX)));
        if (!(d > 0.0f)) {
            continue;
        }
        const float e = pick_for_d(tb, x, w, a, d, NULL);
        if (e < best) {
            best   = e;
            best_d = d;
        }
    }
    if (best_d == 0.0f) {  // every candidate underflowed fp16: the block is (numerically) zero
        return;
    }
    pick_for_d(tb, x, w, a, best_d, ch);
    // 3. refine: the least-squares d of the chosen assignment (rounded to fp16), reassigned; kept while it helps
    for (int it = 0; it < 3; it++) {
        float sxv = 0.0f, svv = 0.0f;
        for (int s = 0; s < NG; s++) {
            for (int j = 0; j < G; j++) {
                const float v = (float) (ch->l[s] + 1) * tb->t[ch->c[s]][ch->q[s * G + j]];
                sxv += w[s * G + j] * x[s * G + j] * v;
                svv += w[s * G + j] * v * v;
            }
        }
        if (!(sxv > 0.0f && svv > 0.0f)) {
            break;
        }
        const float d = ggml_ext_fp16_to_fp32(ggml_ext_fp32_to_fp16(fminf(sxv / svv, FP16_MAX)));
        choice_t    trial;
        const float e = d > 0.0f ? pick_for_d(tb, x, w, a, d, &trial) : INFINITY;
        if (!(e < best)) {
            break;
        }
        best   = e;
        best_d = d;
        *ch    = trial;
    }
    ch->d = best_d;
}

static void pack(int bits, const choice_t * ch, void * dst) {
    // CB2's bytes are CB3's first 78: d, scales, cb, qs
    ggml_ext_block_cb3 * y = (ggml_ext_block_cb3 *) dst;  // only the fields CB2 has are written for bits 2
    uint8_t              scales[8] = { 0 }, cb[4] = { 0 }, qs[64] = { 0 }, hm[32] = { 0 };
    for (int s = 0; s < NG; s++) {
        scales[s >> 1] |= (uint8_t) (ch->l[s] << (4 * (s & 1)));
        cb[s >> 2] |= (uint8_t) (ch->c[s] << (2 * (s & 3)));
        for (int j = 0; j < G; j++) {
            const uint8_t q = ch->q[s * G + j];
            qs[16 * (s >> 2) + j] |= (uint8_t) ((q & 3) << (2 * (s & 3)));
            hm[16 * (s >> 3) + j] |= (uint8_t) (((q >> 2) & 1) << (s & 7));
        }
    }
    const ggml_ext_fp16_t d = ggml_ext_fp32_to_fp16(ch->d);
    memcpy(&y->d, &d, sizeof(d));
    memcpy(y->scales, scales, sizeof(scales));
    memcpy(y->cb, cb, sizeof(cb));
    memcpy(y->qs, qs, sizeof(qs));
    if (bits == 3) {
        memcpy(y->hmask, hm, sizeof(hm));
    }
}

int ggml_ext_codebooks_tables_version(void) {
    return GGML_EXT_CODEBOOKS_TABLES_VERSION;
}

int ggml_ext_codebooks_tables(int bits, int8_t * out, size_t n) {
    const int     ne   = bits == 2 ? GGML_EXT_CB2_N_ENTRIES : bits == 3 ? GGML_EXT_CB3_N_ENTRIES : 0;
    const size_t  need = (size_t) NCB * (size_t) ne;
    if (ne == 0 || n < need) {
        return 0;
    }
    memcpy(out, bits == 2 ? (const void *) ggml_ext_cb2_tables : (const void *) ggml_ext_cb3_tables, need);
    return (int) need;
}

size_t ggml_ext_codebooks_block_size(int bits) {
    return bits == 2 ? sizeof(ggml_ext_block_cb2) : bits == 3 ? sizeof(ggml_ext_block_cb3) : 0;
}

size_t ggml_ext_codebooks_quantize(int bits, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                   const float * importance) {
    const size_t bs = ggml_ext_codebooks_block_size(bits);
    if (bs == 0 || n_per_row <= 0 || n_per_row % QK || nrows < 0) {
        return 0;
    }
    for (int64_t i = 0; i < nrows * n_per_row; i++) {
        if (!isfinite(src[i])) {
            return 0;
        }
    }
    if (importance) {
        for (int64_t i = 0; i < n_per_row; i++) {
            if (!isfinite(importance[i]) || importance[i] < 0.0f) {
                return 0;
            }
        }
    }
    tables_t tb;
    load_tables(bits, &tb);
    const int64_t nb = n_per_row / QK;
    uint8_t *     out = (uint8_t *) dst;
    for (int64_t r = 0; r < nrows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float * x = src + r * n_per_row + b * QK;
            float         w[QK];
            for (int s = 0; s < NG; s++) {  // a sub-group whose importance is all zero counts its weights equally
                float sum = 0.0f;
                for (int j = 0; j < G; j++) {
                    w[s * G + j] = importance ? importance[b * QK + s * G + j] : 1.0f;
                    sum += w[s * G + j];
                }
                if (!(sum > 0.0f)) {
                    for (int j = 0; j < G; j++) {
                        w[s * G + j] = 1.0f;
                    }
                }
            }
            choice_t ch;
            choose_block(&tb, x, w, &ch);
            pack(bits, &ch, out);
            out += bs;
        }
    }
    return (size_t) (nrows * nb) * bs;
}

int ggml_ext_codebooks_dequantize(int bits, const void * src, float * dst, int64_t n_blocks) {
    const size_t bs = ggml_ext_codebooks_block_size(bits);
    if (bs == 0) {
        return -1;
    }
    const uint8_t * p = (const uint8_t *) src;
    for (int64_t b = 0; b < n_blocks; b++, p += bs) {
        const ggml_ext_block_cb3 * y = (const ggml_ext_block_cb3 *) p;  // CB2's fields are CB3's first ones
        ggml_ext_fp16_t            dh;
        memcpy(&dh, p, sizeof(dh));
        const float d = ggml_ext_fp16_to_fp32(dh);
        for (int s = 0; s < NG; s++) {
            const float m = d * (float) (((y->scales[s >> 1] >> (4 * (s & 1))) & 15) + 1);
            const int   c = (y->cb[s >> 2] >> (2 * (s & 3))) & 3;
            for (int j = 0; j < G; j++) {
                int q = (y->qs[16 * (s >> 2) + j] >> (2 * (s & 3))) & 3;
                if (bits == 3) {
                    q |= ((y->hmask[16 * (s >> 3) + j] >> (s & 7)) & 1) << 2;
                }
                const int t = bits == 2 ? ggml_ext_cb2_tables[c][q] : ggml_ext_cb3_tables[c][q];
                dst[b * QK + s * G + j] = m * (float) t;
            }
        }
    }
    return 0;
}
