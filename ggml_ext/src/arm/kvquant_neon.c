// KVQuant kernels, NEON (scalar twin: ../generic/kvquant.c): the AVX2 kernels' method
// (x86/kvquant_avx2.c explains it) four lanes at a time: 4-bit layers, head_dim a multiple of 16. The 16-entry value table is one 64-byte vqtbl4q lookup (byte indices 4 i + 0..3).
#include "formats/kvquant/kvquant.h"

#if defined(GGML_EXT_HAVE_NEON)
#    include <arm_neon.h>
#    include <math.h>
#    include <stdlib.h>

#    define INLINE GGML_EXT_INLINE
#    define MAXG   4

INLINE float32x4_t lut16(uint8x16x4_t tab, uint32x4_t idx) {
    const uint32x4_t b = vaddq_u32(vmulq_n_u32(idx, 0x04040404u), vdupq_n_u32(0x03020100u));
    return vreinterpretq_f32_u8(vqtbl4q_u8(tab, vreinterpretq_u8_u32(b)));
}

INLINE void sincos4(float32x4_t x, float32x4_t * s, float32x4_t * c) {
    const float32x4_t j  = vrndnq_f32(vmulq_n_f32(x, 0.636619772367581343f));
    float32x4_t       r  = vfmsq_f32(x, j, vdupq_n_f32(1.5703125f));
    r                    = vfmsq_f32(r, j, vdupq_n_f32(4.837512969970703125e-4f));
    r                    = vfmsq_f32(r, j, vdupq_n_f32(7.54978995489188216e-8f));
    const float32x4_t r2 = vmulq_f32(r, r);
    float32x4_t       sp = vfmaq_f32(vdupq_n_f32(-1.0f / 5040), r2, vdupq_n_f32(1.0f / 362880));
    sp                   = vfmaq_f32(vdupq_n_f32(1.0f / 120), r2, sp);
    sp                   = vfmaq_f32(vdupq_n_f32(-1.0f / 6), r2, sp);
    sp                   = vfmaq_f32(r, vmulq_f32(r2, r), sp);
    float32x4_t cp       = vfmaq_f32(vdupq_n_f32(1.0f / 40320), r2, vdupq_n_f32(-1.0f / 3628800));
    cp                   = vfmaq_f32(vdupq_n_f32(-1.0f / 720), r2, cp);
    cp                   = vfmaq_f32(vdupq_n_f32(1.0f / 24), r2, cp);
    cp                   = vfmaq_f32(vdupq_n_f32(-0.5f), r2, cp);
    cp                   = vfmaq_f32(vdupq_n_f32(1.0f), r2, cp);
    const uint32x4_t q    = vreinterpretq_u32_s32(vcvtq_s32_f32(j));
    const uint32x4_t odd  = vtstq_u32(q, vdupq_n_u32(1));
    const float32x4_t s0  = vbslq_f32(odd, cp, sp);
    const float32x4_t c0  = vbslq_f32(odd, sp, cp);
    const uint32x4_t ssgn = vshlq_n_u32(vandq_u32(q, vdupq_n_u32(2)), 30);
    const uint32x4_t csgn = vshlq_n_u32(vandq_u32(vaddq_u32(q, vdupq_n_u32(1)), vdupq_n_u32(2)), 30);
    *s = vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(s0), ssgn));
    *c = vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(c0), csgn));
}

// eight bytes -> low nibbles (two vectors of four) and high nibbles
INLINE void nibbles8(const uint8_t * p, uint32x4_t lo[2], uint32x4_t hi[2]) {
    const uint16x8_t b  = vmovl_u8(vld1_u8(p));
    const uint16x8_t l  = vandq_u16(b, vdupq_n_u16(15));
    const uint16x8_t h  = vshrq_n_u16(b, 4);
    lo[0]               = vmovl_u16(vget_low_u16(l));
    lo[1]               = vmovl_u16(vget_high_u16(l));
    hi[0]               = vmovl_u16(vget_low_u16(h));
    hi[1]               = vmovl_u16(vget_high_u16(h));
}

INLINE uint8x16x4_t table(const float * v) {
    uint8x16x4_t t;
    t.val[0] = vreinterpretq_u8_f32(vld1q_f32(v));
    t.val[1] = vreinterpretq_u8_f32(vld1q_f32(v + 4));
    t.val[2] = vreinterpretq_u8_f32(vld1q_f32(v + 8));
    t.val[3] = vreinterpretq_u8_f32(vld1q_f32(v + 12));
    return t;
}

