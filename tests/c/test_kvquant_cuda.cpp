// The KVQuant cache types NUQ4 / NUQ3 / NUQ2 on a GPU against the CPU (ggml_ext/src/cuda/kvquant_cuda.cu, patch
// 0421; docs/KVQUANT.md "The CUDA path"). Each backend gets the same caches, allocated in its own buffer and bound
// by address to the same per-layer tables (ggml_ext_kvquant_bind_opts, as the llama glue does), four "layers" at
// once: a value cache (two 64-value blocks per row) and a pre-RoPE key cache (three blocks per row, per-channel
// scales) of one table each, a block-scaled key cache (GGML_EXT_KV_KBLOCK, ggml_ext_kvquant_key_blocks: per channel,
// then each block a value block of the normalised keys with one slot) of the key cache's table and scales, and a
// second value cache of another table. For nuq4 / 3 / 2, without and with the in-block outlier slots and the float
// sink (--kv-outliers / --kv-sink):
//   SET_ROWS  f32 rows (an odd count, into scattered cells; rows with values far outside the key ranges, one with a
//             NaN, one with an infinity) -> the caches' bytes equal the CPU's byte for byte (the two key caches get
//             the same rows: the CPU's bytes of the two must differ, so a GPU that ignores the block scale fails);
//   CPY       NUQ -> f32 of every cell (and of a 4-D block view of the block-scaled keys, as the K path casts it):
//             the CPU's values bit for bit (NaN where the CPU has NaN); NUQ -> f16: the CPU's f32 rounded to f16; a
//             sink row reads back the floats written (values and block-scaled keys: so the device sink is used);
//   side blob the state's sink rows (ggml_ext_kvquant_side_get) of the GPU cache equal the CPU's; restored onto another cell
//             (ggml_ext_kvquant_side_set), the GPU reads them there;
//   GET_ROWS  NUQ -> f32 of an odd list of cells: bit for bit;
//   FLASH_ATTN_EXT with a NUQ V (256 cells, two KV heads, GQA): the GPU's result equals, bit for bit, the same GPU's
//             flash attention on an f16 V holding the CPU's dequantized values, and is within NMSE 5e-4 of the CPU's
//             (test-backend-ops' bound for flash attention).
// --require-gpu: exit 77 (skip) when there is no GPU device. Built and run by scripts/test_cuda.sh (make test-cuda)
// and tests/cuda/test_kvquant_cuda.py.
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
#include <cstring>
#include <string>
#include <vector>

// GGML_EXT_KV_KBLOCK's switch (backend/kvquant_base.c; declared by its callers only, as the llama glue does)
extern "C" int ggml_ext_kvquant_key_blocks(const void * data, int on);

static const int N_CELLS = 257;  // cache rows (odd)
static const int D_V     = 128;  // value row: 2 blocks (two heads of 64)
static const int D_K     = 192;  // key row: 3 blocks
static const int N_WRITE = 37;   // rows written per SET_ROWS (odd)

struct caches {
    ggml_backend_t        be  = nullptr;
    ggml_context *        ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ggml_tensor *         v = nullptr, *k = nullptr, *kb = nullptr, *v2 = nullptr;  // kb: block-scaled keys

    ~caches() {
        for (ggml_tensor * t : { v, k, kb, v2 }) {
            if (t && t->data) {
                ggml_ext_kvquant_unbind(t->data);
            }
        }
        if (buf) {
            ggml_backend_buffer_free(buf);
        }
        if (ctx) {
            ggml_free(ctx);
        }
    }
};

struct setup {
    int                type, bits;
    bool               outliers;
    int                n_sink;
    tables             tv, tk, tv2;
    std::vector<float> k_mid, k_half;
};

