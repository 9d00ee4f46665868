// The KVQuant decode op's CUDA pieces (ggml_ext/src/cuda/kvquant_attn_decode.cuh: what the table and partial kernels of
// kvquant_attn_cuda.cu run per cell and per dimension) on the host against the CPU: for NUQ4 / NUQ3 / NUQ2 key caches
// bound with per-channel scales and outlier slots, head dims 64 / 128 / 256, normal and NEOX RoPE (n_dims < hd
// once, YaRN with freq factors once), with and without a K norm:
//   table  kva::table_row of every cell's position (up to ~10^5 radians) against the table node of the CPU op
//          (backend/kvquant_attn_cpu.c's rope_table_fn, through ggml_ext_kvquant_attn): within 2 ulp of mscale, most bit-equal (YaRN:
//          plus 2 ulp of the largest angle, positions up to ~10^3: the CPU's compiler may fuse the ramp's blend);
//   keys   kva::row_value (kvq::dequantize_value), norm_scale / norm_apply and rope_at against ggml's CPU ops on the
//          same bound cache: ggml_cast to F32 (the type's to_float), rms_norm * w, rope_ext at the cells'
//          positions: within 2e-6 of the largest |k| (YaRN: plus the table's tolerance).
//   heads  kva::head_geo_of (k_lanes's per-head row geometry, found once at the launch) against kvq::row_geo_of per
//          head, with and without sink rows, and views both refuse.
// Host code only: built with nvcc and run without a GPU by tests/cuda/test_kvattn_cuda.py. The kernels on a GPU
// against the CPU op: tests/c/test_kvattn_cuda.cpp.
#include "ggml-cpu.h"
#include "ggml-ext-kvquant.h"
#include "ggml-ext.h"
#include "ggml.h"
#include "backend/kvquant_device.h"
#include "kvquant_attn_decode.cuh"
#include "kvq_check.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>



struct cfg {
    const char * type;
    int          hd, n_hkv, mode, n_dims, norm, yarn;
};

// kva::lane_key_dots of the key head row at krow (its blocks' bytes as the kernel's words), 4 queries
template <int HD, int BITS>
static void lane_dots_t(bool neox, const kvq::kvq_args & a, const char * krow, const float * half, const float * mid,
                        const float * nw, const float * cs, const float * q, float * dot, float * ss) {
    constexpr int  NB = HD / kvq::QK, BW = kva::key_words<BITS>();
    uint32_t       w[NB][BW];
    kva::key_block kb[NB];
    for (int j = 0; j < NB; j++) {
        std::memcpy(w[j], krow + j * a.block_bytes, sizeof(w[j]));
        kb[j] = kva::key_block_of(a, w[j][BW - 2], w[j][BW - 1]);
    }
    neox ? kva::lane_key_dots<HD, BITS, 4, true>(w, kb, a.values, half, mid, nw, (const float4 *) cs, q, dot, ss) :
           kva::lane_key_dots<HD, BITS, 4, false>(w, kb, a.values, half, mid, nw, (const float4 *) cs, q, dot, ss);
}

template <int HD>
static void lane_dots_hd(bool neox, int bits, const kvq::kvq_args & a, const char * krow, const float * half,
                         const float * mid, const float * nw, const float * cs, const float * q, float * dot, float * ss) {
    bits == 2 ? lane_dots_t<HD, 2>(neox, a, krow, half, mid, nw, cs, q, dot, ss) :
    bits == 3 ? lane_dots_t<HD, 3>(neox, a, krow, half, mid, nw, cs, q, dot, ss) :
                lane_dots_t<HD, 4>(neox, a, krow, half, mid, nw, cs, q, dot, ss);
}

static void lane_dots(bool neox, int bits, int hd, const kvq::kvq_args & a, const char * krow, const float * half,
                      const float * mid, const float * nw, const float * cs, const float * q, float * dot, float * ss) {
    hd == 64  ? lane_dots_hd<64>(neox, bits, a, krow, half, mid, nw, cs, q, dot, ss) :
    hd == 128 ? lane_dots_hd<128>(neox, bits, a, krow, half, mid, nw, cs, q, dot, ss) :
                lane_dots_hd<256>(neox, bits, a, krow, half, mid, nw, cs, q, dot, ss);
}

