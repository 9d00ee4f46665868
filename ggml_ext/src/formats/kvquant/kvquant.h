// KVQuant KV cache (Hooper et al., 2024): the bytes of one token's key / value row and the internals
// the kernels share. The public API is in ggml-ext.h ("KVQuant KV cache"); the bytes are written down
// in docs/formats/kvquant.md.
//
// One layer, D = n_kv_heads * head_dim channels, B = 2, 3 or 4 bits. A token's row is
//   dense:  n_kv_heads head blocks of head_dim * B / 8 bytes (head h at h * head_dim * B / 8);
//   sparse: keys   u16 n_kept, u16 n_dropped, k_slots x {u16 channel, fp16 value}
//           values fp16 mid, fp16 half, u16 n_kept, u16 n_dropped, v_slots x {u16 channel, fp16 value}
// (little-endian, no padding; read with memcpy; slots in ascending channel order). A dense element is an index into the layer's 2^B
// dequantization values: key channel c = values[i] * half[c] + mid[c] (per-channel, calibrated
// offline, held by the layer, not the row), value = values[i] * half_t + mid_t (per token, in the row).
// An outlier slot holds the element's own value in fp16; its dense index is the clamped one.
//
// Inside a head block elements sit in *slot* order: slot s of bits B is at
//   B = 4: byte s % (hd/2), nibble s / (hd/2)
//   B = 2: byte s % (hd/4), bits 2 * (s / (hd/4))
//   B = 3: its low two bits as B = 2 (hd/4 bytes), bit 2 in the hd/8 bytes that follow at
//          byte s % (hd/8), bit s / (hd/8)
// Values: slot = channel within the head. Keys: slots are RoPE-pair ordered, so a kernel finds the
// two members of rotation pair j at slots j and j + hd/2 whatever the model's RoPE ordering
// (NEOX: pair (j, j + n_dims/2); normal: pair (2j, 2j + 1)); channels RoPE leaves alone (n_dims <
// head_dim) fill the pairs j >= n_dims/2 with angle 0.
#pragma once

#include "common/blocks.h"
#include "common/fp16.h"
#include "ggml-ext.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define GGML_EXT_KVQUANT_MAX_HEAD_DIM 512
#define GGML_EXT_KVQUANT_MAX_VK       64    // value outliers per side (k) at most

struct ggml_ext_kvquant_layer {
    int    bits, n_kv_heads, head_dim, n_channels;
    int    k_slots, v_slots, v_k;           // outlier slots per token; value outliers per side (0: min/max)
    int    rope_mode, rope_n_dims;
    float  rope_freq_base, rope_freq_scale, rope_theta_scale;
    float  rope_freq_factors[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2];  // 1 where the model has none
    size_t head_bytes, dense_bytes, k_row_size, v_row_size;
    float  k_levels[16], k_mids[15], k_values[16];
    float  v_levels[16], v_mids[15], v_values[16];
    int    perm[GGML_EXT_KVQUANT_MAX_HEAD_DIM];     // key slot -> channel within the head
    int    slot_of[GGML_EXT_KVQUANT_MAX_HEAD_DIM];  // channel within the head -> key slot
    float  pair_theta[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2];  // angle per position of pair j (0: not rotated)
    float * k_lo, * k_hi, * k_mid, * k_half;    // D each, channel order
};

typedef struct {
    uint16_t channel;
    uint16_t value;  // fp16
} ggml_ext_kvquant_slot;

// Index of slot s in a head block (bits B, head_dim hd).
static inline int ggml_ext_kvquant_get(const uint8_t * blk, int bits, int hd, int s) {
    if (bits == 4) {
        return (blk[s % (hd / 2)] >> (4 * (s / (hd / 2)))) & 15;
    }
    int q = (blk[s % (hd / 4)] >> (2 * (s / (hd / 4)))) & 3;
    if (bits == 3) {
        q |= ((blk[hd / 4 + s % (hd / 8)] >> (s / (hd / 8))) & 1) << 2;
    }
    return q;
}