static bool make_caches(caches & c, ggml_backend_t be, const setup & s) {
    c.be                    = be;
    ggml_init_params ip     = { 8 * ggml_tensor_overhead(), nullptr, true };
    c.ctx                   = ggml_init(ip);
    c.v                     = ggml_new_tensor_2d(c.ctx, (ggml_type) s.type, D_V, N_CELLS);
    c.k                     = ggml_new_tensor_2d(c.ctx, (ggml_type) s.type, D_K, N_CELLS);
    c.kb                    = ggml_new_tensor_2d(c.ctx, (ggml_type) s.type, D_K, N_CELLS);
    c.v2                    = ggml_new_tensor_2d(c.ctx, (ggml_type) s.type, D_V, N_CELLS);
    c.buf                   = ggml_backend_alloc_ctx_tensors(c.ctx, be);
    if (!c.buf) {
        CHECK(false, "%s: no buffer", ggml_backend_name(be));
        return false;
    }
    ggml_backend_buffer_clear(c.buf, 0);
    char err[256] = "";
    int  rc       = ggml_ext_kvquant_bind_opts(c.v->data, ggml_nbytes(c.v), s.type, D_V, s.tv.levels, s.tv.values, nullptr,
                                               nullptr, s.outliers, s.n_sink, err, sizeof(err));
    rc |= ggml_ext_kvquant_bind_opts(c.k->data, ggml_nbytes(c.k), s.type, D_K, s.tk.levels, s.tk.values, s.k_mid.data(),
                                     s.k_half.data(), s.outliers, s.n_sink, err, sizeof(err));
    rc |= ggml_ext_kvquant_bind_opts(c.kb->data, ggml_nbytes(c.kb), s.type, D_K, s.tk.levels, s.tk.values, s.k_mid.data(),
                                     s.k_half.data(), s.outliers, s.n_sink, err, sizeof(err));
    rc |= ggml_ext_kvquant_key_blocks(c.kb->data, 1) != 0 ? (snprintf(err, sizeof(err), "key_blocks"), 1) : 0;
    rc |= ggml_ext_kvquant_bind_opts(c.v2->data, ggml_nbytes(c.v2), s.type, D_V, s.tv2.levels, s.tv2.values, nullptr,
                                     nullptr, s.outliers, s.n_sink, err, sizeof(err));
    CHECK(rc == 0, "bind on %s: %s", ggml_backend_name(be), err);
    return rc == 0;
}

// runs `build` (which makes the graph's output tensors in ctx) on backend c.be; the outputs' bytes
struct run_out {
    std::vector<std::vector<uint8_t>> bytes;
};

