// Any-precision bitplanes: the quantizer (seed + incremental upscaling), the byte layout and
// dequantization, in scalar C (anyprec.h has the format; docs/formats/anyprec.md the bytes).
//
// Everything runs on the sorted row: in one dimension every k-means cluster (seed) and every
// 2-means half (upscaling) is a range of consecutive sorted values, so with prefix sums of
// w, w*x and w*x^2 a range's weighted mean and squared error cost O(1). The seed is the exact
// optimum of weighted 1-D k-means (dynamic programming over split points; the optimal split
// points move right as the prefix grows, so each of the k passes is a divide-and-conquer over
// positions, O(k n log n)); each upscaling step splits every range at its exact weighted 2-means
// optimum (a scan over its split points). Rows longer than APQ_DP_EXACT_MAX (Llama-7B's 4096 and 11008)
// run the seed's dynamic programming over a grid of APQ_DP_GRID evenly spaced sorted positions instead
// and then polish every seed boundary at full resolution (coordinate descent, apq_refine at the seed's
// precision): O(k m log m + n) instead of O(k n log n), 10-30x less work on those rows, the same seed on
// almost every row and a local optimum on all (docs/formats/anyprec.md, "Quantization time"). With refine R > 0 (the default, GGML_EXT_ANYPREC_REFINE), the seed
// and the first R splits are then moved together by coordinate descent on the summed weighted error of
// precisions S..S+R (apq_refine), still nested. A weight's P-bit code is the index of its final range:
// splitting a range gives its children codes 2c and 2c + 1, so the top b bits are the b-bit code.
#include "formats/anyprec/anyprec.h"

#include "common/fp16.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Seeds of rows up to this length are the exact DP optimum; longer rows: DP on a grid, then polished.
#define APQ_DP_EXACT_MAX 2048
#define APQ_DP_GRID      512


typedef struct {
    double * sw;   // prefix sums over the sorted row: w, w*x, w*x^2 (n + 1 each)
    double * swx;
    double * swxx;
    double * sx;   // plain x (means of clusters whose weights sum to 0)
} apq_prefix;

// Weighted squared error of sorted items [l, r) around their weighted mean.
static inline double apq_cost(const apq_prefix * p, int64_t l, int64_t r) {
    const double W = p->sw[r] - p->sw[l];
    if (r <= l || W <= 0.0) {
        return 0.0;
    }
    const double S1 = p->swx[r] - p->swx[l];
    const double c  = p->swxx[r] - p->swxx[l] - S1 * S1 / W;
    return c > 0.0 ? c : 0.0;
}

static inline double apq_mean(const apq_prefix * p, int64_t l, int64_t r, double fallback) {
    if (r <= l) {
        return fallback;
    }
    const double W = p->sw[r] - p->sw[l];
    if (W > 0.0) {
        return (p->swx[r] - p->swx[l]) / W;
    }
    return (p->sx[r] - p->sx[l]) / (double) (r - l);
}

typedef struct {
    const apq_prefix * p;
    const int64_t *    pos;   // grid point i -> sorted position (NULL: every position is a grid point)
    const double *     prev;  // D[k-1][i], i = 0..n
    double *           cur;   // D[k][i]
    int64_t *          arg;   // best split for D[k][i]
} apq_dp;

// D[k][i] = min over j < i of D[k-1][j] + cost(j, i) for i in [lo, hi], knowing the optimal j
// lies in [jlo, jhi] (monotone: the 1-D k-means cost satisfies the quadrangle inequality).
static void apq_dp_solve(apq_dp * d, int64_t lo, int64_t hi, int64_t jlo, int64_t jhi) {
    while (lo <= hi) {
        const int64_t mid  = lo + (hi - lo) / 2;
        double        best = INFINITY;
        int64_t       bj   = jlo;
        const int64_t jmax = jhi < mid ? jhi : mid;  // j <= mid: the last segment may be empty
        const int64_t pm   = d->pos ? d->pos[mid] : mid;
        for (int64_t j = jlo; j <= jmax; j++) {
            const double v = d->prev[j] + apq_cost(d->p, d->pos ? d->pos[j] : j, pm);
            if (v < best) {
                best = v;
                bj   = j;
            }
        }
        d->cur[mid] = best;
        d->arg[mid] = bj;
        // left half recursively, right half by the loop (bounded stack: log n deep)
        if (mid - lo < hi - mid) {
            apq_dp_solve(d, lo, mid - 1, jlo, bj);
            lo  = mid + 1;
            jlo = bj;
        } else {
            apq_dp_solve(d, mid + 1, hi, bj, jhi);
            hi  = mid - 1;
            jhi = bj;
        }
    }
}

