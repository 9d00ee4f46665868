// The KVQuant decode attention (ggml-ext-kvquant.h, backend/kvquant_attn_cpu.c) against the reference path it replaces in
// llama.cpp (patch 0322): the pre-RoPE key cache dequantized by the type's to_float (ggml_cast to F32: the
// binding's per-channel scales, its outlier slots, its float sink rows), roped by ggml's own rope
// (ggml_rope_ext at the cells' positions), then softmax(scale * q . k + mask) . v computed here in double.
// Random caches of NUQ4 / NUQ3 keys bound with outliers and a 2-position sink (some cells at positions 0 / 1),
// V in F16 or NUQ4 (values, outliers), GQA (n_head / n_head_kv 1, 3, 4), head dims 64 and 128, normal and
// NEOX RoPE (n_dims < head_dim once, YaRN and freq factors once, a K norm once: rms_norm * w before RoPE), masks with -inf holes and a fully masked
// chunk, 1..5 tokens (one case of 2 streams), 1 and 3 threads, n_kv not a multiple of the chunk.
// Tolerance: 2e-4 of the largest |v| (float against double; the op keeps F32 throughout), which holds whatever
// the SIMD level. Prints "N passed, M failed"; exit status 1 on a failure.
// Built and run by tests/kernels/test_kvquant_attn.py against our installed libraries.
#include "ggml-cpu.h"
#include "ggml-ext-kvquant.h"
#include "ggml-ext.h"
#include "ggml.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float    uni(void) {  // [0, 1)
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float) (rng >> 40) * (1.0f / 16777216.0f);
}
static float gauss(void) {
    const float u = uni() + 1e-7f, v = uni();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

struct cfg {
    const char * name;
    int          k_bits, v_type;  // v_type: 0 = F16, 4 = NUQ4
    int          hd, n_hkv, n_q, n_kv, n_tok, n_stream, mode, n_dims, threads, yarn, ff, chunk, norm;
};

static void run(const struct cfg * c) {
    const int  hd = c->hd, n_hkv = c->n_hkv, n_head = n_hkv * c->n_q, n_kv = c->n_kv, ns = c->n_stream;
    const int  n_tok = c->n_tok * ns, D = n_hkv * hd, n_sink = 2;
    char       kname[8];
    snprintf(kname, sizeof(kname), "nuq%d", c->k_bits);
    const enum ggml_type kt = (enum ggml_type) ggml_ext_kv_cache_type_by_name(kname);
    const enum ggml_type vt = c->v_type ? (enum ggml_type) ggml_ext_kv_cache_type_by_name("nuq4") : GGML_TYPE_F16;

    struct ggml_init_params ip  = { 256 * 1024 * 1024, NULL, false };
    struct ggml_context *   ctx = ggml_init(ip);
    struct ggml_tensor *    K   = ggml_new_tensor_2d(ctx, kt, D, n_kv * ns);
    struct ggml_tensor *    V   = ggml_new_tensor_2d(ctx, vt, D, n_kv * ns);
    struct ggml_tensor *    q   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_head, n_tok);
    const int               n_tok_pad = (c->n_tok + 7) / 8 * 8;
    struct ggml_tensor *    mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, n_tok_pad, 1, ns);
    struct ggml_tensor *    kpos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_kv * ns);
    struct ggml_tensor *    ff   = c->ff ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c->n_dims / 2) : NULL;
    struct ggml_tensor *    nw   = c->norm ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, hd) : NULL;
    const float             eps  = 1e-6f;
    for (int i = 0; nw && i < hd; i++) {
        ((float *) nw->data)[i] = 0.5f + uni();
    }

    // the key table (ascending levels in [-1, 1]) and per-channel scales; values the same table
    float levels[16], mid[1024], half[1024];
    const int nl = 1 << c->k_bits;
    for (int i = 0; i < nl; i++) {
        levels[i] = -1.0f + 2.0f * ((float) i + 0.3f * (uni() - 0.5f)) / (float) (nl - 1);
    }
    levels[0] = -1.0f, levels[nl - 1] = 1.0f;
    float vlev[16];
    for (int i = 0; i < 16; i++) {
        vlev[i] = -1.0f + 2.0f * (float) i / 15.0f;
    }
    for (int i = 0; i < D; i++) {
        mid[i]  = 0.5f * gauss();
        half[i] = 0.5f + 2.0f * uni();
    }
    char err[256];
    if (ggml_ext_kvquant_bind_opts(K->data, ggml_nbytes(K), kt, D, levels, levels, mid, half, 1, n_sink, err, sizeof(err))) {
        printf("FAIL %s: bind K: %s\n", c->name, err);
        failed++;
        return;
    }
    if (c->v_type && ggml_ext_kvquant_bind_opts(V->data, ggml_nbytes(V), vt, D, vlev, vlev, NULL, NULL, 1, n_sink, err,
                                                sizeof(err))) {
        printf("FAIL %s: bind V: %s\n", c->name, err);
        failed++;
        return;
    }
    // positions: a shuffled 0..n_kv-1 per stream (the sink cells anywhere); the sink marks before the rows
    int32_t * pos = (int32_t *) kpos->data;
    for (int s = 0; s < ns; s++) {
        for (int i = 0; i < n_kv; i++) {
            pos[s * n_kv + i] = i;
        }
        for (int i = n_kv - 1; i > 0; i--) {
            const int j = (int) (uni() * (float) (i + 1)) % (i + 1), t = pos[s * n_kv + i];
            pos[s * n_kv + i] = pos[s * n_kv + j], pos[s * n_kv + j] = t;
        }
    }
    uint32_t * cells = malloc(sizeof(uint32_t) * n_kv * ns);
    for (int i = 0; i < n_kv * ns; i++) {
        cells[i] = (uint32_t) i;
    }
    ggml_ext_kvquant_rows_written(K->data, K->nb[1], cells, pos, (uint32_t) (n_kv * ns));
    if (c->v_type) {
        ggml_ext_kvquant_rows_written(V->data, V->nb[1], cells, pos, (uint32_t) (n_kv * ns));
    }
    free(cells);
    float * x = malloc(sizeof(float) * D);
    for (int r = 0; r < n_kv * ns; r++) {
        for (int i = 0; i < D; i++) {  // within the calibrated range, a few channels far beyond it (outliers)
            x[i] = mid[i] + half[i] * (uni() < 0.02f ? 4.0f * gauss() : 0.9f * (2.0f * uni() - 1.0f));
        }
        ggml_get_type_traits(kt)->from_float_ref(x, (char *) K->data + r * K->nb[1], D);
        for (int i = 0; i < D; i++) {
            x[i] = gauss() * (uni() < 0.02f ? 5.0f : 1.0f);
        }
        if (c->v_type) {
            ggml_get_type_traits(vt)->from_float_ref(x, (char *) V->data + r * V->nb[1], D);
        } else {
            ggml_fp32_to_fp16_row(x, (ggml_fp16_t *) ((char *) V->data + r * V->nb[1]), D);
        }
    }
    free(x);
    for (int i = 0; i < hd * n_head * n_tok; i++) {
        ((float *) q->data)[i] = gauss();
    }
    // mask: -inf holes (~20%), every cell of the first 64 hidden from token 0 (a fully masked chunk), small biases
    for (int s = 0; s < ns; s++) {
        for (int t = 0; t < n_tok_pad; t++) {
            for (int i = 0; i < n_kv; i++) {
                const float m = (uni() < 0.2f || (t == 0 && i < 64)) ? -INFINITY : 0.1f * (uni() - 0.5f);
                ((ggml_fp16_t *) mask->data)[(s * n_tok_pad + t) * n_kv + i] = ggml_fp32_to_fp16(m);
            }
        }
    }
    if (ff) {
        for (int i = 0; i < c->n_dims / 2; i++) {
            ((float *) ff->data)[i] = 1.0f + 3.0f * uni();
        }
    }

    struct ggml_ext_kvquant_rope rope = { c->mode, c->n_dims, 4096, 10000.0f, c->yarn ? 0.25f : 1.0f,
                                      c->yarn ? 1.0f : 0.0f, 1.0f, 32.0f, 1.0f };
    const float scale = 1.0f / sqrtf((float) hd);
    // the op, on views of the cache as llama.cpp's get_k / get_v make them
    struct ggml_tensor * kv = ggml_view_4d(ctx, K, hd, n_hkv, n_kv, ns, ggml_row_size(kt, hd), K->nb[1],
                                           K->nb[1] * n_kv, 0);
    struct ggml_tensor * vv = ggml_view_4d(ctx, V, hd, n_hkv, n_kv, ns, ggml_row_size(vt, hd), V->nb[1],
                                           V->nb[1] * n_kv, 0);
    char                 why[160] = "";
    struct ggml_tensor * out = ggml_ext_kvquant_attn(ctx, q, kv, vv, mask, kpos, ff, &rope, nw, eps, scale, c->chunk, why,
                                                     sizeof(why));
    if (!out) {
        printf("FAIL %s: op refused: %s\n", c->name, why);
        failed++;
        ggml_free(ctx);
        return;
    }
    // the reference path's keys: to_float (ggml_cast), then ggml's rope at the cells' positions
    struct ggml_tensor * kf = ggml_cast(ctx, kv, GGML_TYPE_F32);
    kf = ggml_reshape_3d(ctx, kf, hd, n_hkv, n_kv * ns);
    if (nw) {  // a model's K norm (qwen3) between the cache and RoPE, as ggml_ext_llama_k_rope applies it
        kf = ggml_mul(ctx, ggml_rms_norm(ctx, kf, eps), nw);
    }
    struct ggml_tensor * kr = ggml_rope_ext(ctx, kf, kpos, ff, c->n_dims, c->mode, rope.n_ctx_orig, rope.freq_base,
                                            rope.freq_scale, rope.ext_factor, rope.attn_factor, rope.beta_fast,
                                            rope.beta_slow);
    struct ggml_tensor * vf = ggml_cast(ctx, vv, GGML_TYPE_F32);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_build_forward_expand(gf, kr);
    ggml_build_forward_expand(gf, vf);
    if (ggml_graph_compute_with_ctx(ctx, gf, c->threads) != GGML_STATUS_SUCCESS) {
        printf("FAIL %s: compute\n", c->name);
        failed++;
        ggml_free(ctx);
        return;
    }

    const float * KR = (const float *) kr->data, * VF = (const float *) vf->data, * O = (const float *) out->data;
    double        vmax = 0.0, worst = 0.0;
    for (int i = 0; i < hd * n_hkv * n_kv * ns; i++) {
        vmax = fmax(vmax, fabs(VF[i]));
    }
    const int nts = c->n_tok;
    double *  w   = malloc(sizeof(double) * n_kv);
    for (int t = 0; t < n_tok; t++) {
        const int s = t / nts, ts = t % nts;
        for (int h = 0; h < n_head; h++) {
            const int     g  = h / c->n_q;
            const float * qv = (const float *) q->data + (t * n_head + h) * hd;
            double        M  = -INFINITY, L = 0.0;
            for (int i = 0; i < n_kv; i++) {
                const float m = ggml_fp16_to_fp32(((ggml_fp16_t *) mask->data)[(s * n_tok_pad + ts) * n_kv + i]);
                w[i]          = -INFINITY;
                if (m != -INFINITY) {
                    const float * kk = KR + ((s * n_kv + i) * n_hkv + g) * hd;
                    double        d  = 0.0;
                    for (int e = 0; e < hd; e++) {
                        d += (double) qv[e] * kk[e];
                    }
                    w[i] = scale * d + m;
                    M    = fmax(M, w[i]);
                }
            }
            for (int e = 0; e < hd; e++) {
                double a = 0.0;
                L        = 0.0;
                for (int i = 0; i < n_kv; i++) {
                    if (w[i] != -INFINITY) {
                        const double p = exp(w[i] - M);
                        L += p;
                        a += p * VF[((s * n_kv + i) * n_hkv + g) * hd + e];
                    }
                }
                const double want = L > 0.0 ? a / L : 0.0;
                worst             = fmax(worst, fabs(want - O[(t * n_head + h) * hd + e]));
            }
        }
    }
    free(w);
    const int ok = worst <= 2e-4 * vmax;
    if (ok) {
        passed++;
    } else {
        failed++;
    }
    printf("%s %s: max |op - reference| = %.3g (max |v| %.3g)\n", ok ? "ok  " : "FAIL", c->name, worst, vmax);
    ggml_ext_kvquant_unbind(K->data);
    if (c->v_type) {
        ggml_ext_kvquant_unbind(V->data);
    }
    ggml_free(ctx);
}