static void check(const cfg & c) {
    const int                  type = ggml_ext_kv_cache_type_by_name(c.type);
    const ggml_ext_type_info * ti   = ggml_ext_type_info_by_id(type);
    const int                  bits = ti->layout, hd = c.hd, D = hd * c.n_hkv, n_cells = 37;
    std::mt19937               gen(100 * hd + 10 * c.norm + c.yarn + bits);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    float                      levels[16] = {}, values[16] = {};
    random_table(gen, bits, levels, values);
    std::vector<float> mid(D), half(D);
    random_scales(gen, mid, half);

    ggml_init_params ip  = { 64u << 20, nullptr, false };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    K   = ggml_new_tensor_2d(ctx, (ggml_type) type, D, n_cells);
    char             err[256] = "";
    CHECK(ggml_ext_kvquant_bind_opts(K->data, ggml_nbytes(K), type, D, levels, values, mid.data(), half.data(), 1, 0, err,
                                     sizeof(err)) == 0,
          "bind: %s", err);
    const ggml_type_traits * tr = ggml_get_type_traits((ggml_type) type);
    std::vector<float>       x(D);
    for (int r = 0; r < n_cells; r++) {
        for (int i = 0; i < D; i++) {
            const float v = u(gen);
            x[i]          = mid[i] + half[i] * (std::fabs(v) > 0.96f ? 3.0f * v : 0.9f * v);
        }
        tr->from_float_ref(x.data(), (char *) K->data + r * K->nb[1], D);
    }
    ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_cells);
    for (int r = 0; r < n_cells; r++) {
        ((int32_t *) pos->data)[r] = r * (c.yarn ? 27 : 2711) + 3;  // up to ~10^5 radians (YaRN: ~10^3, below)
    }
    ggml_tensor * ff = c.yarn ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.n_dims / 2) : nullptr;
    ggml_tensor * w  = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, hd);
    for (int i = 0; i < hd; i++) {
        ((float *) w->data)[i] = 1.0f + 0.5f * u(gen);
    }
    if (ff) {
        for (int i = 0; i < c.n_dims / 2; i++) {
            ((float *) ff->data)[i] = 1.0f + 3.0f * std::fabs(u(gen));
        }
    }
    const float       eps  = 1e-6f;
    ggml_ext_kvquant_rope rope = { c.mode, c.n_dims, 4096, 10000.0f, c.yarn ? 0.25f : 1.0f, c.yarn ? 1.0f : 0.0f, 1.0f, 32.0f,
                               1.0f };
    // ggml's path: to_float, rms_norm * w, rope_ext
    ggml_tensor * kv = ggml_view_3d(ctx, K, hd, c.n_hkv, n_cells, ggml_row_size(K->type, hd), K->nb[1], 0);
    ggml_tensor * kf = ggml_cast(ctx, kv, GGML_TYPE_F32);
    if (c.norm) {
        kf = ggml_mul(ctx, ggml_rms_norm(ctx, kf, eps), w);
    }
    ggml_tensor * kr = ggml_rope_ext(ctx, kf, pos, ff, rope.n_dims, rope.mode, rope.n_ctx_orig, rope.freq_base,
                                     rope.freq_scale, rope.ext_factor, rope.attn_factor, rope.beta_fast, rope.beta_slow);
    // the CPU op (for its table node)
    ggml_tensor * q    = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, c.n_hkv, 1);
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_cells, 1);
    std::memset(q->data, 0, ggml_nbytes(q));
    std::memset(mask->data, 0, ggml_nbytes(mask));
    ggml_tensor * k4  = ggml_view_4d(ctx, K, hd, c.n_hkv, n_cells, 1, ggml_row_size(K->type, hd), K->nb[1],
                                     K->nb[1] * n_cells, 0);
    char          why[160] = "";
    ggml_tensor * out = ggml_ext_kvquant_attn(ctx, q, k4, k4, mask, pos, ff, &rope, c.norm ? w : nullptr, eps, 1.0f, 0, why,
                                              sizeof(why));
    CHECK(out != nullptr, "ggml_ext_kvquant_attn: %s", why);
    if (!out) {
        ggml_free(ctx);
        return;
    }
    ggml_tensor * tab = out->src[0]->src[4];
    CHECK(ggml_ext_kvquant_attn_node_kind(tab) == GGML_EXT_KVQUANT_ATTN_TABLE && ggml_ext_kvquant_attn_node_kind(out->src[0]) ==
                                                                         GGML_EXT_KVQUANT_ATTN_PARTIAL &&
              ggml_ext_kvquant_attn_node_kind(out) == GGML_EXT_KVQUANT_ATTN_COMBINE && ggml_ext_kvquant_attn_node_kind(kr) == 0,
          "node kinds");
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, kr);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, 1);

    // the kernels' arguments, as kvquant_attn_cuda.cu gets them (kvquant_cuda.cu's args_for), on host memory
    ggml_ext_kvquant_binding_desc d;
    CHECK(ggml_ext_kvquant_binding_find(K->data, type, &d) && d.lo, "find");
    kvq::kvq_args a = {};
    a.bits = d.bits, a.block_bytes = (int) d.block_bytes, a.dense_bytes = 64 * d.bits / 8;
    std::memcpy(a.values, d.values, sizeof(a.values));
    std::memcpy(a.mids, d.mids, sizeof(a.mids));
    a.lo = d.lo, a.row_blocks = d.row_blocks, a.k_mid = d.k_mid, a.k_half = d.k_half, a.outliers = d.outliers;
    a.row_values = d.row_values;
    // the table's arguments, as kvquant_attn_cuda.cu's launch_table takes them
    const kva::table_args ta = kva::table_args_of(rope);

    int64_t            tab_equal = 0, tab_n = 0;
    double             tab_max = 0, key_max = 0, ref_max = 0;
    int64_t            lane_diff = 0, lane_n = 0;
    std::vector<float> row(rope.n_dims), kd(hd);
    for (int r = 0; r < n_cells; r++) {
        kva::table_row(ta, ((const int32_t *) pos->data)[r], ff ? (const float *) ff->data : nullptr, row.data());
        const float * cpu = (const float *) tab->data + (size_t) r * rope.n_dims;
        for (int i = 0; i < rope.n_dims; i++) {
            tab_equal += row[i] == cpu[i];
            tab_n++;
            tab_max = std::max(tab_max, (double) std::fabs(row[i] - cpu[i]));
        }
        for (int h = 0; h < c.n_hkv; h++) {
            const char * krow = (const char *) K->data + r * K->nb[1] + h * ggml_row_size(K->type, hd);
            double       ss   = 0.0;
            for (int i = 0; i < hd; i++) {
                kd[i] = kva::row_value(kva::ROW_NUQ, a, krow, i);
                const volatile float sq = kd[i] * kd[i];  // rounded to float, as the kernel's __fmul_rn
                ss += (double) sq;
            }
            if (c.norm) {
                const float sc = kva::norm_scale(ss, hd, eps);
                for (int i = 0; i < hd; i++) {
                    kd[i] = kva::norm_apply(kd[i], sc, ((const float *) w->data)[i]);
                }
            }
            // the lane kernel's key score (k_lanes, n_dims == hd): lane_key_dots from the row's words and
            // float_key_dots from its floats, times the K norm's scale, against the dots of rope_at's key with
            // random queries
            if (rope.n_dims == hd) {
                std::vector<float> qv(4 * hd), ones(hd, 1.0f), kraw(hd);
                for (auto & e : qv) {
                    e = u(gen);
                }
                for (int i = 0; i < hd; i++) {
                    kraw[i] = kva::row_value(kva::ROW_NUQ, a, krow, i);
                }
                float ref_dot[4] = {}, ref_mag[4] = {};
                for (int qi = 0; qi < 4; qi++) {
                    for (int i = 0; i < hd; i++) {
                        const float y = kva::rope_at(rope.mode, rope.n_dims, kd.data(), row.data(), i);
                        ref_dot[qi] += qv[qi * hd + i] * y;
                        ref_mag[qi] += std::fabs(qv[qi * hd + i] * y);
                    }
                }
                std::vector<float> half_c(hd), mid_c(hd);
                const int64_t      ch0 = kvq::key_channel0(a, krow);
                for (int i = 0; i < hd; i++) {
                    half_c[i] = a.k_half[ch0 + i], mid_c[i] = a.k_mid[ch0 + i];
                }
                const float * nw = c.norm ? (const float *) w->data : ones.data();
                float         dw[4], df[4], sw = 0, sf = 0;
                lane_dots(c.mode == GGML_ROPE_TYPE_NEOX, bits, hd, a, krow, half_c.data(), mid_c.data(), nw, row.data(),
                          qv.data(), dw, &sw);
                const bool neox = c.mode == GGML_ROPE_TYPE_NEOX;
                hd == 64  ? kva::float_key_dots<64, 4>(kraw.data(), nw, neox, row.data(), qv.data(), df, &sf) :
                hd == 128 ? kva::float_key_dots<128, 4>(kraw.data(), nw, neox, row.data(), qv.data(), df, &sf) :
                            kva::float_key_dots<256, 4>(kraw.data(), nw, neox, row.data(), qv.data(), df, &sf);
                const float scw = c.norm ? kva::norm_scale((double) sw, hd, eps) : 1.0f;
                const float scf = c.norm ? kva::norm_scale((double) sf, hd, eps) : 1.0f;
                for (int qi = 0; qi < 4; qi++) {
                    const double tol = 1e-5 * ref_mag[qi] + 1e-30;
                    lane_diff += std::fabs(dw[qi] * scw - ref_dot[qi]) > tol;
                    lane_diff += std::fabs(df[qi] * scf - ref_dot[qi]) > tol;
                    lane_n += 2;
                }
            }
            const float * ref = (const float *) ((const char *) kr->data + r * kr->nb[2] + h * kr->nb[1]);
            for (int i = 0; i < hd; i++) {
                const float y = kva::rope_at(rope.mode, rope.n_dims, kd.data(), row.data(), i);
                key_max       = std::max(key_max, (double) std::fabs(y - ref[i]));
                ref_max       = std::max(ref_max, (double) std::fabs(ref[i]));
            }
        }
    }
    // 2 ulp of mscale; with YaRN the CPU's compiler may fuse the blend th (1 - mix) + extrap mix (one rounding of an
    // angle up to ~10^3 rad less): 2 ulp of the largest angle more, and its effect on the keys
    const double pos_max = (double) ((const int32_t *) pos->data)[n_cells - 1];
    const double tab_tol = ta.mscale * (2.0 * FLT_EPSILON + (c.yarn ? 2.0 * FLT_EPSILON * pos_max : 0.0));
    const double key_tol = 2e-6 * ref_max + (c.yarn ? 2.0 * tab_tol * ref_max : 0.0);
    CHECK(tab_max <= tab_tol, "%s hd %d: table differs by %g (> %g)", c.type, hd, tab_max, tab_tol);
    CHECK(key_max <= key_tol, "%s hd %d: roped keys differ by %g (largest |k| %g)", c.type, hd, key_max, ref_max);
    if (rope.n_dims == hd) {
        CHECK(lane_diff == 0 && lane_n == (int64_t) n_cells * c.n_hkv * 8,
              "%s hd %d: the lane kernel's key dots differ from rope_at's at %lld of %lld", c.type, hd,
              (long long) lane_diff, (long long) lane_n);
        std::printf("%s hd %d: lane key dots %lld of %lld within 1e-5 of rope_at's\n", c.type, hd,
                    (long long) (lane_n - lane_diff), (long long) lane_n);
    }
    std::printf("%s hd %d %s n_dims %d%s%s: table %lld of %lld bit-equal (max diff %.3g), keys max diff %.3g of |k| %.3g\n",
                c.type, hd, c.mode == 2 ? "neox" : "normal", c.n_dims, c.norm ? " +knorm" : "", c.yarn ? " yarn+ff" : "",
                (long long) tab_equal, (long long) tab_n, tab_max, key_max, ref_max);
    ggml_ext_kvquant_unbind(K->data);
    ggml_free(ctx);
}