typedef struct {
    float   x;
    float   w;
    int64_t j;
} apq_item;

// x's bits as an unsigned key in the order of the floats (-0 taken as +0: equal values tie).
static inline uint32_t apq_key(float x) {
    uint32_t u;
    x = x == 0.0f ? 0.0f : x;
    memcpy(&u, &x, sizeof(u));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The row's items sorted by x, ties by position (deterministic): a stable LSD radix sort of the
// keys (4 passes of 8 bits) over positions taken in order. buf: 4 n words of scratch.
static void apq_sort_row(const float * x, const float * w, int64_t n, apq_item * it, uint32_t * buf) {
    uint32_t * key = buf, * idx = buf + n, * key2 = buf + 2 * n, * idx2 = buf + 3 * n;
    for (int64_t j = 0; j < n; j++) {
        key[j] = apq_key(x[j]);
        idx[j] = (uint32_t) j;
    }
    for (int shift = 0; shift < 32; shift += 8) {
        int64_t cnt[257] = { 0 };
        for (int64_t j = 0; j < n; j++) {
            cnt[((key[j] >> shift) & 0xff) + 1]++;
        }
        if (cnt[((key[0] >> shift) & 0xff) + 1] == n) {
            continue;  // every key has this digit: the pass would not move anything
        }
        for (int d = 0; d < 256; d++) {
            cnt[d + 1] += cnt[d];
        }
        for (int64_t j = 0; j < n; j++) {
            const int64_t o = cnt[(key[j] >> shift) & 0xff]++;
            key2[o] = key[j];
            idx2[o] = idx[j];
        }
        uint32_t * t = key;
        key = key2;
        key2 = t;
        t = idx;
        idx = idx2;
        idx2 = t;
    }
    for (int64_t i = 0; i < n; i++) {
        const uint32_t j = idx[i];
        it[i].x = x[j];
        it[i].w = w ? (w[j] > 0.0f ? w[j] : 0.0f) : 1.0f;
        it[i].j = j;
    }
}

int64_t ggml_ext_anyprec_row_table_len(int seed_bits, int parent_bits) {
    return ((int64_t) 1 << (parent_bits + 1)) - ((int64_t) 1 << seed_bits);
}

static int apq_bits_ok(int seed_bits, int parent_bits) {
    return seed_bits >= GGML_EXT_ANYPREC_MIN_BITS && seed_bits <= parent_bits && parent_bits <= GGML_EXT_ANYPREC_MAX_BITS;
}

// The split of sorted items [l, r) at its exact weighted 2-means optimum (a scan over the split
// points; equal values stay together); r when the range cannot be split (empty, one value).
static int64_t apq_best_split(const apq_prefix * p, const apq_item * it, int64_t l, int64_t r) {
    int64_t s = r;
    double  best = INFINITY;
    for (int64_t m = l + 1; m < r; m++) {
        if (it[m].x == it[m - 1].x) {
            continue;
        }
        const double v = apq_cost(p, l, m) + apq_cost(p, m, r);
        if (v < best) {
            best = v;
            s    = m;
        }
    }
    return s;
}

// Upscaling by one bit: every range of bounds (nr ranges) split at its optimal 2-means point;
// range c's children are 2c and 2c + 1 (nbounds: 2 nr + 1 entries).
static void apq_split_all(const apq_prefix * p, const apq_item * it, const int64_t * bounds, int nr, int64_t * nbounds) {
    for (int c = 0; c < nr; c++) {
        nbounds[2 * c]     = bounds[c];
        nbounds[2 * c + 1] = apq_best_split(p, it, bounds[c], bounds[c + 1]);
    }
    nbounds[2 * nr] = bounds[nr];
}

// Joint refinement of precisions S..L (L > S): bounds holds the K = 2^L ranges of precision L, and
// precision b's ranges are unions of 2^(L-b) consecutive ones (the nesting). Coordinate descent on
// the sum over b = S..L of precision b's weighted squared error: each boundary i moves to the best
// position between its neighbours i - 1 and i + 1, counting the two ranges it separates at every
// precision where it is a boundary (precision b >= the coarsest one, L - min(ctz(i), L - S)). Every
// move lowers the sum strictly, so it ends no worse than the greedy splits it starts from; each
// sweep costs O(n (L - S + 1)), small next to the seed's dynamic programming.
static void apq_refine(const apq_prefix * p, const apq_item * it, int64_t * B, int S, int L, int64_t n,
                       const double * lam) {
    const int K = 1 << L;
    for (int sweep = 0; sweep < GGML_EXT_ANYPREC_REFINE_SWEEPS; sweep++) {
        int moved = 0;
        for (int i = 1; i < K; i++) {
            int tz = 0;
            while (!((i >> tz) & 1)) {
                tz++;
            }
            const int     coarse = L - (tz < L - S ? tz : L - S);
            const int64_t lo = B[i - 1], hi = B[i + 1];
            double        cur = 0.0;
            for (int b = coarse; b <= L; b++) {
                const int st = 1 << (L - b);
                cur += lam[b - S] * (apq_cost(p, B[i - st], B[i]) + apq_cost(p, B[i], B[i + st]));
            }
            double  best = cur - 1e-12 * cur;  // only strict improvements: no cycling on ties
            int64_t bm   = B[i];
            for (int64_t m = lo; m <= hi; m++) {
                if (m == B[i] || (m > 0 && m < n && it[m].x == it[m - 1].x)) {
                    continue;
                }
                double v = 0.0;
                for (int b = coarse; b <= L; b++) {
                    const int st = 1 << (L - b);
                    v += lam[b - S] * (apq_cost(p, B[i - st], m) + apq_cost(p, m, B[i + st]));
                }
                if (v < best) {
                    best = v;
                    bm   = m;
                }
            }
            if (bm != B[i]) {
                B[i]  = bm;
                moved = 1;
            }
        }
        if (!moved) {
            break;
        }
    }
}

// The seed's grid on a long sorted row: half the points evenly spaced in position (the dense middle),
// half evenly spaced in value (the sparse tails, where a heavy-tailed row's outer clusters hold a few
// weights each), merged; 0 and n included. Returns the number of ranges m (<= APQ_DP_GRID), grid[0..m].
static int64_t apq_grid(const apq_item * it, int64_t n, int64_t * grid) {
    const int64_t h  = APQ_DP_GRID / 2;
    const double  x0 = it[0].x, x1 = it[n - 1].x;
    int64_t       m = 0, a = 0, b = 0, pv = 0;  // a: next position point, b: next value point
    grid[0] = 0;
    while (a <= h || b <= h) {
        const int64_t pa = a <= h ? a * n / h : INT64_MAX;
        int64_t       pb = INT64_MAX;
        if (b <= h) {  // first position whose value reaches the b-th value point
            const double v = b == h ? HUGE_VAL : x0 + (x1 - x0) * (double) b / (double) h;
            while (pv < n && (double) it[pv].x < v) {
                pv++;
            }
            pb = pv;
        }
        const int64_t q = pa < pb ? pa : pb;
        a += pa == q;
        b += pb == q;
        if (q > grid[m] && m < APQ_DP_GRID) {
            grid[++m] = q;
        }
    }
    grid[m] = n;  // the last point is n (also when the cap cut the merge short)
    return m;
}

// The optimal partition of the sorted row into K ranges (some may be empty), bounds[0..K]: the dynamic programme
// over every position, or on rows longer than APQ_DP_EXACT_MAX over apq_grid's points, then each boundary
// polished at full resolution (apq_refine at one precision: to its best position between its neighbours).
static void apq_partition(const apq_prefix * p, const apq_item * it, int64_t n, int K, double * dp, int64_t * arg,
                          int64_t * bounds) {
    int64_t         m   = n;
    const int64_t * pos = NULL;
    int64_t         grid[APQ_DP_GRID + 1];
    if (n > APQ_DP_EXACT_MAX) {
        m   = apq_grid(it, n, grid);
        pos = grid;
    }
    double * prev = dp;
    double * cur  = dp + (m + 1);
    for (int64_t i = 0; i <= m; i++) {
        prev[i] = apq_cost(p, 0, pos ? pos[i] : i);
        arg[i]  = 0;  // row 1 of arg: all ranges start at 0
    }
    for (int k = 2; k <= K; k++) {
        apq_dp d = { p, pos, prev, cur, arg + (int64_t) (k - 1) * (m + 1) };
        apq_dp_solve(&d, 0, m, 0, m);
        double * t = prev;
        prev       = cur;
        cur        = t;
    }
    bounds[K]  = n;
    int64_t hi = m;
    for (int k = K; k >= 2; k--) {
        hi            = arg[(int64_t) (k - 1) * (m + 1) + hi];
        bounds[k - 1] = pos ? pos[hi] : hi;
    }
    bounds[0] = 0;
    if (pos) {
        static const double one = 1.0;
        int                 b   = 0;
        while ((1 << b) < K) {
            b++;
        }
        apq_refine(p, it, bounds, b, b, n, &one);
    }
}

// The joint objective of apq_refine: sum over b = S..L of lam[b - S] x precision b's weighted squared error.
static double apq_joint(const apq_prefix * p, const int64_t * B, int S, int L, const double * lam) {
    double J = 0.0;
    for (int b = S; b <= L; b++) {
        const int st = 1 << (L - b);
        double    e  = 0.0;
        for (int c = 0; c < (1 << b); c++) {
            e += apq_cost(p, B[c * st], B[(c + 1) * st]);
        }
        J += lam[b - S] * e;
    }
    return J;
}

// Precision b's centroids from the 2^b ranges bounds[c*st] .. bounds[(c+1)*st] (st = 2^(L-b)):
// weighted means, an empty range repeating its parent's centroid (par: precision b-1's, or NULL
// at the seed: the row's mean).
static void apq_centroids(const apq_prefix * p, const int64_t * bounds, int b, int L, const double * par,
                          double row_mean, double * cent) {
    const int st = 1 << (L - b);
    for (int c = 0; c < (1 << b); c++) {
        cent[c] = apq_mean(p, bounds[c * st], bounds[(c + 1) * st], par ? par[c >> 1] : row_mean);
    }
}

// One row: x, w (n) -> codes (n), tables (row_table_len floats). Work buffers passed in.
static void apq_quantize_row(const float * x, const float * w, int64_t n, int S, int P, int refine, int starts,
                             const double * lam, uint8_t * codes, float * tables, apq_item * it, uint32_t * sortbuf,
                             apq_prefix * p, double * dp, int64_t * arg, int64_t * bounds, int64_t * nbounds,
                             int64_t * tb) {
    apq_sort_row(x, w, n, it, sortbuf);
    // centre on the row's mid-range: the prefix sums of x^2 lose less to cancellation
    const double c0 = 0.5 * ((double) it[0].x + (double) it[n - 1].x);
    p->sw[0] = p->swx[0] = p->swxx[0] = p->sx[0] = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double v  = (double) it[i].x - c0;
        const double wi = (double) it[i].w;
        p->sw[i + 1]    = p->sw[i] + wi;
        p->swx[i + 1]   = p->swx[i] + wi * v;
        p->swxx[i + 1]  = p->swxx[i] + wi * v * v;
        p->sx[i + 1]    = p->sx[i] + v;
    }

    // Seed: the optimal partition of the sorted row into 2^S ranges; upscaling: every range split at its
    // optimal 2-means point, one bit at a time. The first `refine` splits are then refined jointly with the
    // seed (apq_refine), the rest stay greedy. With starts T > 0 the refinement also starts from the optimal
    // partition at S+1 .. S+T bits (its coarser precisions by the nesting, finer ones by greedy splits) and
    // the start with the lowest joint objective wins.
    const int L  = S + refine < P ? S + refine : P;
    const int T  = L - S < starts ? L - S : starts;
    double    bestJ = INFINITY;
    for (int t = S; t <= S + T; t++) {
        int64_t * B = t == S ? bounds : tb;
        apq_partition(p, it, n, 1 << t, dp, arg, B);
        int nr = 1 << t;
        for (int b = t + 1; b <= L; b++) {
            apq_split_all(p, it, B, nr, nbounds);
            nr *= 2;
            memcpy(B, nbounds, sizeof(*B) * (size_t) (nr + 1));
        }
        if (L > S) {
            apq_refine(p, it, B, S, L, n, lam);
        }
        if (T > 0) {
            const double J = apq_joint(p, B, S, L, lam);
            if (J < bestJ) {
                bestJ = J;
                if (B != bounds) {
                    memcpy(bounds, B, sizeof(*B) * (size_t) ((1 << L) + 1));
                }
            }
        }
    }
    int nr = 1 << L;
    const double row_mean = apq_mean(p, 0, n, 0.0);
    float *      tab      = tables;
    double       par[256], cent[256];
    for (int b = S; b <= P; b++) {
        if (b > L) {
            apq_split_all(p, it, bounds, nr, nbounds);
            nr *= 2;
            memcpy(bounds, nbounds, sizeof(*bounds) * (size_t) (nr + 1));
        }
        apq_centroids(p, bounds, b, b > L ? b : L, b == S ? NULL : par, row_mean, cent);
        for (int c = 0; c < (1 << b); c++) {
            par[c] = cent[c];
            tab[c] = (float) (cent[c] + c0);
        }
        tab += 1 << b;
    }
    for (int c = 0; c < nr; c++) {
        for (int64_t i = bounds[c]; i < bounds[c + 1]; i++) {
            codes[it[i].j] = (uint8_t) c;
        }
    }
}