#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

// --bench N_KV THREADS KBITS VTYPE: one decoded token of SmolLM2-135M's attention shape (head dim 64, 3 KV heads,
// 9 query heads) over N_KV cells, the op against the reference path's graph (cast to F32, rope, cast to F16,
// flash attention), best of 20 runs each. Not a test: a timing aid.
static int bench(int n_kv, int threads, int k_bits, int v_nuq) {
    enum { LAYERS = 6 };  // layers share one cos / sin table per graph, as in llama.cpp
    const int hd = 64, n_hkv = 3, n_head = 9, D = n_hkv * hd;
    char      kname[8];
    snprintf(kname, sizeof(kname), "nuq%d", k_bits);
    const enum ggml_type kt = (enum ggml_type) ggml_ext_kv_cache_type_by_name(kname);
    const enum ggml_type vt = v_nuq ? (enum ggml_type) ggml_ext_kv_cache_type_by_name("nuq4") : GGML_TYPE_F16;
    struct ggml_init_params ip  = { (size_t) 64 * 1024 * 1024 + (size_t) LAYERS * n_kv * D * 16, NULL, false };
    struct ggml_context *   ctx = ggml_init(ip);
    struct ggml_tensor *    q    = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_head, 1);
    struct ggml_tensor *    mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, 1, 1, 1);
    struct ggml_tensor *    kpos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_kv);
    struct ggml_cgraph *    g[2] = { ggml_new_graph(ctx), ggml_new_graph(ctx) };
    float                   lv[16], mid[192], half[192], x[192];
    for (int i = 0; i < 16; i++) {
        lv[i] = -1.0f + 2.0f * (float) i / 15.0f;
    }
    for (int i = 0; i < D; i++) {
        mid[i] = 0.1f * gauss(), half[i] = 1.0f + uni();
    }
    for (int r = 0; r < n_kv; r++) {
        ((int32_t *) kpos->data)[r]     = r;
        ((ggml_fp16_t *) mask->data)[r] = ggml_fp32_to_fp16(0.0f);
    }
    for (int i = 0; i < hd * n_head; i++) {
        ((float *) q->data)[i] = gauss();
    }
    struct ggml_ext_kvquant_rope rope = { GGML_ROPE_TYPE_NORMAL, hd, 8192, 100000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f };
    for (int l = 0; l < LAYERS; l++) {
        struct ggml_tensor * K = ggml_new_tensor_2d(ctx, kt, D, n_kv), * V = ggml_new_tensor_2d(ctx, vt, D, n_kv);
        char                 err[256];
        if (ggml_ext_kvquant_bind_opts(K->data, ggml_nbytes(K), kt, D, lv, lv, mid, half, 1, 0, err, sizeof(err)) ||
            (v_nuq && ggml_ext_kvquant_bind_opts(V->data, ggml_nbytes(V), vt, D, lv, lv, NULL, NULL, 1, 0, err, sizeof(err)))) {
            printf("bind: %s\n", err);
            return 1;
        }
        for (int r = 0; r < n_kv; r++) {
            for (int i = 0; i < D; i++) {
                x[i] = mid[i] + half[i] * (2.0f * uni() - 1.0f);
            }
            ggml_get_type_traits(kt)->from_float_ref(x, (char *) K->data + r * K->nb[1], D);
            for (int i = 0; i < D; i++) {
                x[i] = 2.0f * uni() - 1.0f;
            }
            if (v_nuq) {
                ggml_get_type_traits(vt)->from_float_ref(x, (char *) V->data + r * V->nb[1], D);
            } else {
                ggml_fp32_to_fp16_row(x, (ggml_fp16_t *) ((char *) V->data + r * V->nb[1]), D);
            }
        }
        struct ggml_tensor * kv = ggml_view_4d(ctx, K, hd, n_hkv, n_kv, 1, ggml_row_size(kt, hd), K->nb[1], ggml_nbytes(K), 0);
        struct ggml_tensor * vv = ggml_view_4d(ctx, V, hd, n_hkv, n_kv, 1, ggml_row_size(vt, hd), V->nb[1], ggml_nbytes(V), 0);
        char                 why[160];
        ggml_build_forward_expand(g[0], ggml_ext_kvquant_attn(ctx, q, kv, vv, mask, kpos, NULL, &rope, NULL, 0.0f, 0.125f, 0,
                                                              why, sizeof(why)));
        struct ggml_tensor * kf = ggml_reshape_3d(ctx, ggml_cast(ctx, kv, GGML_TYPE_F32), hd, n_hkv, n_kv);
        struct ggml_tensor * kr = ggml_rope_ext(ctx, kf, kpos, NULL, hd, GGML_ROPE_TYPE_NORMAL, 8192, 100000.0f, 1.0f, 0.0f,
                                                1.0f, 32.0f, 1.0f);
        kr = ggml_cast(ctx, kr, GGML_TYPE_F16);
        ggml_build_forward_expand(g[1], ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3),
                                                            ggml_permute(ctx, kr, 0, 2, 1, 3),
                                                            ggml_permute(ctx, vv, 0, 2, 1, 3), mask, 0.125f, 0.0f, 0.0f));
    }
    double best[2] = { 1e9, 1e9 };
    for (int it = 0; it < 10; it++) {
        for (int j = 0; j < 2; j++) {
            const double t0 = now_s();
            ggml_graph_compute_with_ctx(ctx, g[j], threads);
            best[j] = fmin(best[j], now_s() - t0);
        }
    }
    printf("n_kv %d, %d threads, K %s, V %s, per layer: op %.3f ms, reference path %.3f ms (%.2fx)\n", n_kv, threads,
           kname, ggml_type_name(vt), 1e3 * best[0] / LAYERS, 1e3 * best[1] / LAYERS, best[1] / best[0]);
    ggml_free(ctx);
    return 0;
}

