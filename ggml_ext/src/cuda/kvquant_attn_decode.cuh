// The per-value pieces of the KVQuant decode op's CUDA kernels (kvquant_attn_cuda.cu): a pair of the cos / sin table, a
// value of a K / V row (NUQ through kvq::dequantize_value, F16, F32: the kernels' reading of views that
// kvq::row_geo_of refuses; they read NUQ rows a block at a time through kvq::row_geo_of / block_value, which
// tests/cuda/kvquant_cuda_check.cu holds to dequantize_value's bits), the K norm's scale and product, the RoPE of one
// dimension of a decoded key, and the lane kernel's score of a whole key (lane_key_dots, float_key_dots). __host__
// __device__ and free of ggml-cuda, so tests/cuda/kvattn_cuda_check.cu runs these very functions on the host against
// ggml's CPU table (backend/kvquant_attn_cpu.c) and ggml's to_float, rms_norm, mul and rope_ext. IEEE
// round-to-nearest in both (KVQ_* of kvquant_decode.cuh: ggml-cuda builds with -use_fast_math) except in the key
// score; cos / sin in double, rounded to float (the fast-math cosf would be __cosf, far off at large angles).
#pragma once

#include "ggml-ext-kvquant.h"
#include "ggml.h"
#include "kvquant_decode.cuh"

#include <math.h>

