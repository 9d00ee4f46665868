// The KVQuant decode op (ggml-ext-kvquant.h) on a GPU against the CPU (ggml_ext/src/cuda/kvquant_attn_cuda.cu against
// backend/kvquant_attn_cpu.c; docs/KVQUANT.md "The decode op", "The CUDA path"). Each backend gets the same caches in its
// own buffer, bound by address to the same tables (ggml_ext_kvquant_bind_opts, as the llama glue does): a pre-RoPE key
// cache (per-channel scales) of NUQ4 / NUQ3 / NUQ2 and a V cache of a NUQ type, F16 or F32, written by SET_ROWS on
// that backend (the sink rows' floats too), then ggml_ext_kvquant_attn over views of them, every node of the graph on
// that backend (the GPU must take all of them: table, partial, combine). Cases: several n_kv (not multiples of the
// cell range), GQA 1 / 4 / 20 (more queries per KV head than one CUDA block takes), 1-6 tokens, 2 streams once,
// normal and NEOX RoPE (n_dims < head_dim, YaRN with freq factors once), with and without a K norm, outlier slots
// and a float sink row, block-scaled keys once, F16 and F32 masks with -inf holes and a fully masked query; every
// case twice: the default (the lane kernel where it applies: NUQ K and V, hd == hd_v == n_dims) and GGML_EXT_KV_ATTN_SPLIT=0
// (the block kernel alone). The GPU's result: within NMSE
// 1e-6 of the CPU's (both F32 throughout; the order of the sums differs), a fully masked query zeros on both.
// --require-gpu: exit 77 (skip) when there is no GPU device. Built and run by scripts/test_cuda.sh (make test-cuda)
// and tests/cuda/test_kvattn_cuda.py.
#include "backend_test.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-ext-kvquant.h"
#include "ggml-ext.h"
#include "ggml.h"
#include "kvq_tables.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// GGML_EXT_KV_KBLOCK's switch (backend/kvquant_base.c; declared by its callers only, as the llama glue does)
extern "C" int ggml_ext_kvquant_key_blocks(const void * data, int on);

struct cfg {
    const char * k_name;
    const char * v_name;  // "nuq4" / "nuq3" / "nuq2" / "f16" / "f32"
    int          hd, n_hkv, n_q, n_kv, n_ts, n_stream, mode, n_dims, yarn, norm, outliers, n_sink, chunk, mask_f32;
    int          kblock;  // keys block-scaled (ggml_ext_kvquant_key_blocks)
};

