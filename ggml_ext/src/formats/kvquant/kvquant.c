// KVQuant KV cache: a layer's quantizer (the config checked and prepared), append-and-quantize of one
// key / value token, dequantization, and the outlier corrections every kernel implementation shares.
// Bytes: kvquant.h and docs/formats/kvquant.md. Rounding matches python/ggml_ext/kvquant/quant.py's
// fake_quant: x normalised by (x - mid) / half with mid = (hi + lo) / 2, half = max((hi - lo) / 2,
// 1e-8), rounded to the nearest level (a tie to the lower one, as torch.bucketize), outliers are
// x > hi or x < lo.
#include "formats/kvquant/kvquant.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void fail(char * err, size_t n, const char * fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
}

static int finite_all(const float * x, int n) {
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            return 0;
        }
    }
    return 1;
}

// levels ascending, finite; mids between them (the rounding decision points)
static int prep_table(const float * levels, const float * values, int n, float * lv, float * mids, float * vals) {
    if (!levels || !values || !finite_all(levels, n) || !finite_all(values, n)) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        lv[i]   = levels[i];
        vals[i] = values[i];
        if (i > 0 && !(levels[i] > levels[i - 1])) {
            return 0;
        }
    }
    for (int i = 0; i + 1 < n; i++) {
        mids[i] = (lv[i + 1] + lv[i]) / 2;
    }
    return 1;
}