namespace kva {

// the table's arguments, the host-side parts (powf, the YaRN dims, mscale) computed as the CPU computes them
struct table_args {
    int   n_dims;
    float freq_scale, ext_factor, mscale, step, corr0, corr1;
};

// the table's arguments of the model's RoPE (on the host: the CPU's powf and YaRN dims; the kernel launch and
// tests/cuda/kvattn_cuda_check.cu both take them from here)
static inline table_args table_args_of(const ggml_ext_kvquant_rope & r) {
    float corr[2];
    ggml_rope_yarn_corr_dims(r.n_dims, r.n_ctx_orig, r.freq_base, r.beta_fast, r.beta_slow, corr);
    table_args a;
    a.n_dims     = r.n_dims;
    a.freq_scale = r.freq_scale;
    a.ext_factor = r.ext_factor;
    a.mscale     = r.ext_factor != 0.0f ? r.attn_factor * (1.0f + 0.1f * logf(1.0f / r.freq_scale)) : r.attn_factor;
    a.step       = powf(r.freq_base, -2.0f / (float) r.n_dims);
    a.corr0      = corr[0];
    a.corr1      = corr[1];
    return a;
}

// the cos / sin pair j of position pos (row[2 j], row[2 j + 1] of table_row): the angle stepped j times from pos as
// the CPU steps it, so a thread per pair (kvquant_attn_cuda.cu's k_table) gives table_row's floats
KVQ_HD void table_pair(const table_args & r, int32_t pos, const float * ff, int j, float * cs) {
    float theta = (float) pos;
    for (int i = 0; i < j; i++) {
        theta = KVQ_MUL(theta, r.step);
    }
    const float extrap = ff ? KVQ_DIV(theta, ff[j]) : theta;
    float       th     = KVQ_MUL(r.freq_scale, extrap);
    if (r.ext_factor != 0.0f) {
        const float y   = KVQ_DIV(KVQ_SUB((float) j, r.corr0), fmaxf(0.001f, KVQ_SUB(r.corr1, r.corr0)));
        const float mix = KVQ_MUL(KVQ_SUB(1.0f, fminf(1.0f, fmaxf(0.0f, y))), r.ext_factor);
        th              = KVQ_ADD(KVQ_MUL(th, KVQ_SUB(1.0f, mix)), KVQ_MUL(extrap, mix));
    }
    cs[0] = KVQ_MUL((float) cos((double) th), r.mscale);
    cs[1] = KVQ_MUL((float) sin((double) th), r.mscale);
}

// the cos / sin row (pair-interleaved, n_dims floats) of position pos: backend/kvquant_attn_cpu.c's rope_table_fn
KVQ_HD void table_row(const table_args & r, int32_t pos, const float * ff, float * row) {
    for (int j = 0; j < r.n_dims / 2; j++) {
        table_pair(r, pos, ff, j, row + 2 * j);
    }
}

// how a K or V row is stored
enum row_kind { ROW_NUQ = 0, ROW_F16 = 1, ROW_F32 = 2 };

// value d of the row at p (a NUQ row: the binding's per-channel scales, outlier slots and sink rows; value by value,
// the kernels' reading where kvq::row_geo_of refuses a view: they read whole rows with kvq's row reader)
KVQ_HD float row_value(row_kind kind, const kvq::kvq_args & a, const char * p, int d) {
    if (kind == ROW_F32) {
        return ((const float *) p)[d];
    }
    if (kind == ROW_F16) {
        return kvq::h2f(((const uint16_t *) p)[d]);
    }
    return kvq::dequantize_value(a, p + (d / kvq::QK) * a.block_bytes, d % kvq::QK);
}

// the K norm: 1 / sqrt(mean + eps) from the sum of the squares (accumulated in double), as ggml's rms_norm
KVQ_HD float norm_scale(double ss, int hd, float eps) {
    const float mean = (float) (ss / (double) hd);
#ifdef __CUDA_ARCH__
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
#else
    return KVQ_DIV(1.0f, sqrtf(KVQ_ADD(mean, eps)));
#endif
}

// a normalised value: (x * scale) * w, as ggml's rms_norm then mul
KVQ_HD float norm_apply(float x, float scale, float w) {
    return KVQ_MUL(KVQ_MUL(x, scale), w);
}

// dimension d of the roped key whose decoded (and normalised) values are kr, cs its cell's table row
KVQ_HD float rope_at(int mode, int n_dims, const float * kr, const float * cs, int d) {
    if (d >= n_dims) {
        return kr[d];
    }
    const int h2 = n_dims / 2;
    int       j, i0, i1;
    bool      first;
    if (mode == 2 /* GGML_ROPE_TYPE_NEOX */) {
        j = d < h2 ? d : d - h2, i0 = j, i1 = j + h2, first = d < h2;
    } else {
        j = d / 2, i0 = 2 * j, i1 = 2 * j + 1, first = d % 2 == 0;
    }
    const float a = kr[i0], b = kr[i1], co = cs[2 * j], si = cs[2 * j + 1];
    return first ? KVQ_SUB(KVQ_MUL(a, co), KVQ_MUL(b, si)) : KVQ_ADD(KVQ_MUL(a, si), KVQ_MUL(b, co));
}

// ---- the lane-per-cell key score (kvquant_attn_cuda.cu's k_lanes) ----
// Lane l of a warp scores the key of one cell against the block's queries, as upstream's flash-attention vector kernel
// gives a thread a key: the cell's K head row held in registers as 32-bit words (HD / 64 blocks of key_words<BITS>
// words: the index bytes little-endian, then the trailer's two words), every value decoded from them, the K norm's
// weights applied, roped with the cell's table row and dotted with each query, with no exchange between lanes. The
// K norm is linear in the key, so its scale multiplies the dot: dot_i * norm_scale(ss) is query i's score before the
// softmax scale. The sums run in another order than the CPU's (products fused into additions): within 1e-6 NMSE of
// the CPU op (tests/cuda/kvattn_cuda_check.cu: lane_key_dots against rope_at on the decoded rows).

template <int BITS> KVQ_HD constexpr int key_words() {
    return (kvq::QK * BITS / 8 + 8) / 4;  // a block's index bytes and trailer, in 32-bit words
}

// kvq::get_index of channel c of the block whose bytes are the words w (c a constant where the kernel unrolls)
template <int BITS> KVQ_HD int word_index(const uint32_t * w, int c) {
    if (BITS == 4) {
        const int b = c % 32;
        return (int) (w[b / 4] >> (8 * (b % 4) + 4 * (c / 32))) & 15;
    }
    const int b = c % 16;
    int       v = (int) (w[b / 4] >> (8 * (b % 4) + 2 * (c / 16))) & 3;
    if (BITS == 3) {
        const int hb = c % 8;
        v |= (int) ((w[4 + hb / 4] >> (8 * (hb % 4) + c / 8)) & 1) << 2;
    }
    return v;
}

// what a block's trailer words t0 (words 0, 1) and t1 (words 2, 3) say of its values: y = (t a + b) half_c + mid_c
// (per-channel keys: a = 1, b = 0; block-scaled keys and value-like rows: the block's half / mid, then the channel's,
// which are 1 / 0 for rows without channel scales), then the slots over it: channel o2 is v2, else channel o0 is v0
// (per-channel keys only; -1: no slot); kvq::lane_value's reading
struct key_block {
    float a, b, v0, v2;
    int   o0, o2;
};

KVQ_HD key_block key_block_of(const kvq::kvq_args & a, uint32_t t0, uint32_t t1) {
    const unsigned w0 = t0 & 0xffffu, w1 = t0 >> 16, w2 = t1 & 0xffffu, w3 = t1 >> 16;
    const bool     ch = a.row_blocks > 0 && !a.k_block;
    key_block      r;
    r.a  = ch ? 1.0f : kvq::h2f((uint16_t) w1);
    r.b  = ch ? 0.0f : kvq::h2f((uint16_t) w0);
    r.o0 = ch && kvq::is_tag(w0) ? (int) (w0 & 63) : -1;
    r.v0 = kvq::h2f((uint16_t) w1);
    r.o2 = kvq::is_tag(w2) ? (int) (w2 & 63) : -1;
    r.v2 = kvq::h2f((uint16_t) w3);
    return r;
}

// One RoPE pair (d1, d2) of a key into its dots with the queries q[i * HD ..] and the sum of its squares s2: the K
// norm's weights nw (ones without a norm), the rotation by (co, si) as rope_at rotates a pair, then each query
template <int HD, int QM>
KVQ_HD void key_pair(float x1, float x2, int d1, int d2, float co, float si, const float * nw, const float * q,
                     float * dot, float & s2) {
    s2 += x1 * x1 + x2 * x2;
    const float u1 = x1 * nw[d1], u2 = x2 * nw[d2];
    const float y1 = u1 * co - u2 * si, y2 = u1 * si + u2 * co;
#pragma unroll
    for (int i = 0; i < QM; i++) {
        dot[i] += q[i * HD + d1] * y1 + q[i * HD + d2] * y2;
    }
}

// The lane's dots of its cell's key with the queries q[i * HD ..] (i < QM; q rows past the block's queries are zeros)
// and the sum of the key's squares: w the row's words, kb their key_block_of, vals the 2^B table, half / mid the
// head's channel scales (1 / 0 without), nw the K norm's weights (ones without: one code path, the fewest registers),
// cs the cell's table row as float4 (pairs 2 j, 2 j + 1), NEOX or normal RoPE over the whole head (n_dims == HD).
template <int HD, int BITS, int QM, bool NEOX>
KVQ_HD void lane_key_dots(const uint32_t (&w)[HD / kvq::QK][key_words<BITS>()], const key_block (&kb)[HD / kvq::QK],
                          const float * vals, const float * half, const float * mid, const float * nw,
                          const float4 * cs, const float * q, float * dot, float * ss) {
    auto value = [&](int d) {
        const int         j = d / kvq::QK, c = d % kvq::QK;
        const key_block & k = kb[j];
        float             y = (vals[word_index<BITS>(w[j], c)] * k.a + k.b) * half[d] + mid[d];
        y                   = c == k.o0 ? k.v0 : y;
        return c == k.o2 ? k.v2 : y;
    };
    float s2 = 0.0f;
#pragma unroll
    for (int i = 0; i < QM; i++) {
        dot[i] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < HD / 2; j++) {
        const int    d1 = NEOX ? j : 2 * j, d2 = NEOX ? j + HD / 2 : 2 * j + 1;
        const float4 c4 = cs[j / 2];
        key_pair<HD, QM>(value(d1), value(d2), d1, d2, j % 2 ? c4.z : c4.x, j % 2 ? c4.w : c4.y, nw, q, dot, s2);
    }
    *ss = s2;
}

// lane_key_dots from a key held as floats x (a sink row): the same pairs, a loop (cs the cell's table row)
template <int HD, int QM>
KVQ_HD void float_key_dots(const float * x, const float * nw, bool neox, const float * cs, const float * q, float * dot,
                           float * ss) {
    float s2 = 0.0f;
    for (int i = 0; i < QM; i++) {
        dot[i] = 0.0f;
    }
    for (int j = 0; j < HD / 2; j++) {
        const int d1 = neox ? j : 2 * j, d2 = neox ? j + HD / 2 : 2 * j + 1;
        key_pair<HD, QM>(x[d1], x[d2], d1, d2, cs[2 * j], cs[2 * j + 1], nw, q, dot, s2);
    }
    *ss = s2;
}

// Every KV head's row geometry (kvq::row_geo_of) as g0 + h * dh: a cache's head rows lie side by side, so their
// channels and sink offsets step by one head row per head. k_lanes's launch finds g0 and dh on the host and checks
// every head against them, so its blocks skip row_geo_of's 64-bit divisions (tests/cuda/kvattn_cuda_check.cu
// checks at(h) against row_geo_of per head).
struct head_geo {
    kvq::row_geo g0, dh;

