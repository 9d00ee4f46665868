// The KVQuant cache types' CUDA block functions (ggml_ext/src/cuda/kvquant_decode.cuh: what the SET_ROWS / CPY /
// GET_ROWS / flash-attention kernels of kvquant_cuda.cu run per block and per value) on the host against the CPU
// row functions (ggml's from_float_ref / to_float of NUQ4 / NUQ3 / NUQ2, backend/kvquant_base.c): for each type, value
// and pre-RoPE key caches (per-channel key blocks, and block-scaled ones: GGML_EXT_KV_KBLOCK, ggml_ext_kvquant_key_blocks),
// without and with outlier slots, without and with the float sink, and memory outside every
// binding (uniform levels), rows of random values (some far outside the key ranges, a NaN, an infinity) quantized by
// both must give the same bytes, and every value read back the same bits (NaN where the CPU has NaN). The kernel
// arguments come from ggml-base's view of the binding (ggml_ext_kvquant_binding_find / _sinks, kvquant_device.h), as
// kvquant_cuda.cu builds them. The decode op's row reader (kvq::row_geo_of / row_sink / block_words / block_value,
// what kvquant_attn_cuda.cu reads K and V rows with) on the same caches cut into heads of 64 values and of a whole row:
// every value the bits of dequantize_value; strides that are not whole rows refused. Then the kernels' per-thread
// bodies (kvq::quantize_at / dequantize_at) against ggml's CPU ops over real shapes and strides (check_ops below). Host code only: built with nvcc and run without a GPU by
// tests/cuda/test_kvquant_cuda.py. The kernels on a GPU against the CPU: tests/c/test_kvquant_cuda.cpp.
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-ext-kvquant.h"
#include "ggml-ext.h"
#include "ggml.h"
#include "backend/kvquant_device.h"
#include "kvquant_decode.cuh"
#include "kvq_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>


// GGML_EXT_KV_KBLOCK's switch (backend/kvquant_base.c; declared by its callers only)
extern "C" int ggml_ext_kvquant_key_blocks(const void * data, int on);


static const int N_ROWS = 9;

static int64_t n_geo_total = 0, n_lane_total = 0;