template <typename F> static run_out run_graph(caches & c, F build) {
    ggml_init_params           ip  = { 64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context *             ctx = ggml_init(ip);
    std::vector<ggml_tensor *> outs;
    std::vector<std::pair<ggml_tensor *, std::vector<uint8_t>>> inputs;
    build(ctx, outs, inputs);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    for (ggml_tensor * o : outs) {
        ggml_build_forward_expand(gf, o);
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, c.be);
    for (auto & in : inputs) {
        ggml_backend_tensor_set(in.first, in.second.data(), 0, in.second.size());
    }
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        ggml_tensor * n = ggml_graph_node(gf, i);
        CHECK(ggml_backend_supports_op(c.be, n), "%s does not support %s (%s)", ggml_backend_name(c.be), ggml_op_desc(n),
              n->name);
    }
    CHECK(ggml_backend_graph_compute(c.be, gf) == GGML_STATUS_SUCCESS, "compute on %s", ggml_backend_name(c.be));
    run_out r;
    for (ggml_tensor * o : outs) {
        std::vector<uint8_t> b(ggml_nbytes(o));
        ggml_backend_tensor_get(o, b.data(), 0, b.size());
        r.bytes.push_back(std::move(b));
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

template <typename T> static std::vector<uint8_t> as_bytes(const std::vector<T> & v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

static std::vector<uint8_t> tensor_bytes(ggml_tensor * t) {
    std::vector<uint8_t> b(ggml_nbytes(t));
    ggml_backend_tensor_get(t, b.data(), 0, b.size());
    return b;
}

// f32 values equal bit for bit, NaN where the other is NaN; the count of differences
static int64_t f32_diffs(const std::vector<uint8_t> & a, const std::vector<uint8_t> & b) {
    int64_t n = 0;
    for (size_t i = 0; i + 4 <= std::min(a.size(), b.size()); i += 4) {
        float x, y;
        std::memcpy(&x, &a[i], 4);
        std::memcpy(&y, &b[i], 4);
        if (!(std::isnan(x) && std::isnan(y)) && std::memcmp(&x, &y, 4) != 0) {
            n++;
        }
    }
    return n + (a.size() != b.size());
}

// outlier slots in a cache's blocks (value_style: one slot, words 2 / 3; words 0 / 1 are the block's mid / half)
static int64_t count_slots(const std::vector<uint8_t> & cache, size_t block_bytes, int bits, bool value_style) {
    int64_t n = 0;
    for (size_t o = 0; o + block_bytes <= cache.size(); o += block_bytes) {
        uint16_t w[4];
        std::memcpy(w, &cache[o + 64 * bits / 8], sizeof(w));
        n += !value_style && (w[0] & 0xffc0) == 0x8000;
        n += (w[2] & 0xffc0) == 0x8000;
    }
    return n;
}

static double nmse(const std::vector<uint8_t> & a, const std::vector<uint8_t> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i + 4 <= a.size(); i += 4) {
        float x, y;
        std::memcpy(&x, &a[i], 4);
        std::memcpy(&y, &b[i], 4);
        num += ((double) x - y) * ((double) x - y);
        den += (double) x * x;
    }
    return den > 0 ? num / den : num;
}

static void test_one(ggml_backend_t cpu, ggml_backend_t gpu, int type, bool outliers, int n_sink) {
    const ggml_ext_type_info * ti = ggml_ext_type_info_by_id(type);
    setup                      s;
    s.type     = type;
    s.bits     = ti->layout;
    s.outliers = outliers;
    s.n_sink   = n_sink;
    s.tv       = make_table(s.bits, 11 + type);
    s.tk       = make_table(s.bits, 23 + type);
    s.tv2      = make_table(s.bits, 37 + type);
    rng r{ (uint64_t) (1000 * type + 10 * outliers + n_sink) };
    for (int c = 0; c < D_K; c++) {
        s.k_mid.push_back(0.3f * r.next());
        s.k_half.push_back(0.5f + 0.4f * r.next());
    }
    const std::string what = std::string(ti->ggml_name) + (outliers ? " +outliers" : "") + (n_sink ? " +sink" : "");

    caches cc, gc;
    if (!make_caches(cc, cpu, s) || !make_caches(gc, gpu, s)) {
        return;
    }
    // two writes of N_WRITE rows into distinct scattered cells (the second overwrites some of the first's)
    std::vector<int64_t> cells(N_CELLS);
    for (int i = 0; i < N_CELLS; i++) {
        cells[i] = (i * 101 + 7) % N_CELLS;
    }
    std::vector<float> sink_row, sink_key;  // what the sink cell (pass 0's first row, position 0) was written with
    for (int pass = 0; pass < 2; pass++) {
        std::vector<int64_t> idx(cells.begin() + pass * 20, cells.begin() + pass * 20 + N_WRITE);
        std::vector<float>   xv(D_V * N_WRITE), xk(D_K * N_WRITE), xv2(D_V * N_WRITE);
        for (auto & x : xv) {
            x = 2.0f * r.next() + 0.5f;
        }
        for (auto & x : xv2) {
            x = 0.1f * r.next();
        }
        for (int i = 0; i < N_WRITE; i++) {
            for (int c = 0; c < D_K; c++) {
                // keys mostly inside their channel's calibrated range, some well outside (outlier slots / clamps)
                const float u = r.next();
                xk[i * D_K + c] = s.k_mid[c] + s.k_half[c] * (std::fabs(u) > 0.97f ? 3.0f * u : 0.9f * u);
            }
        }
        xv[3 * D_V + 70]  = NAN;       // a NaN block (row 3's second block)
        xk[5 * D_K + 10]  = INFINITY;  // an infinite key block
        xv2[6 * D_V + 1]  = 40.0f;     // one value far from its block (the outlier slot)
        if (pass == 0) {
            sink_row.assign(xv.begin(), xv.begin() + D_V);
            sink_key.assign(xk.begin(), xk.begin() + D_K);
        }
        // the sink: the first written cell holds position 0 (before the graph that writes it, as apply_ubatch)
        std::vector<uint32_t> wc(N_WRITE);
        std::vector<int32_t>  pos(N_WRITE);
        for (int i = 0; i < N_WRITE; i++) {
            wc[i]  = (uint32_t) idx[i];
            pos[i] = pass == 0 && i == 0 ? 0 : 100 + i;
        }
        for (caches * c : { &cc, &gc }) {
            for (ggml_tensor * t : { c->v, c->k, c->kb, c->v2 }) {
                ggml_ext_kvquant_rows_written(t->data, t->nb[1], wc.data(), pos.data(), N_WRITE);
            }
            run_graph(*c, [&](ggml_context * ctx, std::vector<ggml_tensor *> & outs,
                              std::vector<std::pair<ggml_tensor *, std::vector<uint8_t>>> & in) {
                ggml_tensor * i64 = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, N_WRITE);
                ggml_tensor * sv  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D_V, N_WRITE);
                ggml_tensor * sk  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D_K, N_WRITE);
                ggml_tensor * sv2 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D_V, N_WRITE);
                in.push_back({ i64, as_bytes(idx) });
                in.push_back({ sv, as_bytes(xv) });
                in.push_back({ sk, as_bytes(xk) });
                in.push_back({ sv2, as_bytes(xv2) });
                outs.push_back(ggml_set_rows(ctx, c->v, sv, i64));
                outs.push_back(ggml_set_rows(ctx, c->k, sk, i64));
                outs.push_back(ggml_set_rows(ctx, c->kb, sk, i64));  // the same key rows, block-scaled
                outs.push_back(ggml_set_rows(ctx, c->v2, sv2, i64));
            });
        }
    }
    const char * names[4] = { "V", "K", "block-scaled K", "V2" };
    ggml_tensor * ct[4] = { cc.v, cc.k, cc.kb, cc.v2 }, *gt[4] = { gc.v, gc.k, gc.kb, gc.v2 };
    int64_t slots = 0, kb_slots = 0;
    for (int i = 0; i < 4; i++) {
        const std::vector<uint8_t> a = tensor_bytes(ct[i]), b = tensor_bytes(gt[i]);
        int64_t                    diff = 0, first = -1;
        for (size_t j = 0; j < a.size(); j++) {
            if (a[j] != b[j]) {
                diff++;
                first = first < 0 ? (int64_t) j : first;
            }
        }
        CHECK(diff == 0, "%s %s SET_ROWS: %lld bytes differ from the CPU's (first at %lld, block %lld)", what.c_str(),
              names[i], (long long) diff, (long long) first, (long long) (first / (int64_t) ti->type_size));
        // on a difference, the first few differing blocks' trailers (u16 words, and as fp16), CPU then GPU
        for (size_t o = 0, shown = 0; diff && o < a.size() && shown < 4; o += ti->type_size) {
            if (std::equal(a.begin() + o, a.begin() + o + ti->type_size, b.begin() + o)) {
                continue;
            }
            shown++;
            const size_t dense = ti->type_size - 8;
            uint16_t     wa[4], wb[4];
            std::memcpy(wa, a.data() + o + dense, sizeof(wa));
            std::memcpy(wb, b.data() + o + dense, sizeof(wb));
            const bool dense_same = std::equal(a.begin() + o, a.begin() + o + dense, b.begin() + o);
            std::printf("  block %lld (dense %s): CPU %04x %04x %04x %04x (%g %g %g)  GPU %04x %04x %04x %04x (%g %g %g)\n",
                        (long long) (o / ti->type_size), dense_same ? "same" : "differs", wa[0], wa[1], wa[2], wa[3],
                        (double) ggml_fp16_to_fp32(wa[0]), (double) ggml_fp16_to_fp32(wa[1]),
                        (double) ggml_fp16_to_fp32(wa[3]), wb[0], wb[1], wb[2], wb[3], (double) ggml_fp16_to_fp32(wb[0]),
                        (double) ggml_fp16_to_fp32(wb[1]), (double) ggml_fp16_to_fp32(wb[3]));
        }
        if (i == 2) {
            kb_slots = count_slots(a, ti->type_size, s.bits, true);
        } else {
            slots += count_slots(a, ti->type_size, s.bits, false);
        }
    }
    CHECK(outliers ? slots > 0 : slots == 0, "%s: %lld outlier slots in the CPU's blocks", what.c_str(), (long long) slots);
    CHECK(outliers ? kb_slots > 0 : kb_slots == 0, "%s: %lld outlier slots in the CPU's block-scaled key blocks",
          what.c_str(), (long long) kb_slots);
    {  // the CPU wrote the same key rows differently into the block-scaled cache: the GPU's equality above means it
       // follows the block scale (a GPU writing per-channel key blocks there would differ from the CPU)
        const std::vector<uint8_t> a = tensor_bytes(cc.k), b = tensor_bytes(cc.kb);
        int64_t                    same = 0, written = 0;
        for (size_t o = 0; o < a.size(); o += ti->type_size) {
            const bool zero = std::all_of(a.begin() + o, a.begin() + o + ti->type_size, [](uint8_t x) { return x == 0; });
            written += !zero;
            same += !zero && std::equal(a.begin() + o, a.begin() + o + ti->type_size, b.begin() + o);
        }
        CHECK(written > 0 && same == 0, "%s: %lld of %lld written key blocks are the same per channel and block-scaled",
              what.c_str(), (long long) same, (long long) written);
    }

    // dequantize: CPY to f32 (and f16 on the GPU) of every cell, GET_ROWS of an odd list
    std::vector<int32_t> gidx;
    for (int i = 0; i < 29; i++) {
        gidx.push_back((int32_t) cells[(i * 7) % N_CELLS]);
    }
    std::vector<run_out> outs;
    for (caches * c : { &cc, &gc }) {
        const bool is_gpu = c == &gc;
        outs.push_back(run_graph(*c, [&](ggml_context * ctx, std::vector<ggml_tensor *> & o,
                                         std::vector<std::pair<ggml_tensor *, std::vector<uint8_t>>> & in) {
            ggml_tensor * gi = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, (int64_t) gidx.size());
            in.push_back({ gi, as_bytes(gidx) });
            for (ggml_tensor * t : { c->v, c->k, c->kb, c->v2 }) {
                o.push_back(ggml_cast(ctx, t, GGML_TYPE_F32));
            }
            // a strided view: every other cell of the value cache, as a [64, 2, n] block view
            ggml_tensor * vv = ggml_view_3d(ctx, c->v, 64, 2, N_CELLS / 2, ggml_row_size(c->v->type, 64), 2 * c->v->nb[1], 0);
            o.push_back(ggml_cast(ctx, vv, GGML_TYPE_F32));
            // the block-scaled keys as the K path casts them before RoPE: [64, 2 blocks, cells - 1, 1] from the second
            // block of the first cell on (channel of a block from its offset in the cache, not in the view)
            ggml_tensor * kv = ggml_view_4d(ctx, c->kb, 64, 2, N_CELLS - 1, 1, ggml_row_size(c->kb->type, 64),
                                            c->kb->nb[1], c->kb->nb[1] * (N_CELLS - 1), ggml_row_size(c->kb->type, 64));
            o.push_back(ggml_cast(ctx, kv, GGML_TYPE_F32));
            o.push_back(ggml_get_rows(ctx, c->k, gi));
            o.push_back(ggml_get_rows(ctx, c->kb, gi));
            o.push_back(ggml_get_rows(ctx, c->v2, gi));
            if (is_gpu) {
                o.push_back(ggml_cast(ctx, c->v, GGML_TYPE_F16));
                o.push_back(ggml_cast(ctx, c->k, GGML_TYPE_F16));
                o.push_back(ggml_cast(ctx, c->kb, GGML_TYPE_F16));
            }
        }));
    }
    const int    n_f32     = 9;
    const char * dnames[n_f32] = { "CPY V",        "CPY K",      "CPY block-scaled K", "CPY V2",     "CPY V view",
                                   "CPY block-scaled K view", "GET_ROWS K", "GET_ROWS block-scaled K", "GET_ROWS V2" };
    for (int i = 0; i < n_f32; i++) {
        const int64_t d = f32_diffs(outs[0].bytes[i], outs[1].bytes[i]);
        CHECK(d == 0, "%s %s -> f32: %lld values differ from the CPU's", what.c_str(), dnames[i], (long long) d);
    }
    for (int i = 0; i < 3; i++) {  // f16 = the CPU's f32 rounded (V, K, block-scaled K)
        const std::vector<uint8_t> & f32 = outs[0].bytes[i], & f16 = outs[1].bytes[n_f32 + i];
        int64_t                      d   = 0;
        for (size_t j = 0; j < f16.size() / 2; j++) {
            float x;
            std::memcpy(&x, &f32[4 * j], 4);
            ggml_fp16_t h = ggml_fp32_to_fp16(x), g;
            std::memcpy(&g, &f16[2 * j], 2);
            d += !(std::isnan(x) && std::isnan(ggml_fp16_to_fp32(g))) && h != g;
        }
        CHECK(d == 0, "%s %s -> f16: %lld values differ from the CPU's f32 rounded", what.c_str(), dnames[i], (long long) d);
    }
    {  // the sink cell (position 0) reads back exactly what was written on the GPU with a sink, not without
        int64_t exact = 0;
        for (int c = 0; c < D_V; c++) {
            float y;
            std::memcpy(&y, &outs[1].bytes[0][4 * ((size_t) cells[0] * D_V + c)], 4);
            exact += y == sink_row[c];
        }
        CHECK(n_sink ? exact == D_V : exact < D_V, "%s: the sink cell reads %lld of %d written values exactly",
              what.c_str(), (long long) exact, D_V);
        exact = 0;  // the block-scaled key cache's sink cell
        for (int c = 0; c < D_K; c++) {
            float y;
            std::memcpy(&y, &outs[1].bytes[2][4 * ((size_t) cells[0] * D_K + c)], 4);
            exact += y == sink_key[c];
        }
        CHECK(n_sink ? exact == D_K : exact < D_K, "%s: the block-scaled key sink cell reads %lld of %d written keys "
              "exactly", what.c_str(), (long long) exact, D_K);
    }
    if (n_sink) {
        // the state's side blob (llama_state_*): the sink floats of the GPU cache come out of device memory equal to
        // the CPU's; restored onto another cell on both, that cell then reads them on the GPU as on the CPU
        std::vector<uint32_t> sc = { (uint32_t) cells[0], (uint32_t) cells[1], (uint32_t) cells[2] };
        std::vector<std::vector<uint8_t>> blobs;
        for (caches * c : { &cc, &gc }) {
            std::vector<uint8_t> blob(ggml_ext_kvquant_side_get(c->v->data, c->v->nb[1], sc.data(), 3, nullptr, 0));
            ggml_ext_kvquant_side_get(c->v->data, c->v->nb[1], sc.data(), 3, blob.data(), blob.size());
            blobs.push_back(blob);
        }
        CHECK(blobs[0] == blobs[1] && blobs[0].size() == 8 + 4 + 4 * D_V, "%s side blob: %zu / %zu bytes, %s", what.c_str(),
              blobs[0].size(), blobs[1].size(), blobs[0] == blobs[1] ? "equal" : "different");
        const uint32_t dst_cell = (uint32_t) cells[N_CELLS - 1];  // never written: zero blocks
        std::vector<run_out> back;
        for (caches * c : { &cc, &gc }) {
            CHECK(ggml_ext_kvquant_side_set(c->v->data, c->v->nb[1], &dst_cell, 1, blobs[0].data(), blobs[0].size()) == 0,
                  "%s side_set", what.c_str());
            back.push_back(run_graph(*c, [&](ggml_context * ctx, std::vector<ggml_tensor *> & o,
                                             std::vector<std::pair<ggml_tensor *, std::vector<uint8_t>>> &) {
                o.push_back(ggml_cast(ctx, c->v, GGML_TYPE_F32));
            }));
        }
        CHECK(f32_diffs(back[0].bytes[0], back[1].bytes[0]) == 0, "%s after side_set: values differ", what.c_str());
        int64_t exact = 0;
        for (int c = 0; c < D_V; c++) {
            float y;
            std::memcpy(&y, &back[1].bytes[0][4 * ((size_t) dst_cell * D_V + c)], 4);
            exact += y == sink_row[c];
        }
        CHECK(exact == D_V, "%s: the restored sink cell reads %lld of %d values on the GPU", what.c_str(), (long long) exact,
              D_V);
    }
    std::printf("%s: SET_ROWS bytes equal (4 caches: V, K, block-scaled K, V2; %d + %d rows, %lld + %lld outlier slots), "
                "CPY / GET_ROWS bit for bit\n", what.c_str(), N_WRITE, N_WRITE, (long long) slots, (long long) kb_slots);
}