    __host__ __device__ kvq::row_geo at(int64_t h) const {
        return { g0.ch0 + h * dh.ch0, g0.row0 + h * dh.row0, g0.off + h * dh.off, g0.d_cell + h * dh.d_cell,
                 g0.d_stream + h * dh.d_stream };
    }
};

inline bool same_geo(const kvq::row_geo & a, const kvq::row_geo & b) {
    return a.ch0 == b.ch0 && a.row0 == b.row0 && a.off == b.off && a.d_cell == b.d_cell && a.d_stream == b.d_stream;
}

// false: kvq::row_geo_of refuses a head's rows, or the heads do not step evenly (read by k_partial then)
inline bool head_geo_of(const kvq::kvq_args & a, const char * base, int64_t nb1, int64_t nb2, int64_t nb3, int n_blocks,
                        int n_hkv, head_geo * hg) {
    kvq::row_geo g1 = {};
    if (!kvq::row_geo_of(a, base, nb2, nb3, n_blocks, &hg->g0) ||
        (n_hkv > 1 && !kvq::row_geo_of(a, base + nb1, nb2, nb3, n_blocks, &g1))) {
        return false;
    }
    hg->dh = {};
    if (n_hkv > 1) {
        hg->dh = { g1.ch0 - hg->g0.ch0, g1.row0 - hg->g0.row0, g1.off - hg->g0.off, g1.d_cell - hg->g0.d_cell,
                   g1.d_stream - hg->g0.d_stream };
    }
    for (int h = 2; h < n_hkv; h++) {
        kvq::row_geo g;
        if (!kvq::row_geo_of(a, base + h * nb1, nb2, nb3, n_blocks, &g) || !same_geo(g, hg->at(h))) {
            return false;
        }
    }
    return true;
}

}  // namespace kva