int ggml_ext_anyprec_quantize_ex(const float * x, const float * w, int64_t n_rows, int64_t n_per_row, int seed_bits,
                                 int parent_bits, int refine, int starts, double gain, uint8_t * codes, float * tables) {
    if (!apq_bits_ok(seed_bits, parent_bits) || n_per_row < 1 || n_per_row > (int64_t) UINT32_MAX || n_rows < 0 || !x ||
        !codes || !tables || refine < 0 || starts < 0 || !(gain > 0.0) || !isfinite(gain)) {
        return -1;
    }
    const int64_t n  = n_per_row;
    const int     L  = seed_bits + refine < parent_bits ? seed_bits + refine : parent_bits;
    const int     T  = L - seed_bits < starts ? L - seed_bits : starts;
    const int     K  = 1 << (seed_bits + T);  // the most ranges a start's dynamic programme finds
    apq_item *    it  = malloc(sizeof(apq_item) * (size_t) n);
    uint32_t *    sbuf = malloc(sizeof(uint32_t) * (size_t) (4 * n));
    double *      pre = malloc(sizeof(double) * (size_t) (4 * (n + 1)));
    double *      dp  = malloc(sizeof(double) * (size_t) (2 * (n + 1)));
    int64_t *     arg = malloc(sizeof(int64_t) * (size_t) K * (size_t) (n + 1));
    int64_t       bounds[257], nbounds[257], tb[257];
    double        lam[GGML_EXT_ANYPREC_MAX_BITS + 1];
    for (int b = 0; b <= GGML_EXT_ANYPREC_MAX_BITS; b++) {
        lam[b] = pow(gain, b);  // precision seed + b's weight in the joint objective
    }
    int rc = 0;
    if (!it || !sbuf || !pre || !dp || !arg) {
        rc = -1;
    } else {
        apq_prefix    p  = { pre, pre + (n + 1), pre + 2 * (n + 1), pre + 3 * (n + 1) };
        const int64_t tl = ggml_ext_anyprec_row_table_len(seed_bits, parent_bits);
        for (int64_t r = 0; r < n_rows; r++) {
            apq_quantize_row(x + r * n, w ? w + r * n : NULL, n, seed_bits, parent_bits, refine, starts, lam,
                             codes + r * n, tables + r * tl, it, sbuf, &p, dp, arg, bounds, nbounds, tb);
        }
    }
    free(it);
    free(sbuf);
    free(pre);
    free(dp);
    free(arg);
    return rc;
}