// flash attention with a NUQ V on the GPU: upstream's kernel on the dequantized V; bit for bit that kernel on an f16
// V of the CPU's dequantized values, within NMSE 5e-4 of the CPU's flash attention
static void test_flash_attn(ggml_backend_t cpu, ggml_backend_t gpu, int type) {
    const ggml_ext_type_info * ti = ggml_ext_type_info_by_id(type);
    const int  hd = 64, n_kv = 256, n_head_kv = 2, n_head = 4, n_q = 3;
    setup      s;
    s.type = type, s.bits = ti->layout, s.outliers = true, s.n_sink = 1;
    s.tv = make_table(s.bits, 5), s.tk = make_table(s.bits, 6), s.tv2 = make_table(s.bits, 7);
    s.k_mid.assign(D_K, 0.0f);
    s.k_half.assign(D_K, 1.0f);
    rng                  r{ (uint64_t) type };
    std::vector<float>   q(hd * n_q * n_head), k(hd * n_kv * n_head_kv), v(D_V * n_kv);
    for (auto * a : { &q, &k, &v }) {
        for (auto & x : *a) {
            x = r.next();
        }
    }
    std::vector<ggml_fp16_t> k16(k.size());
    for (size_t i = 0; i < k.size(); i++) {
        k16[i] = ggml_fp32_to_fp16(k[i]);
    }
    std::vector<int64_t> all(n_kv);
    for (int i = 0; i < n_kv; i++) {
        all[i] = i;
    }
    // caches of 256 + 1 cells; V = cells 0..255 of the value cache (2 heads of 64 per row)
    caches cc, gc;
    if (!make_caches(cc, cpu, s) || !make_caches(gc, gpu, s)) {
        return;
    }
    std::vector<run_out> res;
    for (caches * c : { &cc, &gc }) {
        std::vector<uint32_t> wc(n_kv);
        std::vector<int32_t>  pos(n_kv);
        for (int i = 0; i < n_kv; i++) {
            wc[i] = (uint32_t) i, pos[i] = i;
        }
        ggml_ext_kvquant_rows_written(c->v->data, c->v->nb[1], wc.data(), pos.data(), n_kv);
        run_graph(*c, [&](ggml_context * ctx, std::vector<ggml_tensor *> & o,
                          std::vector<std::pair<ggml_tensor *, std::vector<uint8_t>>> & in) {
            ggml_tensor * i64 = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_kv);
            ggml_tensor * sv  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D_V, n_kv);
            in.push_back({ i64, as_bytes(all) });
            in.push_back({ sv, as_bytes(v) });
            o.push_back(ggml_set_rows(ctx, c->v, sv, i64));
        });
        // the CPU's dequantized V (f32), then attention
        res.push_back(run_graph(*c, [&](ggml_context * ctx, std::vector<ggml_tensor *> & o,
                                        std::vector<std::pair<ggml_tensor *, std::vector<uint8_t>>> & in) {
            ggml_tensor * tq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_q, n_head);
            ggml_tensor * tk = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, hd, n_kv, n_head_kv);
            in.push_back({ tq, as_bytes(q) });
            in.push_back({ tk, as_bytes(k16) });
            // V as llama.cpp's graph hands it over: [hd, n_kv, n_head_kv], a permuted view of the cache rows
            ggml_tensor * tv = ggml_view_3d(ctx, c->v, hd, n_head_kv, n_kv, ggml_row_size(c->v->type, hd), c->v->nb[1], 0);
            tv               = ggml_permute(ctx, tv, 0, 2, 1, 3);
            ggml_tensor * fa = ggml_flash_attn_ext(ctx, tq, tk, tv, nullptr, 0.125f, 0.0f, 0.0f);
            o.push_back(fa);
            o.push_back(ggml_cast(ctx, ggml_view_2d(ctx, c->v, D_V, n_kv, c->v->nb[1], 0), GGML_TYPE_F32));
        }));
    }
    // the GPU's kernel on an f16 V of the CPU's dequantized values, [hd, n_kv, n_head_kv] contiguous as the pool copy
    std::vector<ggml_fp16_t> v16(D_V * n_kv);
    for (int h = 0; h < n_head_kv; h++) {
        for (int i = 0; i < n_kv; i++) {
            for (int c = 0; c < hd; c++) {
                float x;
                std::memcpy(&x, &res[0].bytes[1][4 * ((size_t) i * D_V + h * hd + c)], 4);
                v16[((size_t) h * n_kv + i) * hd + c] = ggml_fp32_to_fp16(x);
            }
        }
    }
    run_out ref = run_graph(gc, [&](ggml_context * ctx, std::vector<ggml_tensor *> & o,
                                    std::vector<std::pair<ggml_tensor *, std::vector<uint8_t>>> & in) {
        ggml_tensor * tq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_q, n_head);
        ggml_tensor * tk = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, hd, n_kv, n_head_kv);
        ggml_tensor * tv = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, hd, n_kv, n_head_kv);
        in.push_back({ tq, as_bytes(q) });
        in.push_back({ tk, as_bytes(k16) });
        in.push_back({ tv, as_bytes(v16) });
        ggml_tensor * fa = ggml_flash_attn_ext(ctx, tq, tk, tv, nullptr, 0.125f, 0.0f, 0.0f);
        o.push_back(fa);
    });
    const int64_t d   = f32_diffs(ref.bytes[0], res[1].bytes[0]);
    const double  err = nmse(res[0].bytes[0], res[1].bytes[0]);
    CHECK(d == 0, "%s FLASH_ATTN_EXT: %lld outputs differ from the GPU's on the CPU's dequantized V in f16", ti->ggml_name,
          (long long) d);
    CHECK(err <= 5e-4, "%s FLASH_ATTN_EXT: NMSE %g against the CPU", ti->ggml_name, err);
    std::printf("%s FLASH_ATTN_EXT (V of %d cells, GQA %d/%d): = GPU on f16 V, NMSE %.3g against the CPU\n", ti->ggml_name,
                n_kv, n_head, n_head_kv, err);
}