struct ggml_ext_kvquant_layer * ggml_ext_kvquant_layer_new(const struct ggml_ext_kvquant_config * c, char * err, size_t en) {
    if (!c) {
        fail(err, en, "kvquant: no config");
        return NULL;
    }
    if (c->bits < 2 || c->bits > 4) {
        fail(err, en, "kvquant: bits must be 2, 3 or 4, not %d", c->bits);
        return NULL;
    }
    if (c->head_dim < 8 || c->head_dim % 8 || c->head_dim > GGML_EXT_KVQUANT_MAX_HEAD_DIM) {
        fail(err, en, "kvquant: head_dim %d is not a multiple of 8 in [8, %d]", c->head_dim, GGML_EXT_KVQUANT_MAX_HEAD_DIM);
        return NULL;
    }
    if (c->n_kv_heads < 1 || (int64_t) c->n_kv_heads * c->head_dim > 65535) {
        fail(err, en, "kvquant: n_kv_heads %d x head_dim %d channels (1 .. 65535)", c->n_kv_heads, c->head_dim);
        return NULL;
    }
    const int D = c->n_kv_heads * c->head_dim;
    if (c->v_outliers_per_side < 0 || c->v_outliers_per_side > GGML_EXT_KVQUANT_MAX_VK ||
        2 * c->v_outliers_per_side >= D) {
        fail(err, en, "kvquant: v_outliers_per_side %d (0 .. %d, fewer than half of %d channels)",
             c->v_outliers_per_side, GGML_EXT_KVQUANT_MAX_VK, D);
        return NULL;
    }
    if (c->k_slots < 0 || c->k_slots > D || c->v_slots < 2 * c->v_outliers_per_side || c->v_slots > D) {
        fail(err, en, "kvquant: k_slots %d must be in 0 .. %d and v_slots %d in %d .. %d", c->k_slots, D, c->v_slots,
             2 * c->v_outliers_per_side, D);
        return NULL;
    }
    if (c->rope_mode != GGML_EXT_KVQUANT_ROPE_NORM && c->rope_mode != GGML_EXT_KVQUANT_ROPE_NEOX) {
        fail(err, en, "kvquant: rope_mode %d (0: normal, 2: NEOX)", c->rope_mode);
        return NULL;
    }
    if (c->rope_n_dims < 0 || c->rope_n_dims > c->head_dim || c->rope_n_dims % 2 ||
        (c->head_dim - c->rope_n_dims) % 2) {
        fail(err, en, "kvquant: rope_n_dims %d (even, <= head_dim %d)", c->rope_n_dims, c->head_dim);
        return NULL;
    }
    if (!(c->rope_freq_base > 0) || !isfinite(c->rope_freq_base) || !(c->rope_freq_scale > 0) ||
        !isfinite(c->rope_freq_scale)) {
        fail(err, en, "kvquant: rope_freq_base %g / rope_freq_scale %g", (double) c->rope_freq_base,
             (double) c->rope_freq_scale);
        return NULL;
    }
    if (!c->k_lo || !c->k_hi || !finite_all(c->k_lo, D) || !finite_all(c->k_hi, D)) {
        fail(err, en, "kvquant: k_lo / k_hi missing or not finite");
        return NULL;
    }
    struct ggml_ext_kvquant_layer * L = calloc(1, sizeof(*L));
    float * buf                    = malloc(sizeof(float) * 4 * (size_t) D);
    if (!L || !buf) {
        free(L);
        free(buf);
        fail(err, en, "kvquant: out of memory");
        return NULL;
    }
    const int n = 1 << c->bits;
    if (!prep_table(c->k_levels, c->k_values, n, L->k_levels, L->k_mids, L->k_values) ||
        !prep_table(c->v_levels, c->v_values, n, L->v_levels, L->v_mids, L->v_values)) {
        free(L);
        free(buf);
        fail(err, en, "kvquant: the %d-entry k/v levels must be finite and ascending, values finite", n);
        return NULL;
    }
    L->bits       = c->bits;
    L->n_kv_heads = c->n_kv_heads;
    L->head_dim   = c->head_dim;
    L->n_channels = D;
    L->k_slots    = c->k_slots;
    L->v_slots    = c->v_slots;
    L->v_k        = c->v_outliers_per_side;
    L->rope_mode  = c->rope_mode;
    L->rope_n_dims     = c->rope_n_dims;
    L->rope_freq_base  = c->rope_freq_base;
    L->rope_freq_scale = c->rope_freq_scale;
    L->rope_theta_scale = c->rope_n_dims ? powf(c->rope_freq_base, -2.0f / c->rope_n_dims) : 1.0f;
    L->k_lo   = buf;
    L->k_hi   = buf + D;
    L->k_mid  = buf + 2 * D;
    L->k_half = buf + 3 * D;
    for (int i = 0; i < D; i++) {
        L->k_lo[i] = c->k_lo[i];
        L->k_hi[i] = c->k_hi[i];
        L->k_mid[i]  = (c->k_hi[i] + c->k_lo[i]) / 2;
        L->k_half[i] = fmaxf((c->k_hi[i] - c->k_lo[i]) / 2, 1e-8f);
    }
    const int hd = c->head_dim, nd = c->rope_n_dims, h2 = hd / 2;
    float     t  = 1.0f;
    for (int j = 0; j < h2; j++) {
        if (j < nd / 2) {
            const float ff = c->rope_freq_factors ? c->rope_freq_factors[j] : 1.0f;
            L->rope_freq_factors[j] = ff;
            L->pair_theta[j] = c->rope_freq_scale * (t / ff);
            t *= L->rope_theta_scale;
            L->perm[j]      = c->rope_mode == GGML_EXT_KVQUANT_ROPE_NEOX ? j : 2 * j;
            L->perm[j + h2] = c->rope_mode == GGML_EXT_KVQUANT_ROPE_NEOX ? j + nd / 2 : 2 * j + 1;
        } else {  // channels RoPE leaves alone, two by two
            L->rope_freq_factors[j] = 1.0f;
            L->pair_theta[j]        = 0.0f;
            L->perm[j]      = nd + 2 * (j - nd / 2);
            L->perm[j + h2] = nd + 2 * (j - nd / 2) + 1;
        }
    }
    for (int s = 0; s < hd; s++) {
        L->slot_of[L->perm[s]] = s;
    }
    L->head_bytes  = (size_t) hd * c->bits / 8;
    L->dense_bytes = L->head_bytes * c->n_kv_heads;
    L->k_row_size  = L->dense_bytes + 4 + 4 * (size_t) c->k_slots;
    L->v_row_size  = L->dense_bytes + 8 + 4 * (size_t) c->v_slots;
    return L;
}

void ggml_ext_kvquant_layer_free(struct ggml_ext_kvquant_layer * L) {
    if (L) {
        free(L->k_lo);
        free(L);
    }
}

size_t ggml_ext_kvquant_k_row_size(const struct ggml_ext_kvquant_layer * L) {
    return L->k_row_size;
}

size_t ggml_ext_kvquant_v_row_size(const struct ggml_ext_kvquant_layer * L) {
    return L->v_row_size;
}

// the nearest level of xn: how many of the n - 1 ascending decision points lie strictly below it (ties go
// down, as torch.bucketize; a NaN, refused before, would give 0), by binary search
static inline int nearest(const float * mids, int n, float xn) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int m = (lo + hi) / 2;
        if (mids[m] < xn) {
            lo = m + 1;
        } else {
            hi = m;
        }
    }
    return lo;
}