static void check(int type, bool key, bool kblock, bool outliers, int n_sink, bool bound, int * n_slots) {
    int64_t * n_geo_checked = &n_geo_total;
    const ggml_ext_type_info * ti   = ggml_ext_type_info_by_id(type);
    const int                  bits = ti->layout;
    const int                  D    = key ? 192 : 128;
    const size_t               bs = ti->type_size, row_bytes = (size_t) D / 64 * bs;
    std::mt19937               gen(1000 * type + 100 * key + 10 * outliers + n_sink + 5 * bound + 3 * kblock);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    float                      levels[16] = {}, values[16] = {};
    random_table(gen, bits, levels, values);
    std::vector<float> mid(D), half(D);
    random_scales(gen, mid, half);
    std::vector<float> x((size_t) N_ROWS * D);
    for (int r = 0; r < N_ROWS; r++) {
        for (int c = 0; c < D; c++) {
            const float v = u(gen);
            x[(size_t) r * D + c] = key ? mid[c] + half[c] * (std::fabs(v) > 0.96f ? 3.0f * v : 0.9f * v) : 2.0f * v + 0.3f;
        }
    }
    x[3 * D + 70] = NAN;
    x[5 * D + 1]  = INFINITY;
    x[6 * D + 2]  = 30.0f;
    std::vector<uint8_t> ref(N_ROWS * row_bytes + 8), mine(ref.size());
    char                 err[256] = "";
    if (bound) {
        const int rc = ggml_ext_kvquant_bind_opts(ref.data(), N_ROWS * row_bytes, type, D, levels, values,
                                                  key ? mid.data() : nullptr, key ? half.data() : nullptr, outliers, n_sink,
                                                  err, sizeof(err));
        CHECK(rc == 0, "bind: %s", err);
        if (kblock) {
            CHECK(ggml_ext_kvquant_key_blocks(ref.data(), 1) == 0, "key_blocks");
        }
        std::vector<uint32_t> cells(N_ROWS);
        std::vector<int32_t>  pos(N_ROWS);
        for (int r = 0; r < N_ROWS; r++) {
            cells[r] = (uint32_t) r, pos[r] = r == 4 ? 0 : 10 + r;  // row 4 holds position 0: a sink row
        }
        ggml_ext_kvquant_rows_written(ref.data(), row_bytes, cells.data(), pos.data(), N_ROWS);
    }
    // the kernels' arguments, as kvquant_cuda.cu's args_for makes them, on host memory
    ggml_ext_kvquant_binding_desc d;
    CHECK(ggml_ext_kvquant_binding_find(ref.data(), type, &d), "find");
    kvq::kvq_args a = {};
    a.bits = d.bits, a.block_bytes = (int) d.block_bytes, a.dense_bytes = 64 * d.bits / 8;
    std::memcpy(a.values, d.values, sizeof(a.values));
    std::memcpy(a.mids, d.mids, sizeof(a.mids));
    std::vector<int64_t> sink(1 + (d.sink_cap > 0 ? d.sink_cap : 0), 0);
    std::vector<float>   sink_data((size_t) (d.sink_cap > 0 ? d.sink_cap : 0) * D);
    if (d.lo) {
        a.lo = (const char *) mine.data();  // the shadow's own addresses: channels and rows follow from offsets
        a.row_blocks = d.row_blocks, a.k_mid = d.k_mid, a.k_half = d.k_half, a.outliers = d.outliers;
        a.k_block = d.k_block, a.row_values = d.row_values;
        if (d.n_sink > 0) {
            sink[0]     = ggml_ext_kvquant_binding_sinks(d.lo, d.serial, sink.data() + 1, d.sink_cap);
            a.sink      = sink.data();
            a.sink_data = sink_data.data();
            a.row_bytes = (int64_t) row_bytes;
            CHECK(sink[0] >= 1, "the sink row is not marked (%lld slots)", (long long) sink[0]);
        }
    }
    CHECK((d.lo != nullptr) == bound, "binding found %d", d.lo != nullptr);
    CHECK(d.k_block == (int) kblock, "the binding's k_block %d", d.k_block);
    // quantize: the CPU's from_float_ref per row, the kernel's per block (sink floats first, as k_quantize)
    const ggml_type_traits * tr = ggml_get_type_traits((ggml_type) type);
    for (int r = 0; r < N_ROWS; r++) {
        tr->from_float_ref(&x[(size_t) r * D], ref.data() + r * row_bytes, D);
        for (int b = 0; b < D / 64; b++) {
            uint8_t * blk = mine.data() + r * row_bytes + b * bs;
            int64_t   off;
            const int s = kvq::sink_slot(a, (const char *) blk, &off);
            if (s >= 0) {
                std::memcpy(&sink_data[(size_t) s * D + off], &x[(size_t) r * D + b * 64], 64 * sizeof(float));
            }
            kvq::quantize_block(a, &x[(size_t) r * D + b * 64], blk);
        }
    }
    int64_t diff = 0;
    for (size_t i = 0; i < N_ROWS * row_bytes; i++) {
        diff += ref[i] != mine[i];
    }
    const char * what = kblock ? "block-scaled keys" : key ? "keys" : "values";
    CHECK(diff == 0, "%s %s outliers %d sink %d bound %d: %lld bytes differ", ti->ggml_name, what, outliers, n_sink,
          bound, (long long) diff);
    for (size_t o = 0; o < N_ROWS * row_bytes; o += bs) {
        uint16_t w[4];
        std::memcpy(w, &ref[o + 64 * bits / 8], sizeof(w));
        *n_slots += (!kblock && (w[0] & 0xffc0) == 0x8000) + ((w[2] & 0xffc0) == 0x8000);  // kblock: w[0] = mid
    }
    // dequantize every value: the CPU's to_float per row, the kernel's per value
    int64_t vdiff = 0, exact_sink = 0;
    std::vector<float> y(D);
    for (int r = 0; r < N_ROWS; r++) {
        tr->to_float(ref.data() + r * row_bytes, y.data(), D);
        for (int c = 0; c < D; c++) {
            const float g = kvq::dequantize_value(a, (const char *) mine.data() + r * row_bytes + c / 64 * bs, c % 64);
            vdiff += !(std::isnan(g) && std::isnan(y[c])) && std::memcmp(&g, &y[c], 4) != 0;
            exact_sink += r == 4 && g == x[(size_t) r * D + c];
        }
    }
    CHECK(vdiff == 0, "%s %s outliers %d sink %d bound %d: %lld values differ", ti->ggml_name, what, outliers, n_sink,
          bound, (long long) vdiff);
    CHECK((n_sink && bound) ? exact_sink == D : exact_sink < D, "sink row: %lld of %d exact", (long long) exact_sink, D);
    // the decode op's row reader (kvq::row_geo_of, row_sink, block_words, block_value): the cache rows as heads of 64
    // values and as one head of D, every value the bits of dequantize_value (compared with the CPU's just above);
    // block_value alone with key_channel0 on the blocks outside the sink rows
    int64_t gdiff = 0, n_geo = 0, ldiff = 0, n_lane = 0;
    for (int hd : { 64, D }) {
        for (int h = 0; h < D / hd; h++) {
            const char *  row0 = (const char *) mine.data() + h * (hd / 64) * bs;
            kvq::row_geo  g;
            const bool    ok = kvq::row_geo_of(a, row0, (int64_t) row_bytes, 0, hd / 64, &g);
            CHECK(ok, "%s %s: row_geo_of refused the head rows of %d values", ti->ggml_name, what, hd);
            for (int r = 0; ok && r < N_ROWS; r++) {
                const float * sk = kvq::row_sink(a, g, r, 0);
                for (int c = 0; c < hd; c++) {
                    const char * blk = row0 + r * row_bytes + c / 64 * bs;
                    uint16_t     w[4];
                    kvq::block_words(a, blk, w);
                    const float v = sk ? sk[c] : kvq::block_value(a, a.values, g.ch0 + c / 64 * 64, blk, w, c % 64);
                    const float e = kvq::dequantize_value(a, blk, c % 64);
                    gdiff += std::memcmp(&v, &e, 4) != 0;
                    if (!sk) {
                        const float b = kvq::block_value(a, a.values, a.row_blocks > 0 ? kvq::key_channel0(a, blk) : 0, blk, w,
                                                         c % 64);
                        gdiff += std::memcmp(&b, &e, 4) != 0;
                    }
                    n_geo++;
                }
                // the lane kernel's V reader (kvq::lane_load, lane_values): lane l's values l and l + 32 of each
                // block of the head row, the keys' channel scales by channel (zeros for values)
                static const float zeros[64] = {};
                for (int lane = 0; !sk && lane < 32; lane++) {
                    for (int j = 0; j < hd / 64; j++) {
                        const char *  blk  = row0 + r * row_bytes + j * bs;
                        const bool    key  = a.row_blocks > 0;
                        const float * mid  = key ? a.k_mid + g.ch0 + 64 * j : zeros;
                        const float * half = key ? a.k_half + g.ch0 + 64 * j : zeros;
                        float         out[2];
                        kvq::lane_values(a, a.values, kvq::lane_load(a, blk, lane), lane, mid, half, out);
                        for (int hh = 0; hh < 2; hh++) {
                            const float e = kvq::dequantize_value(a, blk, lane + 32 * hh);
                            ldiff += std::memcmp(&out[hh], &e, 4) != 0;
                            n_lane++;
                        }
                    }
                }
            }
        }
    }
    CHECK(gdiff == 0 && n_geo == 2 * N_ROWS * D, "%s %s outliers %d sink %d bound %d: the row reader differs at %lld of "
          "%lld values", ti->ggml_name, what, outliers, n_sink, bound, (long long) gdiff, (long long) n_geo);
    CHECK(ldiff == 0 && n_lane > 0, "%s %s outliers %d sink %d bound %d: the lane reader differs at %lld of %lld values",
          ti->ggml_name, what, outliers, n_sink, bound, (long long) ldiff, (long long) n_lane);
    n_lane_total += n_lane;
    // strides that are not whole cache rows (keys' channels, sink rows): refused, the kernel reads value by value
    if (a.row_blocks > 0 || a.sink) {
        kvq::row_geo g;
        CHECK(!kvq::row_geo_of(a, (const char *) mine.data(), (int64_t) (row_bytes + bs), 0, 1, &g) &&
                  !kvq::row_geo_of(a, (const char *) mine.data() + bs, (int64_t) row_bytes, 0, D / 64, &g),
              "%s %s: row_geo_of took strides or a head row it cannot read", ti->ggml_name, what);
    }
    *n_geo_checked += n_geo;
    if (bound) {
        ggml_ext_kvquant_unbind(ref.data());
    }
}

