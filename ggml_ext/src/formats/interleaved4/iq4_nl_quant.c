// IQ4_NL quantizer: for each 32-weight block, the scale d minimising
//     E(d) = sum_i w_i (x_i - d * v[q_i])^2,   q_i = the codebook entry nearest x_i / d,
// found exactly rather than from a few guesses.
//
// Why exact is cheap: with u = 1/d of one sign fixed, q_i changes only where x_i * u crosses a
// midpoint between two codebook values, so u > 0 splits into at most 32 * 8 intervals, on each
// of which the assignment is fixed and the best d is the least-squares one, sum(w x v) / sum(w v^2),
// with error sum(w x^2) - sum(w x v)^2 / sum(w v^2). Sorting the crossings and updating the two
// sums one crossing at a time visits every interval; the global minimiser of E lies inside one
// of them (E is the lower envelope of those quadratics), so the best interval's least-squares d
// is the optimum over all real d. Both signs of d are searched: the table is asymmetric
// (-127 .. 113), so a block whose largest weight is positive may do better on the -127 end.
// Last, d must be stored as fp16: the rounded value and its two fp16 neighbours are scored
// with the true E (indices reassigned) and the best kept.
#include "formats/interleaved4/iq4_nl_quant.h"

#include "common/fp16.h"

#include <math.h>
#include <string.h>

#define QK       GGML_EXT_QK4_NL
#define N_VALUES 16
#define FP16_MAX 65504.0f

_Static_assert(sizeof(ggml_ext_block_iq4_nl) == 18, "block_iq4_nl is fp16 d + 16 bytes");

static const int8_t kvalues[N_VALUES] = { GGML_EXT_IQ4_NL_VALUES };

// Midpoint k lies between values k and k + 1: z >= mid[k] means index > k.
static const float mid[N_VALUES - 1] = { -115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                         7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f };
#define FIRST_POSITIVE_MID 8  // mid[8] = 7 is the first one above zero; index 8 (value 1) is nearest 0

static inline int nearest_index(float z) {
    int i = 0;
    for (int k = 0; k < N_VALUES - 1; k++) {
        i += z >= mid[k];
    }
    return i;
}

// LSD radix sort of (u bits << 16 | payload) on the 32 key bits; u > 0, so its IEEE bits order
// like the values. A pass whose byte is the same for every key is skipped.
static void sort_events(uint64_t * a, uint64_t * tmp, int n) {
    uint64_t * src = a;
    uint64_t * dst = tmp;
    for (int shift = 16; shift < 48; shift += 8) {
        int count[256] = { 0 };
        for (int i = 0; i < n; i++) {
            count[(src[i] >> shift) & 255]++;
        }
        if (count[(src[0] >> shift) & 255] == n) {
            continue;
        }
        int pos = 0;
        for (int b = 0; b < 256; b++) {
            const int c = count[b];
            count[b]    = pos;
            pos += c;
        }
        for (int i = 0; i < n; i++) {
            dst[count[(src[i] >> shift) & 255]++] = src[i];
        }
        uint64_t * t = src;
        src          = dst;
        dst          = t;
    }
    if (src != a) {
        memcpy(a, src, (size_t) n * sizeof(*a));
    }
}

static inline uint64_t event(float u, int elem, int new_index) {
    uint32_t bits;
    memcpy(&bits, &u, sizeof(bits));
    return ((uint64_t) bits << 16) | (uint64_t) (elem | (new_index << 5));
}