static bool same(const kvq::row_geo & a, const kvq::row_geo & b) {
    return a.ch0 == b.ch0 && a.row0 == b.row0 && a.off == b.off && a.d_cell == b.d_cell && a.d_stream == b.d_stream;
}

// kva::head_geo_of (what k_lanes's launch passes its blocks) against kvq::row_geo_of per head: a bound key cache of
// n_hkv heads side by side in rows of D = hd * n_hkv values, cells and streams as the cache's views stride them,
// with and without sink rows: every head it takes has row_geo_of's geometry; it refuses heads past the cache row
// that break the even step, and a cell stride that is not whole cache rows
static void check_head_geo(const char * type_name, int hd, int n_hkv) {
    const int                  type = ggml_ext_kv_cache_type_by_name(type_name);
    const ggml_ext_type_info * ti   = ggml_ext_type_info_by_id(type);
    const int                  bits = ti->layout, D = hd * n_hkv, n_cells = 8, n_streams = 3;
    std::mt19937               gen(7 * hd + n_hkv);
    float                      levels[16] = {}, values[16] = {};
    random_table(gen, bits, levels, values);
    std::vector<float> mid(D), half(D);
    random_scales(gen, mid, half);
    ggml_init_params ip  = { 16u << 20, nullptr, false };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    K   = ggml_new_tensor_2d(ctx, (ggml_type) type, D, n_cells * n_streams);
    char             err[256] = "";
    CHECK(ggml_ext_kvquant_bind_opts(K->data, ggml_nbytes(K), type, D, levels, values, mid.data(), half.data(), 1, 0, err,
                                     sizeof(err)) == 0,
          "bind: %s", err);
    ggml_ext_kvquant_binding_desc d;
    CHECK(ggml_ext_kvquant_binding_find(K->data, type, &d) && d.lo, "find");
    kvq::kvq_args a = {};
    a.bits = d.bits, a.block_bytes = (int) d.block_bytes, a.lo = d.lo, a.row_blocks = d.row_blocks;
    const int64_t nb1 = ggml_row_size(K->type, hd), nb2 = K->nb[1], nb3 = K->nb[1] * n_cells;
    const int     nb  = hd / 64;
    int64_t       sink_marks[2] = { 0, -1 };
    for (int with_sink = 0; with_sink < 2; with_sink++) {
        a.sink      = with_sink ? sink_marks : nullptr;
        a.row_bytes = with_sink ? K->nb[1] : 0;
        for (int off = 0; off < 2; off++) {  // the view from the first cache row, and from the second
            const char * base = (const char *) K->data + off * nb2;
            // the cache's heads, and one more: that one's rows are the next cache row's first head, whose channels
            // restart at 0, so g0 + h dh no longer holds from three heads on and head_geo_of must refuse
            for (int n = n_hkv; n <= n_hkv + 1; n++) {
                kva::head_geo hg;
                const bool    ok = kva::head_geo_of(a, base, nb1, nb2, nb3, nb, n, &hg);
                CHECK(ok == (n == n_hkv || n < 3), "%s hd %d, %d heads of %d: head_geo_of %s", type_name, hd, n, n_hkv,
                      ok ? "took it" : "refused");
                for (int h = 0; ok && h < n; h++) {
                    kvq::row_geo g;
                    CHECK(kvq::row_geo_of(a, base + h * nb1, nb2, nb3, nb, &g), "row_geo_of refused head %d", h);
                    CHECK(same(g, hg.at(h)), "%s hd %d head %d (sink %d, row %d): at() ch0 %lld row0 %lld off %lld, "
                          "row_geo_of ch0 %lld row0 %lld off %lld", type_name, hd, h, with_sink, off,
                          (long long) hg.at(h).ch0, (long long) hg.at(h).row0, (long long) hg.at(h).off,
                          (long long) g.ch0, (long long) g.row0, (long long) g.off);
                }
            }
            // a cell stride of half a cache row: row_geo_of refuses it, so must head_geo_of
            kva::head_geo hg;
            CHECK(!kva::head_geo_of(a, base, nb1, nb2 / 2, nb3, nb, n_hkv, &hg), "%s: a cell stride of half a row "
                  "was taken", type_name);
        }
    }
    ggml_free(ctx);
}

int main() {
    check_head_geo("nuq3", 64, 3);
    check_head_geo("nuq4", 128, 8);
    check_head_geo("nuq2", 256, 1);
    const cfg cases[] = {
        { "nuq3", 128, 2, GGML_ROPE_TYPE_NEOX, 128, 1, 0 },
        { "nuq4", 64, 1, GGML_ROPE_TYPE_NORMAL, 32, 0, 1 },
        { "nuq2", 256, 1, GGML_ROPE_TYPE_NEOX, 256, 1, 0 },
        { "nuq4", 128, 2, GGML_ROPE_TYPE_NEOX, 96, 0, 1 },
        { "nuq4", 64, 2, GGML_ROPE_TYPE_NORMAL, 64, 0, 0 },
    };
    for (const cfg & c : cases) {
        check(c);
    }
    std::printf("%s: %d failures\n", fails ? "FAIL" : "OK", fails);
    return fails ? 1 : 0;
}