// one head block from its indices in slot order (the layout of kvquant.h), no divisions per element
static void pack_head(uint8_t * blk, int bits, int hd, const uint8_t * idx) {
    if (bits == 4) {
        for (int j = 0; j < hd / 2; j++) {
            blk[j] = (uint8_t) (idx[j] | idx[j + hd / 2] << 4);
        }
        return;
    }
    const int q = hd / 4;
    for (int j = 0; j < q; j++) {
        blk[j] = (uint8_t) ((idx[j] & 3) | (idx[j + q] & 3) << 2 | (idx[j + 2 * q] & 3) << 4 | (idx[j + 3 * q] & 3) << 6);
    }
    if (bits == 3) {
        const int e = hd / 8;
        for (int j = 0; j < e; j++) {
            uint8_t b = 0;
            for (int k = 0; k < 8; k++) {
                b |= (uint8_t) (((idx[j + k * e] >> 2) & 1) << k);
            }
            blk[q + j] = b;
        }
    }
}

static void put_slot(uint8_t * sparse, int i, int channel, float value) {
    ggml_ext_kvquant_slot sl = { (uint16_t) channel, ggml_ext_fp32_to_fp16(value) };
    memcpy(sparse + 4 + 4 * (size_t) i, &sl, 4);
}

static void put_counts(uint8_t * sparse, int kept, int dropped) {
    uint16_t h[2] = { (uint16_t) kept, (uint16_t) (dropped > 65535 ? 65535 : dropped) };
    memcpy(sparse, h, 4);
}

static int cmp_desc(const void * a, const void * b) {
    const float x = *(const float *) a, y = *(const float *) b;
    return (x < y) - (x > y);
}

int ggml_ext_kvquant_quantize_k(const struct ggml_ext_kvquant_layer * L, const float * k, void * vrow) {
    const int D = L->n_channels, hd = L->head_dim, n = 1 << L->bits;
    if (!finite_all(k, D)) {
        return -1;
    }
    uint8_t * row = vrow;
    memset(row, 0, L->k_row_size);
    // outlier candidates in channel order, with their excess beyond the threshold in units of the
    // channel's half range; when more than k_slots, the k_slots largest excesses are kept (ties: the
    // lower channels), the rest stay clamped in the dense part
    enum { STACK = 512 };
    int     cand_s[STACK];
    float   ex_s[STACK], sorted_s[STACK];
    int *   cand   = D <= STACK ? cand_s : malloc(sizeof(int) * D);
    float * ex     = D <= STACK ? ex_s : malloc(sizeof(float) * D);
    float * sorted = D <= STACK ? sorted_s : malloc(sizeof(float) * D);
    if (!cand || !ex || !sorted) {
        if (cand != cand_s) {
            free(cand);
            free(ex);
            free(sorted);
        }
        return -1;
    }
    int     n_cand = 0;
    uint8_t idx[GGML_EXT_KVQUANT_MAX_HEAD_DIM];
    for (int c = 0; c < D; c++) {
        const int   h = c / hd, s = L->slot_of[c - h * hd];
        const float x  = k[c];
        const float xn = (x - L->k_mid[c]) / L->k_half[c];
        idx[s]         = (uint8_t) nearest(L->k_mids, n, xn);
        if (c - h * hd == hd - 1) {
            pack_head(row + h * L->head_bytes, L->bits, hd, idx);
        }
        if (x > L->k_hi[c] || x < L->k_lo[c]) {
            ex[n_cand]     = (x > L->k_hi[c] ? x - L->k_hi[c] : L->k_lo[c] - x) / L->k_half[c];
            cand[n_cand++] = c;
        }
    }
    int   n_out = n_cand < L->k_slots ? n_cand : L->k_slots;
    float thr   = -1.0f;  // keep excesses above thr, and of those equal to it as many as fit
    int   n_eq  = n_out;
    if (n_cand > L->k_slots && L->k_slots > 0) {
        memcpy(sorted, ex, sizeof(float) * n_cand);
        qsort(sorted, n_cand, sizeof(float), cmp_desc);
        thr  = sorted[L->k_slots - 1];
        n_eq = 0;
        for (int i = 0; i < L->k_slots; i++) {
            n_eq += sorted[i] == thr;
        }
    }
    uint8_t * sparse = row + L->dense_bytes;
    for (int i = 0, m = 0; i < n_cand && m < n_out; i++) {
        if (ex[i] > thr || (ex[i] == thr && n_eq-- > 0)) {
            put_slot(sparse, m++, cand[i], k[cand[i]]);
        }
    }
    put_counts(sparse, n_out, n_cand - n_out);
    if (cand != cand_s) {
        free(cand);
        free(ex);
        free(sorted);
    }
    return n_cand - n_out;
}

