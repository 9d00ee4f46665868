// KVQuant kernels, scalar reference: the definition, computed plainly. For each token the head's key
// is dequantized (outliers from their fp16 slots), rotated by RoPE at the token's position exactly as
// llama.cpp's rope computes the angle (ggml_ext_kvquant_rope_angle, cosf / sinf), and dotted with each
// query head; values are dequantized and accumulated with the attention weights. The SIMD twins
// (x86/kvquant_avx2.c, arm/kvquant_neon.c) compute the same sums in another order, and are tested
// against these.
#include "formats/kvquant/kvquant.h"

#include <math.h>

static void dequant_head_k(const struct ggml_ext_kvquant_layer * L, const uint8_t * row, int head, float * ks) {
    const int hd = L->head_dim;
    for (int s = 0; s < hd; s++) {  // slot order
        const int c = head * hd + L->perm[s];
        ks[s]       = L->k_values[ggml_ext_kvquant_get(row + head * L->head_bytes, L->bits, hd, s)] * L->k_half[c] + L->k_mid[c];
    }
    const uint8_t * sparse = row + L->dense_bytes;
    for (int i = 0, n = ggml_ext_kvquant_n_kept(sparse); i < n; i++) {
        const ggml_ext_kvquant_slot sl = ggml_ext_kvquant_slot_at(sparse, i);
        if (sl.channel / hd == head) {
            ks[L->slot_of[sl.channel % hd]] = ggml_ext_fp16_to_fp32(sl.value);
        }
    }
}

static void k_scores_head(const struct ggml_ext_kvquant_layer * L, int head, const float * q, int n_q, const void * k_rows,
                          size_t stride, const int32_t * pos, int n_tokens, float * scores) {
    const int hd = L->head_dim, h2 = hd / 2;
    float     ks[GGML_EXT_KVQUANT_MAX_HEAD_DIM], kr[GGML_EXT_KVQUANT_MAX_HEAD_DIM];
    for (int t = 0; t < n_tokens; t++) {
        dequant_head_k(L, (const uint8_t *) k_rows + (size_t) t * stride, head, ks);
        for (int j = 0; j < h2; j++) {  // RoPE of pair j: (a, b) -> (a c - b s, a s + b c), channel order
            const float ang = ggml_ext_kvquant_rope_angle(L, j, pos[t]);
            const float cs = cosf(ang), sn = sinf(ang);
            const float a = ks[j], b = ks[j + h2];
            kr[L->perm[j]]      = a * cs - b * sn;
            kr[L->perm[j + h2]] = a * sn + b * cs;
        }
        for (int g = 0; g < n_q; g++) {
            double acc = 0;
            for (int c = 0; c < hd; c++) {
                acc += (double) q[g * hd + c] * (double) kr[c];
            }
            scores[(size_t) g * n_tokens + t] = (float) acc;
        }
    }
}

static int k_scores(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * q, int n_q, const void * k_rows,
                    size_t stride, const int32_t * pos, int n_tokens, float * scores) {
    for (int h = 0; h < nh; h++) {
        k_scores_head(L, h0 + h, q + (size_t) h * n_q * L->head_dim, n_q, k_rows, stride, pos, n_tokens,
                      scores + (size_t) h * n_q * n_tokens);
    }
    return 1;
}

static void v_accumulate_head(const struct ggml_ext_kvquant_layer * L, int head, const float * w, int n_q,
                              const void * v_rows, size_t stride, int n_tokens, float * out) {
    const int hd = L->head_dim;
    for (int i = 0; i < n_q * hd; i++) {
        out[i] = 0.0f;
    }
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t * row = (const uint8_t *) v_rows + (size_t) t * stride;
        float           mid, half, vs[GGML_EXT_KVQUANT_MAX_HEAD_DIM];
        ggml_ext_kvquant_v_scale(L, row, &mid, &half);
        for (int c = 0; c < hd; c++) {
            vs[c] = L->v_values[ggml_ext_kvquant_get(row + head * L->head_bytes, L->bits, hd, c)] * half + mid;
        }
        const uint8_t * sparse = ggml_ext_kvquant_v_sparse(L, row);
        for (int i = 0, n = ggml_ext_kvquant_n_kept(sparse); i < n; i++) {
            const ggml_ext_kvquant_slot sl = ggml_ext_kvquant_slot_at(sparse, i);
            if (sl.channel / hd == head) {
                vs[sl.channel % hd] = ggml_ext_fp16_to_fp32(sl.value);
            }
        }
        for (int g = 0; g < n_q; g++) {
            const float wt = w[(size_t) g * n_tokens + t];
            for (int c = 0; c < hd; c++) {
                out[g * hd + c] += wt * vs[c];
            }
        }
    }
}

static int v_accumulate(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * w, int n_q,
                        const void * v_rows, size_t stride, int n_tokens, float * out) {
    for (int h = 0; h < nh; h++) {
        v_accumulate_head(L, h0 + h, w + (size_t) h * n_q * n_tokens, n_q, v_rows, stride, n_tokens,
                          out + (size_t) h * n_q * L->head_dim);
    }
    return 1;
}

const struct ggml_ext_kvquant_impl ggml_ext_kvquant_impl_generic = { "generic", k_scores, v_accumulate };
