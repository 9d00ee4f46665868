// KVQuant decode attention on the CPU (ggml-ext-kvquant.h; docs/KVQUANT.md "The decode op"): attention read
// straight from a pre-RoPE key cache (the NUQ key types, patch 0322), instead of dequantizing the whole cache
// to F32, roping it, casting it to F16 and running flash attention over that (three passes over n_kv cells per
// layer and token).
//
// Three ggml custom nodes (GGML_OP_CUSTOM; their userdata the tag of their kind, backend/kvquant_attn_base.c: ggml-cuda runs
// them with its own kernels, cuda/kvquant_attn_cuda.cu, when the cache is in VRAM):
//   table    F32 [n_dims, n_cells]: cos / sin (pair-interleaved, like ggml's rope cache) of every cell's
//            position, computed as ggml's CPU rope computes them (YaRN ramp, freq factors, attn_factor);
//            once per graph and RoPE: the layers share it.
//   partial  F32 [hd_v + 2, n_chunks, n_head, n_tokens]: for each query head and token, over one range of
//            `chunk` cells, the running max m, the sum l of exp(s - m) and acc = sum exp(s - m) v, where
//            s = scale * q . RoPE(k_cell) + mask. One work item = one cell range x one tile of tokens, all heads:
//            a cell's key row is decoded by one to_float call (the NUQ binding, outlier slots and float sink rows
//            exactly as the reference path reads them), each KV head normalised (a model's K norm) and roped once and scored against its GQA
//            group's query heads of the tile; its value row decoded once, accumulated for all of them.
//   combine  F32 [hd_v, n_head, n_tokens]: sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c.
// Plain C written so the compiler vectorizes it (8-lane partial sums, no intrinsics): one implementation on
// every target, its own scalar reference; tests/c/test_kvquant_attn.c checks it against ggml's rope and
// softmax over the dequantized cache.
#include "ggml-ext-kvquant.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"  // struct ggml_custom_op_params: our parameters follow it in op_params
#include "backend/kvquant_attn_params.h"
#include "vec.h"        // ggml-cpu's ggml_vec_soft_max_f32: exp(x - max) with its SIMD exp, and the sum

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVA_OFF GGML_EXT_KVQUANT_ATTN_OFF

// ---- the cos / sin table ----

static void rope_table_fn(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    struct ggml_ext_kvquant_rope r;
    memcpy(&r, (const char *) dst->op_params + KVA_OFF, sizeof(r));
    const int32_t * pos  = (const int32_t *) dst->src[0]->data;
    const float *   ff   = dst->src[1] ? (const float *) dst->src[1]->data : NULL;
    const int64_t   n    = dst->ne[1];
    const int       h2   = r.n_dims / 2;
    float           corr[2];
    ggml_rope_yarn_corr_dims(r.n_dims, r.n_ctx_orig, r.freq_base, r.beta_fast, r.beta_slow, corr);
    const float step   = powf(r.freq_base, -2.0f / (float) r.n_dims);
    const float mscale = r.ext_factor != 0.0f ? r.attn_factor * (1.0f + 0.1f * logf(1.0f / r.freq_scale)) : r.attn_factor;
    const int64_t per  = (n + nth - 1) / nth, c0 = per * ith, c1 = c0 + per < n ? c0 + per : n;
    for (int64_t c = c0; c < c1; c++) {
        float * row   = (float *) dst->data + c * r.n_dims;
        float   theta = (float) pos[c];  // the angle of pair j is pos * step^j (per freq factor), stepped as ggml does
        for (int j = 0; j < h2; j++) {
            const float extrap = theta / (ff ? ff[j] : 1.0f);
            float       th     = r.freq_scale * extrap;
            if (r.ext_factor != 0.0f) {
                // YaRN: pairs below the corrected dims keep the extrapolated angle, a linear ramp between
                const float y   = ((float) j - corr[0]) / fmaxf(0.001f, corr[1] - corr[0]);
                const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * r.ext_factor;
                th              = th * (1.0f - mix) + extrap * mix;
            }
            row[2 * j]     = cosf(th) * mscale;
            row[2 * j + 1] = sinf(th) * mscale;
            theta *= step;
        }
    }
}

// ---- the partial sums ----

static inline float dot(const float * a, const float * b, int64_t n) {
    float   s[8] = { 0 };
    int64_t i    = 0;
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; l++) {
            s[l] += a[i + l] * b[i + l];
        }
    }
    float t = 0.0f;
    for (; i < n; i++) {
        t += a[i] * b[i];
    }
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + t;
}