template <typename T> static std::vector<uint8_t> as_bytes(const std::vector<T> & v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

static ggml_type type_by_name(const char * name) {
    if (!std::strcmp(name, "f16")) {
        return GGML_TYPE_F16;
    }
    if (!std::strcmp(name, "f32")) {
        return GGML_TYPE_F32;
    }
    return (ggml_type) ggml_ext_kv_cache_type_by_name(name);
}

// the op's output on backend `be` for case c (inputs the same on every backend)
static std::vector<float> run_case(ggml_backend_t be, const cfg & c, bool * ok) {
    *ok                = false;
    const int hd = c.hd, n_hkv = c.n_hkv, n_head = n_hkv * c.n_q, ns = c.n_stream, n_tok = c.n_ts * ns;
    const int D = hd * n_hkv, n_cells = c.n_kv * ns;
    const ggml_type kt = type_by_name(c.k_name), vt = type_by_name(c.v_name);
    const bool      v_nuq = vt != GGML_TYPE_F16 && vt != GGML_TYPE_F32;
    rng             r{ (uint64_t) (c.hd * 131 + c.n_kv * 7 + c.n_q + c.norm) };

    // the caches and the tables (the same on every backend)
    const int    bits = ggml_ext_type_info_by_id((int) kt)->layout;
    const tables tk = make_table(bits, 5 + bits), tv = make_table(v_nuq ? ggml_ext_type_info_by_id((int) vt)->layout : 2, 9);
    std::vector<float> k_mid(D), k_half(D);
    for (int i = 0; i < D; i++) {
        k_mid[i]  = 0.3f * r.next();
        k_half[i] = 0.6f + 0.4f * r.next();
    }
    ggml_init_params cip   = { 4 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *   cctx  = ggml_init(cip);
    ggml_tensor *    kc    = ggml_new_tensor_2d(cctx, kt, D, n_cells);
    ggml_tensor *    vc    = ggml_new_tensor_2d(cctx, vt, D, n_cells);
    ggml_backend_buffer_t cbuf = ggml_backend_alloc_ctx_tensors(cctx, be);
    CHECK(cbuf != nullptr, "%s: no cache buffer", ggml_backend_name(be));
    if (!cbuf) {
        ggml_free(cctx);
        return {};
    }
    ggml_backend_buffer_clear(cbuf, 0);
    char err[256] = "";
    int  rc = ggml_ext_kvquant_bind_opts(kc->data, ggml_nbytes(kc), (int) kt, D, tk.levels, tk.values, k_mid.data(),
                                         k_half.data(), c.outliers, c.n_sink, err, sizeof(err));
    if (v_nuq) {
        rc |= ggml_ext_kvquant_bind_opts(vc->data, ggml_nbytes(vc), (int) vt, D, tv.levels, tv.values, nullptr, nullptr,
                                         c.outliers, c.n_sink, err, sizeof(err));
    }
    if (c.kblock) {
        rc |= ggml_ext_kvquant_key_blocks(kc->data, 1);
    }
    CHECK(rc == 0, "bind on %s: %s", ggml_backend_name(be), err);

    // rows: keys mostly inside their channel's range, some far outside (outlier slots); values around 0.5
    std::vector<float> xk((size_t) D * n_cells), xv((size_t) D * n_cells);
    for (int i = 0; i < n_cells; i++) {
        for (int d = 0; d < D; d++) {
            const float u = r.next();
            xk[(size_t) i * D + d] = k_mid[d] + k_half[d] * (std::fabs(u) > 0.97f ? 3.0f * u : 0.9f * u);
            xv[(size_t) i * D + d] = 2.0f * r.next() + 0.5f;
        }
    }
    // the sink: cell 0 of each stream holds position 0 (its row kept in float)
    std::vector<uint32_t> wc(n_cells);
    std::vector<int32_t>  wpos(n_cells);
    std::vector<int64_t>  rows(n_cells);
    for (int i = 0; i < n_cells; i++) {
        wc[i] = (uint32_t) i, wpos[i] = i % c.n_kv, rows[i] = i;
    }
    ggml_ext_kvquant_rows_written(kc->data, kc->nb[1], wc.data(), wpos.data(), (uint32_t) n_cells);
    if (v_nuq) {
        ggml_ext_kvquant_rows_written(vc->data, vc->nb[1], wc.data(), wpos.data(), (uint32_t) n_cells);
    }

    // the inputs
    std::vector<float> q((size_t) hd * n_head * n_tok), ffv(c.n_dims / 2), nwv(hd);
    for (auto & x : q) {
        x = r.next();
    }
    for (auto & x : ffv) {
        x = 1.0f + 3.0f * std::fabs(r.next());
    }
    for (auto & x : nwv) {
        x = 1.0f + 0.5f * r.next();
    }
    std::vector<int32_t> kpos(n_cells);
    for (int i = 0; i < n_cells; i++) {
        kpos[i] = (i % c.n_kv) * 37 + 5 + 1000 * (i / c.n_kv);  // angles up to ~10^4 radians
    }
    // the mask: -inf holes, small finite biases, token 1 of stream 0 fully masked when there are 3+ tokens
    std::vector<float> maskv((size_t) c.n_kv * c.n_ts * ns);
    for (int s = 0; s < ns; s++) {
        for (int t = 0; t < c.n_ts; t++) {
            for (int i = 0; i < c.n_kv; i++) {
                float m = (i * 13 + t * 5 + s) % 7 == 0 ? -INFINITY : 0.25f * (float) ((i + t) % 3);
                if (c.n_ts >= 3 && s == 0 && t == 1) {
                    m = -INFINITY;
                }
                maskv[((size_t) s * c.n_ts + t) * c.n_kv + i] = m;
            }
        }
    }
    std::vector<ggml_fp16_t> mask16(maskv.size());
    for (size_t i = 0; i < maskv.size(); i++) {
        mask16[i] = ggml_fp32_to_fp16(maskv[i]);
    }

    ggml_init_params ip  = { 64 * ggml_tensor_overhead() + 2 * ggml_graph_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    sk  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D, n_cells);
    ggml_tensor *    sv  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D, n_cells);
    ggml_tensor *    idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_cells);
    ggml_tensor *    tq  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_head, n_tok);
    ggml_tensor *    tm  = ggml_new_tensor_4d(ctx, c.mask_f32 ? GGML_TYPE_F32 : GGML_TYPE_F16, c.n_kv, c.n_ts, 1, ns);
    ggml_tensor *    tp  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_cells);
    ggml_tensor *    tff = c.yarn ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.n_dims / 2) : nullptr;
    ggml_tensor *    tnw = c.norm ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, hd) : nullptr;
    ggml_tensor *    wk  = ggml_set_rows(ctx, kc, sk, idx);
    ggml_tensor *    wv  = ggml_set_rows(ctx, vc, sv, idx);
    // the cache views as llama.cpp's graph hands them over: [hd, n_head_kv, n_kv, n_stream]
    ggml_tensor * k = ggml_view_4d(ctx, kc, hd, n_hkv, c.n_kv, ns, ggml_row_size(kt, hd), kc->nb[1],
                                   kc->nb[1] * c.n_kv, 0);
    ggml_tensor * v = ggml_view_4d(ctx, vc, hd, n_hkv, c.n_kv, ns, ggml_row_size(vt, hd), vc->nb[1],
                                   vc->nb[1] * c.n_kv, 0);
    ggml_ext_kvquant_rope rope = { c.mode, c.n_dims, 4096, 10000.0f, c.yarn ? 0.25f : 1.0f, c.yarn ? 1.0f : 0.0f,
                               1.0f, 32.0f, 1.0f };
    char          why[160] = "";
    ggml_tensor * out = ggml_ext_kvquant_attn(ctx, tq, k, v, tm, tp, tff, &rope, tnw, 1e-6f, 1.0f / std::sqrt((float) hd),
                                              c.chunk, why, sizeof(why));
    CHECK(out != nullptr, "ggml_ext_kvquant_attn: %s", why);
    std::vector<float> res;
    if (out) {
        ggml_cgraph * gw = ggml_new_graph(ctx);
        ggml_build_forward_expand(gw, wk);
        ggml_build_forward_expand(gw, wv);
        ggml_cgraph * ga = ggml_new_graph(ctx);
        ggml_build_forward_expand(ga, out);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        ggml_backend_tensor_set(sk, xk.data(), 0, ggml_nbytes(sk));
        ggml_backend_tensor_set(sv, xv.data(), 0, ggml_nbytes(sv));
        ggml_backend_tensor_set(idx, rows.data(), 0, ggml_nbytes(idx));
        ggml_backend_tensor_set(tq, q.data(), 0, ggml_nbytes(tq));
        if (c.mask_f32) {
            ggml_backend_tensor_set(tm, maskv.data(), 0, ggml_nbytes(tm));
        } else {
            ggml_backend_tensor_set(tm, mask16.data(), 0, ggml_nbytes(tm));
        }
        ggml_backend_tensor_set(tp, kpos.data(), 0, ggml_nbytes(tp));
        if (tff) {
            ggml_backend_tensor_set(tff, ffv.data(), 0, ggml_nbytes(tff));
        }
        if (tnw) {
            ggml_backend_tensor_set(tnw, nwv.data(), 0, ggml_nbytes(tnw));
        }
        int n_ours = 0;
        for (ggml_cgraph * g : { gw, ga }) {
            for (int i = 0; i < ggml_graph_n_nodes(g); i++) {
                ggml_tensor * n = ggml_graph_node(g, i);
                n_ours += ggml_ext_kvquant_attn_node_kind(n) != 0;
                CHECK(ggml_backend_supports_op(be, n), "%s does not support %s (%s)", ggml_backend_name(be),
                      ggml_op_desc(n), n->name);
            }
            CHECK(ggml_backend_graph_compute(be, g) == GGML_STATUS_SUCCESS, "compute on %s", ggml_backend_name(be));
        }
        CHECK(n_ours == 3, "the op's graph has %d of its three nodes", n_ours);
        res.resize(ggml_nelements(out));
        ggml_backend_tensor_get(out, res.data(), 0, ggml_nbytes(out));
        ggml_backend_buffer_free(buf);
        *ok = true;
    }
    ggml_free(ctx);
    ggml_ext_kvquant_unbind(kc->data);
    if (v_nuq) {
        ggml_ext_kvquant_unbind(vc->data);
    }
    ggml_backend_buffer_free(cbuf);
    ggml_free(cctx);
    return res;
}