// the (k+1)-th smallest of x (k < n), keeping a sorted list of the k+1 smallest seen
static float kth_smallest(const float * x, int n, int k, float sign) {
    float best[GGML_EXT_KVQUANT_MAX_VK + 1];
    int   m = 0;
    for (int i = 0; i < n; i++) {
        const float v = sign * x[i];
        if (m == k + 1 && !(v < best[k])) {
            continue;
        }
        int j = m < k + 1 ? m++ : k;
        while (j > 0 && best[j - 1] > v) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = v;
    }
    return sign * best[k];
}

int ggml_ext_kvquant_quantize_v(const struct ggml_ext_kvquant_layer * L, const float * v, void * vrow) {
    const int D = L->n_channels, hd = L->head_dim, n = 1 << L->bits;
    if (!finite_all(v, D)) {
        return -1;
    }
    uint8_t * row = vrow;
    memset(row, 0, L->v_row_size);
    // per-token thresholds: the (k+1)-th smallest and largest (min and max with k = 0)
    const float lo   = kth_smallest(v, D, L->v_k, 1.0f);
    const float hi   = kth_smallest(v, D, L->v_k, -1.0f);
    const float mid  = (hi + lo) / 2;
    const float half = fmaxf((hi - lo) / 2, 1e-8f);
    uint16_t    scale[2] = { ggml_ext_fp32_to_fp16(mid), ggml_ext_fp32_to_fp16(half) };
    memcpy(row + L->dense_bytes, scale, 4);
    uint8_t * sparse = row + L->dense_bytes + 4;
    int       n_out  = 0;
    uint8_t idx[GGML_EXT_KVQUANT_MAX_HEAD_DIM];
    for (int c = 0, i = 0, h = 0; c < D; c++) {
        const float x = v[c];
        idx[i++]      = (uint8_t) nearest(L->v_mids, n, (x - mid) / half);
        if (i == hd) {
            pack_head(row + (h++) * L->head_bytes, L->bits, hd, idx);
            i = 0;
        }
        if (L->v_k > 0 && (x > hi || x < lo)) {
            put_slot(sparse, n_out++, c, x);  // at most 2k: only the k beyond each threshold
        }
    }
    put_counts(sparse, n_out, 0);
    return 0;
}

void ggml_ext_kvquant_dequantize_k(const struct ggml_ext_kvquant_layer * L, const void * vrow, float * k) {
    const uint8_t * row = vrow;
    const int       hd  = L->head_dim;
    for (int c = 0; c < L->n_channels; c++) {
        const int q = ggml_ext_kvquant_get(row + (c / hd) * L->head_bytes, L->bits, hd, L->slot_of[c % hd]);
        k[c]        = L->k_values[q] * L->k_half[c] + L->k_mid[c];
    }
    const uint8_t * sparse = row + L->dense_bytes;
    for (int i = 0, n = ggml_ext_kvquant_n_kept(sparse); i < n; i++) {
        const ggml_ext_kvquant_slot sl = ggml_ext_kvquant_slot_at(sparse, i);
        k[sl.channel]              = ggml_ext_fp16_to_fp32(sl.value);
    }
}

void ggml_ext_kvquant_dequantize_v(const struct ggml_ext_kvquant_layer * L, const void * vrow, float * v) {
    const uint8_t * row = vrow;
    const int       hd  = L->head_dim;
    float           mid, half;
    ggml_ext_kvquant_v_scale(L, row, &mid, &half);
    for (int c = 0; c < L->n_channels; c++) {
        v[c] = L->v_values[ggml_ext_kvquant_get(row + (c / hd) * L->head_bytes, L->bits, hd, c % hd)] * half + mid;
    }
    const uint8_t * sparse = ggml_ext_kvquant_v_sparse(L, row);
    for (int i = 0, n = ggml_ext_kvquant_n_kept(sparse); i < n; i++) {
        const ggml_ext_kvquant_slot sl = ggml_ext_kvquant_slot_at(sparse, i);
        v[sl.channel]              = ggml_ext_fp16_to_fp32(sl.value);
    }
}

// llama.cpp's ggml_rope_cache_init with ext_factor 0 and mscale 1: theta = pos * theta_scale^j
// by repeated multiplication, divided by the frequency factor, times freq_scale.
float ggml_ext_kvquant_rope_angle(const struct ggml_ext_kvquant_layer * L, int j, int32_t pos) {
    if (j >= L->rope_n_dims / 2) {
        return 0.0f;
    }
    float theta = (float) pos;
    for (int i = 0; i < j; i++) {
        theta *= L->rope_theta_scale;
    }
    return L->rope_freq_scale * (theta / L->rope_freq_factors[j]);
}