// Best least-squares scale c > 0 for y ~ c * v[q] over every interval of u = 1/c (y = sign * x
// normalised to |y| <= 1). Returns the largest sum(w y v)^2 / sum(w v^2) found (0 if none), and c.
static double sweep(const float * y, const float * w, double * c_out) {
    uint64_t ev[QK * (N_VALUES / 2)];
    uint64_t tmp[QK * (N_VALUES / 2)];
    int      n = 0;
    // u -> 0+: every y * u is nearest 0, index 8 (value 1).
    double   sqx = 0, sq2 = 0;
    for (int i = 0; i < QK; i++) {
        sqx += (double) w[i] * y[i];
        sq2 += (double) w[i];
        if (y[i] > 0) {  // y * u climbs through mid[8..14]: index k -> k + 1
            const float iy = 1.0f / y[i];
            for (int k = FIRST_POSITIVE_MID; k < N_VALUES - 1; k++) {
                ev[n++] = event(mid[k] * iy, i, k + 1);
            }
        } else if (y[i] < 0) {  // y * u falls through mid[7..0]: index k + 1 -> k
            const float iy = 1.0f / y[i];
            for (int k = FIRST_POSITIVE_MID - 1; k >= 0; k--) {
                ev[n++] = event(mid[k] * iy, i, k);
            }
        }
    }
    double best = 0, c = 0;
    if (sqx > 0 && sq2 > 0) {
        best = sqx * sqx / sq2;
        c    = sqx / sq2;
    }
    if (n > 0) {
        sort_events(ev, tmp, n);
    }
    for (int e = 0; e < n; e++) {
        const int    i    = (int) (ev[e] & 31);
        const int    knew = (int) ((ev[e] >> 5) & 15);
        const int    kold = y[i] > 0 ? knew - 1 : knew + 1;
        const double vn = kvalues[knew], vo = kvalues[kold];
        sqx += (double) w[i] * y[i] * (vn - vo);
        sq2 += (double) w[i] * (vn * vn - vo * vo);
        // sqx^2 / sq2 > best, without a division per interval
        if (sqx > 0 && sqx * sqx > best * sq2) {
            best = sqx * sqx / sq2;
            c    = sqx / sq2;
        }
    }
    *c_out = c;
    return best;
}

// True weighted error of the fp16 scale h with nearest indices; L gets the indices.
static double score(const float * x, const float * w, uint16_t h, uint8_t * L) {
    const float d   = ggml_ext_fp16_to_fp32(h);
    double      err = 0;
    if (d == 0.0f) {
        for (int i = 0; i < QK; i++) {
            L[i] = FIRST_POSITIVE_MID;  // value 1 * 0 = 0
            err += (double) w[i] * x[i] * x[i];
        }
        return err;
    }
    const float id = 1.0f / d;
    for (int i = 0; i < QK; i++) {
        L[i]           = (uint8_t) nearest_index(x[i] * id);
        const double r = (double) x[i] - (double) d * kvalues[L[i]];
        err += (double) w[i] * r * r;
    }
    return err;
}

static void weights_for(const float * xs, const float * im, int weighting, float * w) {
    float sigma2 = 0;
    for (int i = 0; i < QK; i++) {
        sigma2 += xs[i] * xs[i];
    }
    sigma2 /= QK;
    for (int i = 0; i < QK; i++) {
        float f;
        switch (weighting) {
            case GGML_EXT_IQ4_NL_W_ONE:       f = 1.0f; break;
            case GGML_EXT_IQ4_NL_W_X2:        f = xs[i] * xs[i]; break;
            case GGML_EXT_IQ4_NL_W_SQRT_S2X2: f = sqrtf(sigma2 + xs[i] * xs[i]); break;
            default:                          f = sigma2 + xs[i] * xs[i]; break;
        }
        w[i] = im ? im[i] * f : f;
    }
}

static int default_weighting(const float * imatrix) {
    (void) imatrix;
    return GGML_EXT_IQ4_NL_W_SQRT_S2X2;
}