int ggml_ext_anyprec_quantize_refined(const float * x, const float * w, int64_t n_rows, int64_t n_per_row, int seed_bits,
                                      int parent_bits, int refine, uint8_t * codes, float * tables) {
    return ggml_ext_anyprec_quantize_ex(x, w, n_rows, n_per_row, seed_bits, parent_bits, refine, GGML_EXT_ANYPREC_STARTS,
                                        GGML_EXT_ANYPREC_GAIN, codes, tables);
}

int ggml_ext_anyprec_quantize(const float * x, const float * w, int64_t n_rows, int64_t n_per_row, int seed_bits,
                              int parent_bits, uint8_t * codes, float * tables) {
    return ggml_ext_anyprec_quantize_refined(x, w, n_rows, n_per_row, seed_bits, parent_bits, GGML_EXT_ANYPREC_REFINE,
                                             codes, tables);
}

double ggml_ext_anyprec_row_sse(const float * x, const float * w, int64_t n_per_row, const uint8_t * codes,
                                const float * tables, int seed_bits, int parent_bits, int bits) {
    const float * t = tables + (((int64_t) 1 << bits) - ((int64_t) 1 << seed_bits));
    double        s = 0.0;
    for (int64_t j = 0; j < n_per_row; j++) {
        const double e = (double) x[j] - (double) t[codes[j] >> (parent_bits - bits)];
        s += (w ? (double) w[j] : 1.0) * e * e;
    }
    return s;
}