static inline void ggml_ext_kvquant_set(uint8_t * blk, int bits, int hd, int s, int q) {
    if (bits == 4) {
        const int sh = 4 * (s / (hd / 2));
        uint8_t * p  = blk + s % (hd / 2);
        *p           = (uint8_t) ((*p & ~(15 << sh)) | (q << sh));
        return;
    }
    const int sh = 2 * (s / (hd / 4));
    uint8_t * p  = blk + s % (hd / 4);
    *p           = (uint8_t) ((*p & ~(3 << sh)) | ((q & 3) << sh));
    if (bits == 3) {
        const int hb = s / (hd / 8);
        uint8_t * h  = blk + hd / 4 + s % (hd / 8);
        *h           = (uint8_t) ((*h & ~(1 << hb)) | (((q >> 2) & 1) << hb));
    }
}

// The sparse part of a row: its header fields and slots.
static inline const uint8_t * ggml_ext_kvquant_k_sparse(const struct ggml_ext_kvquant_layer * L, const uint8_t * row) {
    return row + L->dense_bytes;
}
static inline const uint8_t * ggml_ext_kvquant_v_sparse(const struct ggml_ext_kvquant_layer * L, const uint8_t * row) {
    return row + L->dense_bytes + 4;
}
static inline int ggml_ext_kvquant_n_kept(const uint8_t * sparse) {
    uint16_t n;
    memcpy(&n, sparse, 2);
    return n;
}
static inline ggml_ext_kvquant_slot ggml_ext_kvquant_slot_at(const uint8_t * sparse, int i) {
    ggml_ext_kvquant_slot sl;
    memcpy(&sl, sparse + 4 + 4 * (size_t) i, 4);
    return sl;
}
static inline void ggml_ext_kvquant_v_scale(const struct ggml_ext_kvquant_layer * L, const uint8_t * row, float * mid,
                                            float * half) {
    uint16_t h[2];
    memcpy(h, row + L->dense_bytes, 4);
    *mid  = ggml_ext_fp16_to_fp32(h[0]);
    *half = ggml_ext_fp16_to_fp32(h[1]);
}

// The RoPE angle of key pair j (slot order) at position pos, as llama.cpp's rope computes it.
GGML_EXT_API float ggml_ext_kvquant_rope_angle(const struct ggml_ext_kvquant_layer * L, int j, int32_t pos);

// Slots are in ascending channel order: the first slot of head `head` (binary search), so a kernel
// visits only its head's outliers.
static inline int ggml_ext_kvquant_first_slot(const uint8_t * sparse, int n, int channel) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (ggml_ext_kvquant_slot_at(sparse, mid).channel < channel) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// The outlier corrections of one token for KV head `head`, which the SIMD kernels add inside their token
// loop: for each kept outlier, the difference between its fp16 value and the dense element under it.
// Keys: given the cosine and sine of every pair at the token's position (slot order); adds to
// scores[g * n_tokens] for the n_q query heads q. Values: adds w[g * n_tokens] * difference to out[g * hd + c].
static inline void ggml_ext_kvquant_k_row_sparse(const struct ggml_ext_kvquant_layer * L, int head, const uint8_t * row,
                                                 const float * cs, const float * sn, const float * q, int n_q,
                                                 float * scores, size_t n_tokens) {
    const int       hd = L->head_dim, h2 = hd / 2;
    const uint8_t * sparse = row + L->dense_bytes;
    const int       n      = ggml_ext_kvquant_n_kept(sparse);
    for (int i = n ? ggml_ext_kvquant_first_slot(sparse, n, head * hd) : 0; i < n; i++) {
        const ggml_ext_kvquant_slot sl = ggml_ext_kvquant_slot_at(sparse, i);
        if (sl.channel >= (head + 1) * hd) {
            break;
        }
        const int   s     = L->slot_of[sl.channel % hd], j = s % h2;
        const float dense = L->k_values[ggml_ext_kvquant_get(row + head * L->head_bytes, L->bits, hd, s)] *
                                L->k_half[sl.channel] + L->k_mid[sl.channel];
        const float delta = ggml_ext_fp16_to_fp32(sl.value) - dense;
        for (int g = 0; g < n_q; g++) {
            const float qa = q[g * hd + L->perm[j]], qb = q[g * hd + L->perm[j + h2]];
            // q . R(delta e_a) = delta (qa c + qb s);  q . R(delta e_b) = delta (qb c - qa s)
            scores[g * n_tokens] += s < h2 ? delta * (qa * cs[j] + qb * sn[j]) : delta * (qb * cs[j] - qa * sn[j]);
        }
    }
}