constexpr int n_split_modes = 2;

static void test_case(ggml_backend_t cpu, ggml_backend_dev_t dev, const cfg & c) {
    char         what[240];
    const char * split = std::getenv("GGML_EXT_KV_ATTN_SPLIT");
    std::snprintf(what, sizeof(what), "K %s V %s hd %d GQA %d/%d n_kv %d x %d stream(s) tokens %d chunk %d%s%s%s%s%s%s%s",
                  c.k_name, c.v_name, c.hd, c.n_hkv * c.n_q, c.n_hkv, c.n_kv, c.n_stream, c.n_ts, c.chunk,
                  c.mode == GGML_ROPE_TYPE_NEOX ? " neox" : " normal", c.yarn ? " yarn+ff" : "", c.norm ? " +knorm" : "",
                  c.outliers ? " +outliers" : "", c.n_sink ? " +sink" : "", c.kblock ? " +kblock" : "",
                  !split ? "" : " block kernel");
    // a fresh GPU backend per case (llama.cpp makes one per context; caches may land where the previous case's were)
    ggml_backend_t gpu = ggml_backend_dev_init(dev, nullptr);
    bool           ok_c = false, ok_g = false;
    const std::vector<float> rc = run_case(cpu, c, &ok_c);
    const std::vector<float> rg = run_case(gpu, c, &ok_g);
    ggml_backend_free(gpu);
    if (!ok_c || !ok_g) {
        return;
    }
    CHECK(rc.size() == rg.size(), "%s: sizes %zu / %zu", what, rc.size(), rg.size());
    double  num = 0, den = 0;
    int64_t bad = 0, zeros_c = 0, zeros_g = 0;
    for (size_t i = 0; i < std::min(rc.size(), rg.size()); i++) {
        if (!std::isfinite(rc[i]) || !std::isfinite(rg[i])) {
            bad++;
            continue;
        }
        num += ((double) rc[i] - rg[i]) * ((double) rc[i] - rg[i]);
        den += (double) rc[i] * rc[i];
        zeros_c += rc[i] == 0.0f;
        zeros_g += rg[i] == 0.0f;
    }
    const double err = den > 0 ? num / den : num;
    CHECK(bad == 0, "%s: %lld non-finite outputs", what, (long long) bad);
    CHECK(err <= 1e-6, "%s: NMSE %g against the CPU", what, err);
    CHECK(zeros_c == zeros_g, "%s: %lld zeros on the CPU, %lld on the GPU (a fully masked query)", what,
          (long long) zeros_c, (long long) zeros_g);
    if (c.n_ts >= 3) {
        CHECK(zeros_c >= (int64_t) c.hd * c.n_hkv * c.n_q, "%s: the fully masked query is not zeros", what);
    }
    std::printf("%s: NMSE %.3g against the CPU\n", what, err);
}