// The kernels' per-thread bodies (kvq::quantize_at / dequantize_at: the index arithmetic of SET_ROWS, CPY and GET_ROWS
// over ggml's shapes and strides) on the host against ggml's CPU ops on the same bound caches: SET_ROWS of 7 rows
// from a strided source into scattered cells, the flash-attention V view ([64, cells, 2 heads], permuted) and the K
// path's 4-D view cast to f32, GET_ROWS of 5 cells; the key cache per channel or block-scaled (kblock).
static kvq::shape4 shape_of(const ggml_tensor * t) {
    kvq::shape4 s;
    for (int i = 0; i < 4; i++) {
        s.ne[i] = t->ne[i];
        s.nb[i] = t->nb[i];
    }
    return s;
}

static void check_ops(int type, bool outliers, int n_sink, bool kblock) {
    const ggml_ext_type_info * ti = ggml_ext_type_info_by_id(type);
    const int DV = 128, DK = 192, NC = 33, NW = 7;
    std::mt19937 gen(77 + type * 10 + outliers * 3 + n_sink + 5 * kblock);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int n = 1 << ti->layout;
    float     levels[16] = {}, values[16] = {};
    for (int i = 0; i < n; i++) {
        levels[i] = values[i] = -1.0f + 2.0f * i / (n - 1);
    }
    std::vector<float> mid(DK), half(DK);
    for (int c = 0; c < DK; c++) {
        mid[c] = 0.2f * u(gen), half[c] = 0.7f + 0.2f * u(gen);
    }
    ggml_backend_t   be = ggml_backend_cpu_init();
    ggml_init_params ip = { 64 * ggml_tensor_overhead() + 2 * ggml_graph_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor * v    = ggml_new_tensor_2d(ctx, (ggml_type) type, DV, NC);
    ggml_tensor * k    = ggml_new_tensor_2d(ctx, (ggml_type) type, DK, NC);
    ggml_tensor * srcv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, DV + 64, NW);  // rows wider than written: a strided view
    ggml_tensor * srck = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, DK + 64, NW);
    ggml_tensor * idx  = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, NW);
    ggml_tensor * gi   = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 5);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_buffer_clear(buf, 0);
    char err[256] = "";
    CHECK(ggml_ext_kvquant_bind_opts(v->data, ggml_nbytes(v), type, DV, levels, values, nullptr, nullptr, outliers, n_sink,
                                     err, sizeof(err)) == 0, "bind v: %s", err);
    CHECK(ggml_ext_kvquant_bind_opts(k->data, ggml_nbytes(k), type, DK, levels, values, mid.data(), half.data(), outliers,
                                     n_sink, err, sizeof(err)) == 0, "bind k: %s", err);
    CHECK(!kblock || ggml_ext_kvquant_key_blocks(k->data, 1) == 0, "key_blocks");
    std::vector<int64_t> cells = { 5, 31, 0, 17, 2, 29, 11 };
    std::vector<int32_t> pos   = { 0, 40, 41, 42, 43, 44, 45 };  // cell 5 holds position 0: a sink row with n_sink
    std::vector<uint32_t> uc(cells.begin(), cells.end());
    ggml_ext_kvquant_rows_written(v->data, v->nb[1], uc.data(), pos.data(), NW);
    ggml_ext_kvquant_rows_written(k->data, k->nb[1], uc.data(), pos.data(), NW);
    for (ggml_tensor * t : { srcv, srck }) {
        std::vector<float> x(ggml_nelements(t));
        for (auto & e : x) {
            e = u(gen) * (std::fabs(u(gen)) > 0.97f ? 4.0f : 1.0f);
        }
        std::memcpy(t->data, x.data(), ggml_nbytes(t));
    }
    std::memcpy(idx->data, cells.data(), NW * sizeof(int64_t));
    const int32_t g5[5] = { 17, 5, 3, 29, 5 };
    std::memcpy(gi->data, g5, sizeof(g5));
    ggml_tensor * sv = ggml_view_2d(ctx, srcv, DV, NW, srcv->nb[1], 0);
    ggml_tensor * sk = ggml_view_2d(ctx, srck, DK, NW, srck->nb[1], 0);
    // the CPU's ops
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, ggml_set_rows(ctx, v, sv, idx));
    ggml_build_forward_expand(gf, ggml_set_rows(ctx, k, sk, idx));
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS, "set_rows");
    ggml_tensor * vview = ggml_permute(ctx, ggml_view_3d(ctx, v, 64, 2, NC, ggml_row_size(v->type, 64), v->nb[1], 0), 0, 2, 1, 3);
    ggml_tensor * kview = ggml_view_4d(ctx, k, 64, 3, NC, 1, ggml_row_size(k->type, 64), k->nb[1], k->nb[1] * NC, 0);
    ggml_tensor * outs[3] = { ggml_cast(ctx, vview, GGML_TYPE_F32), ggml_cast(ctx, kview, GGML_TYPE_F32),
                              ggml_get_rows(ctx, k, gi) };
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
    ggml_cgraph *  g2 = ggml_new_graph(ctx);
    for (ggml_tensor * o : outs) {
        ggml_set_output(o);
        ggml_build_forward_expand(g2, o);
    }
    CHECK(ggml_gallocr_alloc_graph(ga, g2), "alloc");
    CHECK(ggml_backend_graph_compute(be, g2) == GGML_STATUS_SUCCESS, "cpy / get_rows");
    // the kernels' bodies on shadows of the caches (zeros, as the cleared buffers), with the bindings' arguments
    for (ggml_tensor * cache : { v, k }) {
        std::vector<char> shadow(ggml_nbytes(cache), 0);
        ggml_ext_kvquant_binding_desc d;
        ggml_ext_kvquant_binding_find(cache->data, type, &d);
        kvq::kvq_args a = {};
        a.bits = d.bits, a.block_bytes = (int) d.block_bytes, a.dense_bytes = 64 * d.bits / 8;
        std::memcpy(a.values, d.values, sizeof(a.values));
        std::memcpy(a.mids, d.mids, sizeof(a.mids));
        a.lo = shadow.data(), a.row_blocks = d.row_blocks, a.k_mid = d.k_mid, a.k_half = d.k_half;
        a.outliers = d.outliers, a.k_block = d.k_block, a.row_values = d.row_values;
        CHECK(d.k_block == (int) (kblock && cache == k), "the binding's k_block %d", d.k_block);
        std::vector<int64_t> sink(1 + std::max(d.sink_cap, 0), 0);
        std::vector<float>   sink_data((size_t) std::max(d.sink_cap, 0) * d.row_values);
        if (d.n_sink > 0) {
            sink[0] = ggml_ext_kvquant_binding_sinks(d.lo, d.serial, sink.data() + 1, d.sink_cap);
            a.sink = sink.data(), a.sink_data = sink_data.data(), a.row_bytes = (int64_t) cache->nb[1];
        }
        ggml_tensor * src = cache == v ? sv : sk;
        const kvq::shape4 ss = shape_of(src), ds = shape_of(cache), is = shape_of(idx);
        for (int64_t t = 0; t < src->ne[0] / 64 * src->ne[1]; t++) {
            kvq::quantize_at<int64_t>(t, (const char *) src->data, ss, shadow.data(), ds, (const char *) idx->data, is, true, a);
        }
        CHECK(std::memcmp(shadow.data(), cache->data, shadow.size()) == 0, "%s %s%s: SET_ROWS bytes differ", ti->ggml_name,
              cache == v ? "V" : "K", kblock ? " (block-scaled)" : "");
        // reads
        std::vector<ggml_tensor *> reads = cache == v ? std::vector<ggml_tensor *>{ outs[0] }
                                                      : std::vector<ggml_tensor *>{ outs[1], outs[2] };
        for (ggml_tensor * o : reads) {
            const ggml_tensor * s = o->src[0];
            const char *        sp = shadow.data() + ((const char *) s->data - (const char *) cache->data);
            std::vector<float>  y(ggml_nelements(o));
            kvq::shape4         dy = shape_of(o);
            for (int i = 0; i < 4; i++) {
                dy.nb[i] = i == 0 ? sizeof(float) : dy.nb[i - 1] * dy.ne[i - 1];
            }
            const bool gr = o->op == GGML_OP_GET_ROWS;
            for (int64_t t = 0; t < ggml_nelements(o); t++) {
                kvq::dequantize_at<float, int32_t>(t, sp, shape_of(s), (char *) y.data(), dy,
                                                   gr ? (const char *) gi->data : nullptr, shape_of(gi), gr, a);
            }
            int64_t bad = 0;
            for (int64_t i = 0; i < ggml_nelements(o); i++) {
                const float c = ((const float *) o->data)[i];
                bad += !(std::isnan(c) && std::isnan(y[i])) && std::memcmp(&c, &y[i], 4) != 0;
            }
            CHECK(bad == 0, "%s %s%s %s: %lld values differ", ti->ggml_name, cache == v ? "V" : "K",
                  kblock ? " (block-scaled)" : "", ggml_op_desc(o), (long long) bad);
        }
    }
    ggml_ext_kvquant_unbind(v->data);
    ggml_ext_kvquant_unbind(k->data);
    ggml_gallocr_free(ga);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(be);
}