size_t ggml_ext_anyprec_planes_size(int parent_bits, int64_t n_rows, int64_t n_per_row) {
    return (size_t) parent_bits * (size_t) n_rows * (size_t) (n_per_row / 8);
}

int ggml_ext_anyprec_pack(const uint8_t * codes, int64_t r0, int64_t nr, int64_t n_rows, int64_t n_per_row,
                          int parent_bits, uint8_t * planes) {
    if (n_per_row % GGML_EXT_ANYPREC_QK || parent_bits < 1 || parent_bits > 8 || r0 < 0 || r0 + nr > n_rows) {
        return -1;
    }
    const int64_t row_bytes   = n_per_row / 8;
    const size_t  plane_bytes = (size_t) n_rows * (size_t) row_bytes;
    for (int k = 0; k < parent_bits; k++) {
        const int shift = parent_bits - 1 - k;
        for (int64_t r = 0; r < nr; r++) {
            const uint8_t * c   = codes + r * n_per_row;
            uint8_t *       dst = planes + (size_t) k * plane_bytes + (size_t) (r0 + r) * (size_t) row_bytes;
            for (int64_t i = 0; i < row_bytes; i++) {
                uint8_t byte = 0;
                for (int l = 0; l < 8; l++) {
                    byte |= (uint8_t) (((c[8 * i + l] >> shift) & 1) << l);
                }
                dst[i] = byte;
            }
        }
    }
    return 0;
}