int main(int argc, char ** argv) {
    bool require_gpu = false;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--require-gpu")) {
            require_gpu = true;
        } else {
            std::fprintf(stderr, "usage: %s [--require-gpu]\n", argv[0]);
            return 2;
        }
    }
    int                         n_gpu  = 0;
    std::vector<ggml_backend_t> others = other_backends(nullptr, &n_gpu);
    if (n_gpu == 0) {
        std::printf("SKIP: no GPU device in the ggml registry (a build without GGML_EXT_CUDA=ON, or no CUDA device)\n");
        return require_gpu ? 77 : 0;
    }
    ggml_backend_t cpu = ggml_backend_cpu_init();
    for (ggml_backend_t gpu : others) {
        std::printf("backend: %s\n", ggml_backend_name(gpu));
        for (const char * name : { "nuq4", "nuq3", "nuq2" }) {
            const int type = ggml_ext_kv_cache_type_by_name(name);
            CHECK(type > 0, "%s: no such type", name);
            if (type <= 0) {
                continue;
            }
            // a fresh GPU backend per case, as llama.cpp makes one per context: ggml-cuda replays a captured CUDA
            // graph whose nodes look the same, and a case's caches may lie where the previous case's were, bound to
            // other tables (the kernels' table arguments are fixed per binding, for a context's lifetime)
            ggml_backend_dev_t dev = ggml_backend_get_device(gpu);
            for (int k = 0; k < 4; k++) {
                ggml_backend_t g = ggml_backend_dev_init(dev, nullptr);
                if (k < 3) {
                    test_one(cpu, g, type, k > 0, k == 2 ? 1 : 0);
                } else {
                    test_flash_attn(cpu, g, type);
                }
                ggml_backend_free(g);
            }
        }
        ggml_backend_free(gpu);
    }
    ggml_backend_free(cpu);
    std::printf("%s: nuq4 / nuq3 / nuq2 x 3 settings + flash attention, CPU + GPU, %d failure(s)\n",
                g_fails ? "FAIL" : "OK", g_fails);
    return g_fails ? 1 : 0;
}