// one row of hd values of type `type` at p into y (F32)
static inline void row_to_f32(enum ggml_type type, ggml_to_float_t to_float, const void * p, float * y, int64_t n) {
    if (type == GGML_TYPE_F32) {
        memcpy(y, p, sizeof(float) * n);
    } else if (type == GGML_TYPE_F16) {
        ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) p, y, n);
    } else {
        to_float(p, y, n);
    }
}

static void attn_partial_fn(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * q = dst->src[0], * k = dst->src[1], * v = dst->src[2], * mask = dst->src[3];
    const struct ggml_tensor * tab = dst->src[4];
    struct ggml_ext_kvquant_attn_params p;
    memcpy(&p, (const char *) dst->op_params + KVA_OFF, sizeof(p));
    const int64_t hd = k->ne[0], n_hkv = k->ne[1], n_kv = k->ne[2], n_stream = k->ne[3], hdv = v->ne[0];
    const int64_t n_head = q->ne[1], n_tok = q->ne[2], n_ts = n_tok / n_stream, n_q = n_head / n_hkv;
    const int64_t n_chunks = dst->ne[1], n_tiles = (n_ts + p.tile - 1) / p.tile;
    const int64_t n_items  = n_stream * n_chunks * n_tiles;
    const int64_t nq_max   = n_head * p.tile, h2 = p.n_dims / 2, ew = hdv + 2;
    if (ith >= n_items) {
        return;
    }
    const ggml_to_float_t k_to_float = ggml_get_type_traits(k->type)->to_float;
    const ggml_to_float_t v_to_float = ggml_get_type_traits(v->type)->to_float;
    const float *         norm_w     = dst->src[5] ? (const float *) dst->src[5]->data : NULL;
    // a cell's heads side by side in the cache row: one to_float call for all of them
    const bool k_whole = (size_t) k->nb[1] == ggml_row_size(k->type, hd);
    const bool v_whole = (size_t) v->nb[1] == ggml_row_size(v->type, hdv);

    float * buf = malloc(sizeof(float) * (size_t) (nq_max * hd + n_hkv * hd + hd + n_hkv * hdv + p.chunk * nq_max +
                                                   nq_max * hdv + 2 * nq_max + p.tile * p.chunk));
    GGML_ASSERT(buf && "ggml-ext kvq attention: out of memory");
    float * qb = buf, * kf = qb + nq_max * hd, * kr = kf + n_hkv * hd, * vf = kr + hd, * sc = vf + n_hkv * hdv;
    float * acc = sc + p.chunk * nq_max, * mx = acc + nq_max * hdv, * sum = mx + nq_max, * mk = sum + nq_max;

    for (int64_t it = ith; it < n_items; it += nth) {
        int64_t       r    = it;
        const int64_t tile = r % n_tiles;
        r /= n_tiles;
        const int64_t c = r % n_chunks, s = r / n_chunks;
        const int64_t ts0 = tile * p.tile, nt = n_ts - ts0 < p.tile ? n_ts - ts0 : p.tile, nq = n_head * nt;
        const int64_t c0 = c * p.chunk, c1 = c0 + p.chunk < n_kv ? c0 + p.chunk : n_kv;

        // query i = head * nt + ti (head = kv head * n_q + g): token s * n_ts + ts0 + ti; a KV head's queries
        // are the n_q * nt from kv head * n_q * nt
        for (int64_t hq = 0; hq < n_head; hq++) {
            for (int64_t ti = 0; ti < nt; ti++) {
                const char * src = (const char *) q->data + hq * q->nb[1] + (s * n_ts + ts0 + ti) * q->nb[2];
                float *      dq  = qb + (hq * nt + ti) * hd;
                for (int64_t d = 0; d < hd; d++) {
                    dq[d] = *(const float *) (src + d * q->nb[0]);
                }
            }
        }
        for (int64_t i = 0; i < nq; i++) {
            mx[i]  = -INFINITY;
            sum[i] = 0.0f;
        }
        memset(acc, 0, sizeof(float) * (size_t) (nq * hdv));

        // the tile's mask rows over the range, as F32: mk[ti * chunk + cell - c0]
        const int64_t nc = c1 - c0;
        for (int64_t ti = 0; ti < nt; ti++) {
            const char * mrow = (const char *) mask->data + c0 * mask->nb[0] + (ts0 + ti) * mask->nb[1] +
                                (mask->ne[3] > 1 ? s * mask->nb[3] : 0);
            if (mask->type == GGML_TYPE_F16) {
                ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) mrow, mk + ti * p.chunk, nc);
            } else {
                memcpy(mk + ti * p.chunk, mrow, sizeof(float) * (size_t) nc);
            }
        }

        // scores sc[i * chunk + cell - c0]: each key decoded and roped once per cell, against every query of its
        // group in the tile
        for (int64_t cell = c0; cell < c1; cell++) {
            const int64_t cc  = cell - c0;
            bool          any = false;
            for (int64_t ti = 0; ti < nt; ti++) {
                any = any || mk[ti * p.chunk + cc] != -INFINITY;
            }
            if (!any) {
                for (int64_t i = 0; i < nq; i++) {
                    sc[i * p.chunk + cc] = -INFINITY;
                }
                continue;
            }
            const char * krow = (const char *) k->data + cell * k->nb[2] + s * k->nb[3];
            if (k_whole) {
                row_to_f32(k->type, k_to_float, krow, kf, n_hkv * hd);
            } else {
                for (int64_t h = 0; h < n_hkv; h++) {
                    row_to_f32(k->type, k_to_float, krow + h * k->nb[1], kf + h * hd, hd);
                }
            }
            const float * cs = (const float *) tab->data + (s * n_kv + cell) * p.n_dims;
            for (int64_t h = 0; h < n_hkv; h++) {
                float * kh = kf + h * hd;
                if (norm_w) {  // the model's K norm, as ggml's rms_norm and mul compute it
                    double ss = 0.0;
                    for (int64_t d = 0; d < hd; d++) {
                        ss += (double) (kh[d] * kh[d]);
                    }
                    const float mean = (float) (ss / (double) hd), sc1 = 1.0f / sqrtf(mean + p.norm_eps);
                    for (int64_t d = 0; d < hd; d++) {
                        kh[d] = (kh[d] * sc1) * norm_w[d];
                    }
                }
                if (p.mode == GGML_ROPE_TYPE_NEOX) {
                    for (int64_t j = 0; j < h2; j++) {
                        const float a = kh[j], b = kh[j + h2];
                        kr[j]      = a * cs[2 * j] - b * cs[2 * j + 1];
                        kr[j + h2] = a * cs[2 * j + 1] + b * cs[2 * j];
                    }
                } else {
                    for (int64_t j = 0; j < h2; j++) {
                        const float a = kh[2 * j], b = kh[2 * j + 1];
                        kr[2 * j]     = a * cs[2 * j] - b * cs[2 * j + 1];
                        kr[2 * j + 1] = a * cs[2 * j + 1] + b * cs[2 * j];
                    }
                }
                for (int64_t d = p.n_dims; d < hd; d++) {
                    kr[d] = kh[d];
                }
                for (int64_t g = 0; g < n_q; g++) {
                    for (int64_t ti = 0; ti < nt; ti++) {
                        const int64_t i  = (h * n_q + g) * nt + ti;
                        const float   mv = mk[ti * p.chunk + cc];
                        float         sv = -INFINITY;
                        if (mv != -INFINITY) {
                            sv    = p.scale * dot(qb + i * hd, kr, hd) + mv;
                            mx[i] = sv > mx[i] ? sv : mx[i];
                        }
                        sc[i * p.chunk + cc] = sv;
                    }
                }
            }
        }

        // weights exp(s - max) per query over the range (ggml's SIMD exp; masked cells give 0), then the values:
        // a cell's value row decoded once, accumulated for every query that sees it
        for (int64_t i = 0; i < nq; i++) {
            float * w = sc + i * p.chunk;
            if (mx[i] == -INFINITY) {
                memset(w, 0, sizeof(float) * (size_t) nc);
            } else {
                sum[i] = (float) ggml_vec_soft_max_f32((int) nc, w, w, mx[i]);
            }
        }
        const int64_t ng = n_q * nt;  // queries per KV head
        for (int64_t cell = c0; cell < c1; cell++) {
            const int64_t cc  = cell - c0;
            bool          any = false;
            for (int64_t i = 0; i < nq; i++) {
                any = any || sc[i * p.chunk + cc] != 0.0f;
            }
            if (!any) {
                continue;
            }
            const char * vrow = (const char *) v->data + cell * v->nb[2] + s * v->nb[3];
            if (v_whole) {
                row_to_f32(v->type, v_to_float, vrow, vf, n_hkv * hdv);
            } else {
                for (int64_t h = 0; h < n_hkv; h++) {
                    row_to_f32(v->type, v_to_float, vrow + h * v->nb[1], vf + h * hdv, hdv);
                }
            }
            for (int64_t i = 0; i < nq; i++) {
                const float w = sc[i * p.chunk + cc];
                if (w != 0.0f) {
                    const float * vh = vf + (i / ng) * hdv;
                    float *       a  = acc + i * hdv;
                    for (int64_t d = 0; d < hdv; d++) {
                        a[d] += w * vh[d];
                    }
                }
            }
        }

        for (int64_t hq = 0; hq < n_head; hq++) {
            for (int64_t ti = 0; ti < nt; ti++) {
                const int64_t i = hq * nt + ti, tok = s * n_ts + ts0 + ti;
                float *       out = (float *) dst->data + ((tok * n_head + hq) * n_chunks + c) * ew;
                memcpy(out, acc + i * hdv, sizeof(float) * (size_t) hdv);
                out[hdv]     = mx[i];
                out[hdv + 1] = sum[i];
            }
        }
    }
    free(buf);
}