int main(int argc, char ** argv) {
    if (argc == 6 && !strcmp(argv[1], "--bench")) {
        return bench(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    }
    const struct cfg cases[] = {
        // name                         kb v   hd  hkv nq  n_kv tok ns mode                    dims th yarn ff chunk norm
        { "nuq4 K, f16 V, decode",       4, 0, 64, 3, 3, 700, 1, 1, GGML_ROPE_TYPE_NORMAL, 64, 3, 0, 0, 0, 0 },
        { "nuq4 K, nuq4 V, 5 tokens",    4, 4, 64, 2, 4, 333, 5, 1, GGML_ROPE_TYPE_NORMAL, 64, 1, 0, 0, 64, 0 },
        { "nuq3 K, neox, hd 128",        3, 0, 128, 2, 1, 300, 2, 1, GGML_ROPE_TYPE_NEOX, 128, 3, 0, 0, 0, 0 },
        { "nuq4 K, neox, n_dims < hd",   4, 4, 128, 1, 3, 200, 3, 1, GGML_ROPE_TYPE_NEOX, 64, 3, 0, 0, 64, 0 },
        { "nuq4 K, yarn + freq factors", 4, 0, 64, 2, 2, 257, 1, 1, GGML_ROPE_TYPE_NORMAL, 64, 3, 1, 1, 128, 0 },
        { "nuq4 K, f16 V, 50 tokens",    4, 0, 64, 3, 3, 256, 50, 1, GGML_ROPE_TYPE_NORMAL, 64, 2, 0, 0, 0, 0 },
        { "nuq4 K, K norm (qwen3), neox",  4, 4, 64, 2, 4, 300, 3, 1, GGML_ROPE_TYPE_NEOX, 64, 3, 0, 0, 0, 1 },
        { "nuq3 K, 2 streams",           3, 4, 64, 2, 3, 150, 2, 2, GGML_ROPE_TYPE_NORMAL, 64, 3, 0, 0, 64, 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        run(&cases[i]);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