int main() {
    ggml_cpu_init();
    for (const char * name : { "nuq4", "nuq3", "nuq2" }) {
        const int type    = ggml_ext_kv_cache_type_by_name(name);
        int       n_slots = 0, cases = 0;
        int kb_slots = 0;
        for (int kind = 0; kind < 3; kind++) {  // values, keys per channel, block-scaled keys
            for (int outliers = 0; outliers < 2; outliers++) {
                for (int sink = 0; sink < 2; sink++) {
                    check(type, kind > 0, kind == 2, outliers, sink, true, kind == 2 ? &kb_slots : &n_slots);
                    cases++;
                }
            }
        }
        CHECK(kb_slots > 0, "%s: no outlier slot written in a block-scaled key cache", name);
        n_slots += kb_slots;
        check(type, false, false, false, 0, false, &n_slots);  // outside every binding: uniform levels
        cases++;
        CHECK(n_slots > 0, "%s: no outlier slot written", name);
        std::printf("%s: %d cases checked (%d outlier slots, %d in block-scaled keys)\n", name, cases, n_slots, kb_slots);
        for (int kblock = 0; kblock < 2; kblock++) {
            for (int outliers = 0; outliers < 2; outliers++) {
                for (int sink = 0; sink < 2; sink++) {
                    check_ops(type, outliers, sink, kblock);
                }
            }
        }
        std::printf("%s: SET_ROWS / CPY of views / GET_ROWS checked against ggml's CPU ops (8 settings, 4 with "
                    "block-scaled keys)\n", name);
    }
    std::printf("the decode op's row reader: %lld values, the bits of dequantize_value\n", (long long) n_geo_total);
    std::printf("the decode op's lane reader: %lld values, the bits of dequantize_value\n", (long long) n_lane_total);
    std::printf("%s: %d failures\n", fails ? "FAIL" : "OK", fails);
    return fails ? 1 : 0;
}