// ---- the combine ----

static void attn_combine_fn(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    const struct ggml_tensor * part = dst->src[0];
    const int64_t              hdv = dst->ne[0], n_chunks = part->ne[1], ew = hdv + 2;
    const int64_t              n_rows = dst->ne[1] * dst->ne[2];
    for (int64_t r = ith; r < n_rows; r += nth) {
        const float * P   = (const float *) part->data + r * n_chunks * ew;
        float *       out = (float *) dst->data + r * hdv;
        float         M   = -INFINITY;
        for (int64_t c = 0; c < n_chunks; c++) {
            M = P[c * ew + hdv] > M ? P[c * ew + hdv] : M;
        }
        memset(out, 0, sizeof(float) * (size_t) hdv);
        if (M == -INFINITY) {
            continue;  // no cell visible to this query: zeros
        }
        float L = 0.0f;
        for (int64_t c = 0; c < n_chunks; c++) {
            const float * pc = P + c * ew;
            if (pc[hdv] == -INFINITY) {
                continue;
            }
            const float f = expf(pc[hdv] - M);
            L += f * pc[hdv + 1];
            for (int64_t d = 0; d < hdv; d++) {
                out[d] += f * pc[d];
            }
        }
        const float inv = 1.0f / L;
        for (int64_t d = 0; d < hdv; d++) {
            out[d] *= inv;
        }
    }
}