int main(int argc, char ** argv) {
    bool require_gpu = false, cpu_twice = false;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--require-gpu")) {
            require_gpu = true;
        } else if (!std::strcmp(argv[i], "--cpu-twice")) {
            cpu_twice = true;  // the harness alone on a machine without a GPU: the CPU in the GPU's place
        } else {
            std::fprintf(stderr, "usage: %s [--require-gpu | --cpu-twice]\n", argv[0]);
            return 2;
        }
    }
    int                         n_gpu  = 0;
    std::vector<ggml_backend_t> others = other_backends(nullptr, &n_gpu);
    if (cpu_twice) {
        for (ggml_backend_t b : others) {
            ggml_backend_free(b);
        }
        others = { ggml_backend_cpu_init() };
    } else if (n_gpu == 0) {
        std::printf("SKIP: no GPU device in the ggml registry (a build without GGML_EXT_CUDA=ON, or no CUDA device)\n");
        return require_gpu ? 77 : 0;
    }
    const int N = GGML_ROPE_TYPE_NORMAL, X = GGML_ROPE_TYPE_NEOX;
    // k, v, hd, n_hkv, n_q, n_kv, n_ts, streams, mode, n_dims, yarn, norm, outliers, sink, chunk, mask_f32, kblock
    const cfg cases[] = {
        { "nuq3", "nuq3", 128, 2, 4, 300, 1, 1, X, 128, 0, 0, 1, 1, 64, 0, 0 },   // decode, GQA 4, outliers + sink
        { "nuq4", "f16", 64, 1, 4, 1000, 5, 1, N, 32, 0, 1, 1, 0, 0, 0, 0 },      // K norm, n_dims < hd, CPU chunk
        { "nuq2", "f32", 128, 2, 1, 257, 3, 2, X, 96, 1, 1, 0, 1, 32, 1, 0 },     // 2 streams, YaRN + freq factors
        { "nuq3", "nuq4", 64, 2, 20, 513, 2, 1, X, 64, 0, 0, 1, 1, 96, 0, 0 },    // 40 queries per KV head: 3 slices
        { "nuq4", "nuq2", 256, 1, 4, 2049, 1, 1, X, 256, 0, 1, 1, 1, 32, 0, 0 },  // gemma3-like head dim, K norm
        { "nuq2", "nuq3", 64, 4, 2, 77, 6, 1, N, 64, 0, 0, 0, 0, 256, 1, 0 },     // one short range (n_kv < chunk)
        { "nuq4", "nuq4", 128, 2, 3, 700, 2, 2, X, 96, 1, 1, 1, 1, 64, 1, 0 },    // NEOX pairs across lanes, 2 streams
        { "nuq3", "nuq3", 64, 3, 3, 1200, 1, 1, X, 64, 0, 0, 1, 1, 128, 0, 1 },   // smollm2-like, block-scaled keys
    };
    const int n_cases = (int) (sizeof(cases) / sizeof(cases[0]));
    ggml_backend_t cpu = ggml_backend_cpu_init();
    for (ggml_backend_t gpu : others) {
        std::printf("backend: %s\n", ggml_backend_name(gpu));
        // every case twice (kvquant_attn_cuda.cu reads GGML_EXT_KV_ATTN_SPLIT at every launch): the default (the lane
        // kernel where it applies, the block kernel elsewhere) and the block kernel alone
        const char * modes[n_split_modes] = { nullptr, "0" };
        for (const char * mode : modes) {
            if (mode) {
                setenv("GGML_EXT_KV_ATTN_SPLIT", mode, 1);
            } else {
                unsetenv("GGML_EXT_KV_ATTN_SPLIT");
            }
            for (const cfg & c : cases) {
                test_case(cpu, ggml_backend_get_device(gpu), c);
            }
        }
        unsetenv("GGML_EXT_KV_ATTN_SPLIT");
        ggml_backend_free(gpu);
    }
    ggml_backend_free(cpu);
    std::printf("%s: the KVQuant decode op, CPU + GPU, %d cases x %d (default, block kernel), %d failure(s)\n", g_fails ? "FAIL" : "OK", n_cases, n_split_modes, g_fails);
    return g_fails ? 1 : 0;
}