static int k_scores(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * q, int n_q, const void * k_rows,
                    size_t stride, const int32_t * pos, int n_tokens, float * scores) {
    const int hd = L->head_dim, h2 = hd / 2, nqh = nh * n_q;
    if (L->bits != 4 || hd % 16) {
        return 0;
    }
    float * co = malloc(sizeof(float) * 6 * h2 * (size_t) nqh);  // per query head: P Q R S U W of each pair
    if (!co) {
        return 0;
    }
    float        cs[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2], sn[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2];
    float        cd[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2], sd[GGML_EXT_KVQUANT_MAX_HEAD_DIM / 2];
    const uint8x16x4_t tab = table(L->k_values);
    ggml_ext_kvquant_k_coefficients(L, q, h0, nqh, n_q, co, cd, sd);
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t * row = (const uint8_t *) k_rows + (size_t) t * stride;
        // the (cos, sin) of every pair at this position: afresh every 16 tokens and after a jump, else one
        // step on from the previous token's; shared by every head
        if (t % 16 == 0 || pos[t] != pos[t - 1] + 1) {
            for (int j = 0; j < h2; j += 4) {
                float32x4_t c, s;
                sincos4(vmulq_n_f32(vld1q_f32(L->pair_theta + j), (float) pos[t]), &s, &c);
                vst1q_f32(cs + j, c);
                vst1q_f32(sn + j, s);
            }
        } else {
            for (int j = 0; j < h2; j += 4) {
                const float32x4_t c1 = vld1q_f32(cs + j), s1 = vld1q_f32(sn + j);
                const float32x4_t dc = vld1q_f32(cd + j), ds = vld1q_f32(sd + j);
                vst1q_f32(cs + j, vfmsq_f32(vmulq_f32(c1, dc), s1, ds));
                vst1q_f32(sn + j, vfmaq_f32(vmulq_f32(s1, dc), c1, ds));
            }
        }
        for (int h = 0; h < nh; h++) {
            const uint8_t * blk = row + (h0 + h) * L->head_bytes;
            for (int g0 = 0; g0 < n_q; g0 += MAXG) {
                const int ng = n_q - g0 < MAXG ? n_q - g0 : MAXG;
                const float * cg = co + (size_t) (h * n_q + g0) * 6 * h2;
                float32x4_t acc[MAXG];
                for (int g = 0; g < ng; g++) {
                    acc[g] = vdupq_n_f32(0.0f);
                }
                for (int j = 0; j < h2; j += 8) {
                    uint32x4_t ia[2], ib[2];
                    nibbles8(blk + j, ia, ib);
                    for (int k = 0; k < 2; k++) {
                        const int         jj = j + 4 * k;
                        const float32x4_t c = vld1q_f32(cs + jj), s = vld1q_f32(sn + jj);
                        const float32x4_t da = lut16(tab, ia[k]), db = lut16(tab, ib[k]);
                        for (int g = 0; g < ng; g++) {
                            const float *     p = cg + (size_t) g * 6 * h2 + jj;
                            const float32x4_t x = vfmaq_f32(vfmaq_f32(vld1q_f32(p + 4 * h2), vld1q_f32(p + h2), db), vld1q_f32(p), da);
                            const float32x4_t y = vfmaq_f32(vfmsq_f32(vld1q_f32(p + 5 * h2), vld1q_f32(p + 3 * h2), db),
                                                            vld1q_f32(p + 2 * h2), da);
                            acc[g] = vfmaq_f32(vfmaq_f32(acc[g], s, y), c, x);
                        }
                    }
                }
                for (int g = 0; g < ng; g++) {
                    scores[(size_t) (h * n_q + g0 + g) * n_tokens + t] = vaddvq_f32(acc[g]);
                }
            }
            ggml_ext_kvquant_k_row_sparse(L, h0 + h, row, cs, sn, q + (size_t) h * n_q * hd, n_q,
                                          scores + (size_t) h * n_q * n_tokens + t, (size_t) n_tokens);
        }
    }
    free(co);
    return 1;
}

static int v_accumulate(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * w, int n_q,
                        const void * v_rows, size_t stride, int n_tokens, float * out) {
    const int hd = L->head_dim, h2 = hd / 2, nqh = nh * n_q;
    if (L->bits != 4 || hd % 16) {
        return 0;
    }
    float * cst = calloc((size_t) nqh, sizeof(float));  // sum_t w_t mid_t per query head
    if (!cst) {
        return 0;
    }
    const uint8x16x4_t tab = table(L->v_values);
    for (int i = 0; i < nqh * hd; i++) {
        out[i] = 0.0f;
    }
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t * row = (const uint8_t *) v_rows + (size_t) t * stride;
        float           mid, half;
        ggml_ext_kvquant_v_scale(L, row, &mid, &half);
        for (int h = 0; h < nh; h++) {
            const uint8_t * blk = row + (h0 + h) * L->head_bytes;
            for (int g0 = 0; g0 < n_q; g0 += MAXG) {
                const int ng = n_q - g0 < MAXG ? n_q - g0 : MAXG;
                float     a[MAXG];
                for (int g = 0; g < ng; g++) {
                    const float wt = w[(size_t) (h * n_q + g0 + g) * n_tokens + t];
                    a[g]           = wt * half;
                    cst[h * n_q + g0 + g] += wt * mid;
                }
                float * og = out + (size_t) (h * n_q + g0) * hd;
                for (int j = 0; j < h2; j += 8) {
                    uint32x4_t il[2], ih[2];
                    nibbles8(blk + j, il, ih);
                    for (int k = 0; k < 2; k++) {
                        const float32x4_t dl = lut16(tab, il[k]), dh = lut16(tab, ih[k]);
                        for (int g = 0; g < ng; g++) {
                            float * o = og + (size_t) g * hd + j + 4 * k;
                            vst1q_f32(o, vfmaq_n_f32(vld1q_f32(o), dl, a[g]));
                            vst1q_f32(o + h2, vfmaq_n_f32(vld1q_f32(o + h2), dh, a[g]));
                        }
                    }
                }
            }
            ggml_ext_kvquant_v_row_sparse(L, h0 + h, row, mid, half, w + (size_t) h * n_q * n_tokens + t, n_q,
                                          (size_t) n_tokens, out + (size_t) h * n_q * hd);
        }
    }
    for (int i = 0; i < nqh; i++) {
        for (int c = 0; c < hd; c++) {
            out[(size_t) i * hd + c] += cst[i];
        }
    }
    free(cst);
    return 1;
}

const struct ggml_ext_kvquant_impl ggml_ext_kvquant_impl_neon = { "neon", k_scores, v_accumulate };

#endif  // GGML_EXT_HAVE_NEON