static inline void ggml_ext_kvquant_v_row_sparse(const struct ggml_ext_kvquant_layer * L, int head, const uint8_t * row,
                                                 float mid, float half, const float * w, int n_q, size_t n_tokens,
                                                 float * out) {
    const int       hd     = L->head_dim;
    const uint8_t * sparse = ggml_ext_kvquant_v_sparse(L, row);
    const int       n      = ggml_ext_kvquant_n_kept(sparse);
    if (!n) {
        return;
    }
    for (int i = ggml_ext_kvquant_first_slot(sparse, n, head * hd); i < n; i++) {
        const ggml_ext_kvquant_slot sl = ggml_ext_kvquant_slot_at(sparse, i);
        if (sl.channel >= (head + 1) * hd) {
            break;
        }
        const int   c     = sl.channel % hd;
        const float dense = L->v_values[ggml_ext_kvquant_get(row + head * L->head_bytes, L->bits, hd, c)] * half + mid;
        const float delta = ggml_ext_fp16_to_fp32(sl.value) - dense;
        for (int g = 0; g < n_q; g++) {
            out[g * hd + c] += w[g * n_tokens] * delta;
        }
    }
}

// One implementation of the kernels, outliers included, over KV heads h0 .. h0 + nh - 1 (q / scores / w /
// out hold nh * n_q query heads, head-major). k_scores / v_accumulate return 0 when they cannot take the
// layer (bits, head_dim): the dispatcher then runs the scalar reference.
struct ggml_ext_kvquant_impl {
    const char * name;
    int (*k_scores)(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * q, int n_q, const void * k_rows,
                    size_t row_stride, const int32_t * pos, int n_tokens, float * scores);
    int (*v_accumulate)(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * w, int n_q,
                        const void * v_rows, size_t row_stride, int n_tokens, float * out);
};

GGML_EXT_API extern const struct ggml_ext_kvquant_impl ggml_ext_kvquant_impl_generic;
#include "common/simd.h"
#ifdef GGML_EXT_HAVE_AVX2
extern const struct ggml_ext_kvquant_impl ggml_ext_kvquant_impl_avx2;
#endif
#ifdef GGML_EXT_HAVE_NEON
extern const struct ggml_ext_kvquant_impl ggml_ext_kvquant_impl_neon;
#endif

// What the SIMD q.K kernels compute once per call (x86/kvquant_avx2.c's header has the algebra): for the
// nqh query heads from KV head h0 (n_q query heads per KV head; q: nqh x head_dim), the six coefficient rows
// P Q R S U W of each rotation pair into co (6 * head_dim/2 floats per query head), and each pair's
// one-position step (cos, sin of its angle per position) into cd, sd (head_dim/2 each).
static inline void ggml_ext_kvquant_k_coefficients(const struct ggml_ext_kvquant_layer * L, const float * q, int h0, int nqh,
                                                   int n_q, float * co, float * cd, float * sd) {
    const int hd = L->head_dim, h2 = hd / 2;
    for (int j = 0; j < h2; j++) {
        cd[j] = cosf(L->pair_theta[j]);
        sd[j] = sinf(L->pair_theta[j]);
    }
    for (int i = 0; i < nqh; i++) {
        const int     h  = h0 + i / n_q;
        const float * qg = q + (size_t) i * hd, * kh = L->k_half + h * hd, * km = L->k_mid + h * hd;
        float *       c  = co + (size_t) i * 6 * h2;
        for (int j = 0; j < h2; j++) {
            const int   a = L->perm[j], b = L->perm[j + h2];
            const float qa = qg[a], qb = qg[b];
            c[j]          = qa * kh[a];
            c[h2 + j]     = qb * kh[b];
            c[2 * h2 + j] = qb * kh[a];
            c[3 * h2 + j] = qa * kh[b];
            c[4 * h2 + j] = qa * km[a] + qb * km[b];
            c[5 * h2 + j] = qb * km[a] - qa * km[b];
        }
    }
}
