// The per-value pieces of the KVQuant decode op's CUDA kernels (kvquant_attn_cuda.cu): a pair of the cos / sin table, a
// value of a K / V row (NUQ through kvq::dequantize_value, F16, F32: the kernels' reading of views that
// kvq::row_geo_of refuses; they read NUQ rows a block at a time through kvq::row_geo_of / block_value, which
// tests/cuda/kvquant_cuda_check.cu holds to dequantize_value's bits), the K norm's scale and product, the RoPE of one
// dimension of a decoded key. __host__ __device__ and free of ggml-cuda, so tests/cuda/kvattn_cuda_check.cu runs
// these very functions on the host against ggml's CPU table (backend/kvquant_attn_cpu.c) and ggml's to_float, rms_norm, mul
// and rope_ext. IEEE round-to-nearest in both (KVQ_* of kvquant_decode.cuh: ggml-cuda builds with -use_fast_math);
// cos / sin in double, rounded to float (the fast-math cosf would be __cosf, far off at large angles).
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

// RoPE a lane at a time (kvquant_attn_cuda.cu's k_split: lane l holds the key's dimensions d = l + 32 k). rope_partner:
// the other dimension of d's pair (normal: d ^ 1; NEOX: d +- n_dims / 2), -1 past n_dims (not rotated); the kernel
// fetches it from lane pd % 32, slot pd / 32 (a shuffle: lane (l + r) % 32 or (l - r) % 32 for every slot, r =
// (n_dims / 2) % 32; none when r = 0). rope_lane: dimension d of the roped key from its own value x and its partner's
// y, rope_at's bits (tests/cuda/kvattn_cuda_check.cu: every lane and slot of every key).
KVQ_HD int rope_partner(int mode, int n_dims, int d) {
    if (d >= n_dims) {
        return -1;
    }
    if (mode == 2 /* GGML_ROPE_TYPE_NEOX */) {
        const int h2 = n_dims / 2;
        return d < h2 ? d + h2 : d - h2;
    }
    return d ^ 1;
}

// the pair of d (its cos / sin at cs[2 j], cs[2 j + 1]) and whether d is the pair's first dimension
KVQ_HD int rope_pair_of(int mode, int n_dims, int d, bool * first) {
    if (mode == 2) {
        const int h2 = n_dims / 2;
        *first       = d < h2;
        return d < h2 ? d : d - h2;
    }
    *first = d % 2 == 0;
    return d / 2;
}

KVQ_HD float rope_lane(bool first, float x, float y, float co, float si) {
    // rope_at: first a = x, b = y: a co - b si; second a = y, b = x: a si + b co
    return first ? KVQ_SUB(KVQ_MUL(x, co), KVQ_MUL(y, si)) : KVQ_ADD(KVQ_MUL(y, si), KVQ_MUL(x, co));
}

}  // namespace kva