bool ggml_ext_kvquant_attn_is_node(const struct ggml_tensor * node) {
    struct ggml_custom_op_params cp;
    if (node->op != GGML_OP_CUSTOM) {
        return false;
    }
    memcpy(&cp, node->op_params, sizeof(cp));
    return cp.fun == attn_partial_fn && ggml_ext_kvquant_attn_node_kind(node) == GGML_EXT_KVQUANT_ATTN_PARTIAL;
}

// ---- the graph ----

static bool rows_readable(const struct ggml_tensor * t, int64_t n) {
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && !ggml_get_type_traits(t->type)->to_float) {
        return false;
    }
    return n % ggml_blck_size(t->type) == 0 && t->nb[0] == ggml_type_size(t->type) &&
           (size_t) t->nb[1] >= ggml_row_size(t->type, n);
}

#define WHY(...) (snprintf(why, why_size, __VA_ARGS__), (struct ggml_tensor *) NULL)

struct ggml_tensor * ggml_ext_kvquant_attn(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                           struct ggml_tensor * v, struct ggml_tensor * mask, struct ggml_tensor * k_pos,
                                           struct ggml_tensor * freq_factors, const struct ggml_ext_kvquant_rope * rope,
                                           struct ggml_tensor * k_norm_w, float k_norm_eps, float scale, int chunk,
                                           char * why, size_t why_size) {
    const int64_t hd = k->ne[0], n_hkv = k->ne[1], n_kv = k->ne[2], n_stream = k->ne[3], hdv = v->ne[0];
    if (q->type != GGML_TYPE_F32 || q->ne[0] != hd || q->ne[3] != 1) {
        return WHY("q is not F32 [%lld, n_head, n_tokens]", (long long) hd);
    }
    const int64_t n_head = q->ne[1], n_tok = q->ne[2];
    if (n_hkv < 1 || n_head % n_hkv || n_stream < 1 || n_tok % n_stream) {
        return WHY("heads %lld / KV heads %lld, tokens %lld / streams %lld", (long long) n_head, (long long) n_hkv,
                   (long long) n_tok, (long long) n_stream);
    }
    if (!rows_readable(k, hd) || !rows_readable(v, hdv)) {
        return WHY("K or V rows not readable (type, contiguity)");
    }
    if (v->ne[1] != n_hkv || v->ne[2] != n_kv || v->ne[3] != n_stream || v->nb[1] > v->nb[2]) {
        return WHY("V is not [hd_v, n_head_kv, n_kv, n_stream] untransposed");
    }
    if (!mask || (mask->type != GGML_TYPE_F16 && mask->type != GGML_TYPE_F32) || mask->ne[0] < n_kv ||
        mask->ne[1] < n_tok / n_stream || mask->ne[2] != 1 || (mask->ne[3] != 1 && mask->ne[3] != n_stream)) {
        return WHY("mask is not F16/F32 [n_kv, tokens, 1, streams]");
    }
    if (!k_pos || k_pos->type != GGML_TYPE_I32 || ggml_nelements(k_pos) != n_kv * n_stream) {
        return WHY("k_pos is not I32 [n_kv * n_stream]");
    }
    if ((rope->mode != GGML_ROPE_TYPE_NORMAL && rope->mode != GGML_ROPE_TYPE_NEOX) || rope->n_dims <= 0 ||
        rope->n_dims % 2 || rope->n_dims > hd) {
        return WHY("RoPE mode %d, n_dims %d", rope->mode, rope->n_dims);
    }
    if (freq_factors && (freq_factors->type != GGML_TYPE_F32 || freq_factors->ne[0] < rope->n_dims / 2)) {
        return WHY("freq factors not F32 [n_dims / 2]");
    }
    if (k_norm_w && (k_norm_w->type != GGML_TYPE_F32 || ggml_nelements(k_norm_w) != hd || !ggml_is_contiguous(k_norm_w))) {
        return WHY("K norm weight not F32 [%lld]", (long long) hd);
    }
    if (chunk <= 0) {
        // ~32 ranges: work for 16+ threads at long context, ranges of 64 cells at least
        chunk = (int) ((n_kv / 32 + 63) / 64 * 64);
        chunk = chunk < 64 ? 64 : chunk > 1024 ? 1024 : chunk;
    }

    // the cos / sin table: one per graph, k_pos and RoPE (found by name among the context's tensors)
    static const char tab_name[] = "ggml_ext_kvquant_rope_tab";
    struct ggml_tensor * tab     = NULL;
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op == GGML_OP_CUSTOM && !strcmp(t->name, tab_name) && t->src[0] == k_pos && t->src[1] == freq_factors &&
            !memcmp((const char *) t->op_params + KVA_OFF, rope, sizeof(*rope))) {
            struct ggml_custom_op_params cp;
            memcpy(&cp, t->op_params, sizeof(cp));
            if (cp.fun == rope_table_fn) {
                tab = t;
                break;
            }
        }
    }
    if (!tab) {
        struct ggml_tensor * args[2] = { k_pos, freq_factors };
        tab = ggml_custom_4d(ctx, GGML_TYPE_F32, rope->n_dims, n_kv * n_stream, 1, 1, args, 2, rope_table_fn,
                             GGML_N_TASKS_MAX, ggml_ext_kvquant_attn_tag(GGML_EXT_KVQUANT_ATTN_TABLE));
        memcpy((char *) tab->op_params + KVA_OFF, rope, sizeof(*rope));
        ggml_set_name(tab, tab_name);
    }

    const int64_t      n_ts = n_tok / n_stream;
    struct ggml_ext_kvquant_attn_params p    = { scale, chunk, rope->mode, rope->n_dims, (int) (n_head >= 64 ? 1 : 64 / n_head),
                                k_norm_eps };
    p.tile                  = p.tile > n_ts ? (int) n_ts : p.tile;
    const int64_t      n_ch = (n_kv + chunk - 1) / chunk;
    struct ggml_tensor * args[6] = { q, k, v, mask, tab, k_norm_w };
    struct ggml_tensor * part    = ggml_custom_4d(ctx, GGML_TYPE_F32, hdv + 2, n_ch, n_head, n_tok, args, 6,
                                                  attn_partial_fn, GGML_N_TASKS_MAX,
                                                  ggml_ext_kvquant_attn_tag(GGML_EXT_KVQUANT_ATTN_PARTIAL));
    memcpy((char *) part->op_params + KVA_OFF, &p, sizeof(p));
    ggml_set_name(part, "ggml_ext_kvquant_attn_part");
    struct ggml_tensor * out = ggml_custom_4d(ctx, GGML_TYPE_F32, hdv, n_head, n_tok, 1, &part, 1, attn_combine_fn,
                                              GGML_N_TASKS_MAX, ggml_ext_kvquant_attn_tag(GGML_EXT_KVQUANT_ATTN_COMBINE));
    ggml_set_name(out, "ggml_ext_kvquant_attn");
    return out;
}