static void quantize_block(const float * x, const float * im, int weighting, ggml_ext_block_iq4_nl * y) {
    float amax = 0;
    for (int i = 0; i < QK; i++) {
        amax = fmaxf(amax, fabsf(x[i]));
    }
    if (amax == 0.0f) {
        y->d = 0;
        memset(y->qs, FIRST_POSITIVE_MID | (FIRST_POSITIVE_MID << 4), sizeof(y->qs));
        return;
    }
    // Work on x / amax: no overflow in squares for huge blocks, none lost in tiny ones.
    float       xs[QK], w[QK], ys[QK];
    const float inv = 1.0f / amax;
    for (int i = 0; i < QK; i++) {
        xs[i] = x[i] * inv;
    }
    weights_for(xs, im, weighting, w);
    float wmax = 0;
    for (int i = 0; i < QK; i++) {
        wmax = fmaxf(wmax, w[i]);
    }
    if (!(wmax > 0) || !isfinite(wmax)) {  // an all-zero importance row for this block: plain error
        weights_for(xs, NULL, GGML_EXT_IQ4_NL_W_ONE, w);
        wmax = 1;
    }
    for (int i = 0; i < QK; i++) {
        w[i] /= wmax;
    }

    double c_pos, c_neg;
    const double f_pos = sweep(xs, w, &c_pos);
    for (int i = 0; i < QK; i++) {
        ys[i] = -xs[i];
    }
    const double f_neg = sweep(ys, w, &c_neg);
    float        d     = (float) (f_neg > f_pos ? -c_neg : c_pos) * amax;
    d                  = fminf(FP16_MAX, fmaxf(-FP16_MAX, d));  // keep d finite in fp16

    // fp16 rounding: the rounded scale and its neighbours of the same sign, scored on x itself.
    const uint16_t h0 = ggml_ext_fp32_to_fp16(d);
    uint16_t       cand[3];
    int            nc = 0;
    cand[nc++]        = h0;
    if ((h0 & 0x7fff) < 0x7bff) {
        cand[nc++] = (uint16_t) (h0 + 1);  // one ulp larger in magnitude, still finite
    }
    if ((h0 & 0x7fff) > 0) {
        cand[nc++] = (uint16_t) (h0 - 1);
    }
    uint8_t L[QK], Lt[QK];
    double  best = score(x, w, cand[0], L);
    uint16_t hb  = cand[0];
    for (int c = 1; c < nc; c++) {
        const double e = score(x, w, cand[c], Lt);
        if (e < best) {
            best = e;
            hb   = cand[c];
            memcpy(L, Lt, sizeof(L));
        }
    }
    y->d = hb;
    for (int j = 0; j < QK / 2; j++) {
        y->qs[j] = (uint8_t) (L[j] | (L[j + QK / 2] << 4));
    }
}

void ggml_ext_iq4_nl_quantize_block(const float * x, const float * w, ggml_ext_block_iq4_nl * y) {
    quantize_block(x, w, default_weighting(w), y);
}

void ggml_ext_iq4_nl_dequantize(const ggml_ext_block_iq4_nl * x, float * y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const float d = ggml_ext_fp16_to_fp32(x[b].d);
        for (int j = 0; j < QK / 2; j++) {
            y[b * QK + j]          = d * kvalues[x[b].qs[j] & 15];
            y[b * QK + j + QK / 2] = d * kvalues[x[b].qs[j] >> 4];
        }
    }
}

static int all_finite(const float * a, int64_t n, int nonnegative) {
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || (nonnegative && a[i] < 0)) {
            return 0;
        }
    }
    return 1;
}

size_t ggml_ext_quantize_iq4_nl_weighted(const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                         const float * imatrix, int weighting) {
    if (n_per_row <= 0 || n_per_row % QK != 0 || nrows < 0 || weighting < GGML_EXT_IQ4_NL_W_DEFAULT ||
        weighting > GGML_EXT_IQ4_NL_W_S2X2) {
        return 0;
    }
    if (imatrix && !all_finite(imatrix, n_per_row, 1)) {
        return 0;
    }
    if (!all_finite(src, nrows * n_per_row, 0)) {
        return 0;
    }
    if (weighting == GGML_EXT_IQ4_NL_W_DEFAULT) {
        weighting = default_weighting(imatrix);
    }
    const int64_t           nb = n_per_row / QK;
    ggml_ext_block_iq4_nl * y  = (ggml_ext_block_iq4_nl *) dst;
    for (int64_t r = 0; r < nrows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            quantize_block(src + r * n_per_row + b * QK, imatrix ? imatrix + b * QK : NULL, weighting,
                           y + r * nb + b);
        }
    }
    return (size_t) (nrows * nb) * sizeof(ggml_ext_block_iq4_nl);
}

size_t ggml_ext_quantize_iq4_nl(const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                const float * imatrix) {
    return ggml_ext_quantize_iq4_nl_weighted(src, dst, nrows, n_per_row, imatrix, GGML_EXT_IQ4_NL_W_DEFAULT);
}