int64_t ggml_ext_anyprec_table_offset(int64_t n_rows, int seed_bits, int bits) {
    return n_rows * (((int64_t) 1 << bits) - ((int64_t) 1 << seed_bits));
}

int ggml_ext_anyprec_pack_tables(const float * tables, int64_t r0, int64_t nr, int64_t n_rows, int seed_bits,
                                 int parent_bits, ggml_ext_fp16_t * out) {
    if (!apq_bits_ok(seed_bits, parent_bits) || r0 < 0 || r0 + nr > n_rows) {
        return -1;
    }
    const int64_t tl = ggml_ext_anyprec_row_table_len(seed_bits, parent_bits);
    for (int b = seed_bits; b <= parent_bits; b++) {
        const int64_t K   = (int64_t) 1 << b;
        const int64_t off = ((int64_t) 1 << b) - ((int64_t) 1 << seed_bits);
        for (int64_t r = 0; r < nr; r++) {
            ggml_ext_fp16_t * dst = out + ggml_ext_anyprec_table_offset(n_rows, seed_bits, b) + (r0 + r) * K;
            for (int64_t c = 0; c < K; c++) {
                dst[c] = ggml_ext_fp32_to_fp16(tables[r * tl + off + c]);
            }
        }
    }
    return 0;
}

int ggml_ext_anyprec_dequantize(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                int64_t n_rows, int64_t n_per_row, int seed_bits, int parent_bits, int bits, float * y) {
    if (!apq_bits_ok(seed_bits, parent_bits) || bits < seed_bits || bits > parent_bits ||
        n_per_row % GGML_EXT_ANYPREC_QK || r0 < 0 || r0 + nr > n_rows) {
        return -1;
    }
    const int64_t row_bytes   = n_per_row / 8;
    const size_t  plane_bytes = (size_t) n_rows * (size_t) row_bytes;
    for (int64_t r = 0; r < nr; r++) {
        const ggml_ext_fp16_t * t = tables + ggml_ext_anyprec_table_offset(n_rows, seed_bits, bits) + (r0 + r) * (1 << bits);
        for (int64_t j = 0; j < n_per_row; j++) {
            int code = 0;
            for (int k = 0; k < bits; k++) {
                const uint8_t byte = planes[(size_t) k * plane_bytes + (size_t) (r0 + r) * (size_t) row_bytes + j / 8];
                code               = (code << 1) | ((byte >> (j % 8)) & 1);
            }
            y[r * n_per_row + j] = ggml_ext_fp16_to_fp32(t[code]);
        }
    }
    return 0;
}
