// How the CUDA kernels of the KVQuant cache types (kvquant_cuda.cu) write and read one 64-value block: the
// quantizer (backend/kvquant_base.c's from_float: values with their own mid / half and one outlier slot, pre-RoPE keys
// per channel with two) and the value reader (to_float: the block decoder of formats/kvquant/kvquant_decode.h, the slots,
// the sink rows; block-scaled keys, GGML_EXT_KV_KBLOCK: value blocks of the channel-normalised keys), __host__
// __device__ and free of ggml-cuda, so tests/cuda/kvquant_cuda_check.cu runs these very
// functions on the host against the CPU row functions. The SET_ROWS kernel runs the warp form of the quantizer
// (kvquant_cuda.cu's warp_quantize_block, a warp per block); quantize_block / quantize_at here are its scalar twin, the
// same comparisons one value at a time, which the host check holds to the CPU's bytes on every machine (the warp form
// against the CPU on a GPU: tests/c/test_kvquant_cuda.cpp). The arithmetic is IEEE round-to-nearest in both
// (ggml-cuda builds with -use_fast_math: on the device the intrinsics below keep divisions and sums exact), the
// decode's product rounded before the sum (no fused multiply-add), so blocks and values are the CPU's bit for bit.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#define KVQ_HD __host__ __device__ __forceinline__

#ifdef __CUDA_ARCH__
#    define KVQ_ADD(a, b) __fadd_rn((a), (b))
#    define KVQ_SUB(a, b) __fsub_rn((a), (b))
#    define KVQ_MUL(a, b) __fmul_rn((a), (b))
#    define KVQ_DIV(a, b) __fdiv_rn((a), (b))
#else
static inline float kvq_add(float a, float b) { volatile float r = a + b; return r; }
static inline float kvq_sub(float a, float b) { volatile float r = a - b; return r; }
static inline float kvq_mul(float a, float b) { volatile float r = a * b; return r; }
static inline float kvq_div(float a, float b) { volatile float r = a / b; return r; }
#    define KVQ_ADD(a, b) kvq_add((a), (b))
#    define KVQ_SUB(a, b) kvq_sub((a), (b))
#    define KVQ_MUL(a, b) kvq_mul((a), (b))
#    define KVQ_DIV(a, b) kvq_div((a), (b))
#endif

namespace kvq {

constexpr int QK = 64;  // values per block

// what a kernel needs of one binding (by value: kernel parameters)
struct kvq_args {
    int           bits;
    int           block_bytes;
    int           dense_bytes;
    float         values[16];
    float         mids[15];
    const char *  lo;          // the binding's first byte (NULL: not bound, uniform levels)
    int64_t       row_blocks;  // > 0: keys, per-channel scales below
    const float * k_mid;
    const float * k_half;
    int           k_block;     // keys: 1 = block-scaled (a value block of the channel-normalised keys, one slot)
    int           outliers;
    int64_t       row_bytes;   // bytes per cache row (sink rows; 0: no sink)
    int64_t       row_values;
    const int64_t * sink;      // [0]: slots in use (hw), [1 + s]: the cache row of slot s (-1: free); NULL: no sink
    float *       sink_data;   // slot s: row_values floats
};

KVQ_HD bool is_tag(unsigned w) {
    return (w & 0xffc0u) == 0x8000u;
}

KVQ_HD int get_index(const uint8_t * blk, int bits, int s) {
    if (bits == 4) {
        return (blk[s % 32] >> (4 * (s / 32))) & 15;
    }
    int q = (blk[s % 16] >> (2 * (s / 16))) & 3;
    if (bits == 3) {
        q |= ((blk[16 + s % 8] >> (s / 8)) & 1) << 2;
    }
    return q;
}

KVQ_HD int nearest_level(const kvq_args & a, float xn) {
    const int n = 1 << a.bits;
    int       q = 0;  // past the midpoints below xn; a tie goes to the lower level (NaN: 0)
    while (q < n - 1 && a.mids[q] < xn) {
        q++;
    }
    return q;
}

// the sink slot of the cache row holding blk (-1: none)
KVQ_HD int sink_slot(const kvq_args & a, const char * blk, int64_t * off) {
    if (!a.sink) {
        return -1;
    }
    const int64_t o   = blk - a.lo;
    const int64_t row = o / a.row_bytes;
    const int64_t hw  = a.sink[0];
    for (int64_t s = 0; s < hw; s++) {
        if (a.sink[1 + s] == row) {
            *off = (o % a.row_bytes) / a.block_bytes * QK;
            return (int) s;
        }
    }
    return -1;
}

KVQ_HD uint16_t f2h(float x) {
    return __half_as_ushort(__float2half_rn(x));
}

KVQ_HD float h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

template <typename T> KVQ_HD T from_f32(float x);
template <> KVQ_HD float from_f32<float>(float x) {
    return x;
}
template <> KVQ_HD half from_f32<half>(float x) {
    return __float2half_rn(x);
}

// the 64 indices in the slot order of formats/kvquant/kvquant.h (head_dim 64), then the trailer's words
KVQ_HD void pack_block(int bits, int dense_bytes, const uint8_t * idx, const uint16_t * w, uint8_t * blk) {
    if (bits == 4) {
        for (int j = 0; j < 32; j++) {
            blk[j] = (uint8_t) (idx[j] | idx[j + 32] << 4);
        }
    } else {
        for (int j = 0; j < 16; j++) {
            blk[j] = (uint8_t) ((idx[j] & 3) | (idx[j + 16] & 3) << 2 | (idx[j + 32] & 3) << 4 | (idx[j + 48] & 3) << 6);
        }
        if (bits == 3) {
            for (int j = 0; j < 8; j++) {
                uint8_t b = 0;
                for (int k = 0; k < 8; k++) {
                    b |= (uint8_t) (((idx[j + 8 * k] >> 2) & 1) << k);
                }
                blk[16 + j] = b;
            }
        }
    }
    memcpy(blk + dense_bytes, w, 4 * sizeof(uint16_t));
}

// a value block: its own mid / half from the min / max (with outliers: of the 63 left after the slot, whose fp16
// value is slot_src's element: x's, or a block-scaled key's raw key); a NaN or infinity gives a NaN block (zero
// indices, mid NaN), as the CPU writes it
KVQ_HD void quantize_value_block(const kvq_args & a, const float * x, uint8_t * blk, const float * slot_src) {
    uint8_t idx[QK];
    bool    finite = true;
    int  imin = 0, imax = 0;
    for (int c = 0; c < QK; c++) {
        finite = finite && isfinite(x[c]);
        imin   = x[c] < x[imin] ? c : imin;
        imax   = x[c] > x[imax] ? c : imax;
    }
    if (!finite) {
        for (int j = 0; j < a.dense_bytes; j++) {
            blk[j] = 0;
        }
        const uint16_t nanw[4] = { 0x7e00, 0, 0, 0 };
        memcpy(blk + a.dense_bytes, nanw, sizeof(nanw));
        return;
    }
    int slot = -1;
    if (a.outliers) {
        float min2 = INFINITY, max2 = -INFINITY;
        for (int c = 0; c < QK; c++) {
            if (c != imin) {
                min2 = fminf(min2, x[c]);
            }
            if (c != imax) {
                max2 = fmaxf(max2, x[c]);
            }
        }
        const bool drop_max = KVQ_SUB(x[imax], max2) >= KVQ_SUB(min2, x[imin]);
        slot                = drop_max ? imax : imin;
    }
    float lo = INFINITY, hi = -INFINITY;
    for (int c = 0; c < QK; c++) {
        if (c != slot) {
            lo = fminf(lo, x[c]);
            hi = fmaxf(hi, x[c]);
        }
    }
    const float mid  = KVQ_MUL(KVQ_ADD(hi, lo), 0.5f);
    const float half = fmaxf(KVQ_MUL(KVQ_SUB(hi, lo), 0.5f), 1e-8f);
    for (int c = 0; c < QK; c++) {
        idx[c] = (uint8_t) nearest_level(a, KVQ_DIV(KVQ_SUB(x[c], mid), half));
    }
    const uint16_t w[4] = { f2h(mid), f2h(half), slot >= 0 ? (uint16_t) (0x8000u | (unsigned) slot) : (uint16_t) 0,
                            slot >= 0 ? f2h(slot_src[slot]) : (uint16_t) 0 };
    pack_block(a.bits, a.dense_bytes, idx, w, blk);
}

// the first channel of the key block at blk (block i of the cache: channels (i % row_blocks) * 64 ..)
KVQ_HD int64_t key_channel0(const kvq_args & a, const void * blk) {
    return ((const char *) blk - a.lo) / a.block_bytes % a.row_blocks * QK;
}

// one block of 64 values x into blk: backend/kvquant_base.c's from_float for one block, bit for bit (the scalar twin of
// kvquant_cuda.cu's warp_quantize_block)
KVQ_HD void quantize_block(const kvq_args & a, const float * x, uint8_t * blk) {
    if (a.row_blocks > 0 && a.k_block) {
        // a block-scaled key (kvquant_base.c's key_block_scaled): the channels normalised by their calibrated
        // mid / half, then a value block of those; its slot holds the raw key
        const int64_t c0 = key_channel0(a, blk);
        float         xn[QK];
        for (int c = 0; c < QK; c++) {
            xn[c] = KVQ_DIV(KVQ_SUB(x[c], a.k_mid[c0 + c]), a.k_half[c0 + c]);
        }
        // (the slot's raw key goes into the trailer as it is packed: on the H100 reading the packed trailer back
        // and rewriting its last word left the word's low byte stale, 169 of 169 slots in tests/c/test_kvquant_cuda)
        quantize_value_block(a, xn, blk, x);
        return;
    }
    if (a.row_blocks <= 0) {
        quantize_value_block(a, x, blk, x);
        return;
    }
    // a pre-RoPE key: per-channel scales, two outlier slots (the largest excesses beyond +-1)
    uint8_t       idx[QK];
    uint16_t      w[4];
    const int64_t c0 = key_channel0(a, blk);
    int           out[2] = { -1, -1 };
    float         ex[2]  = { 0.0f, 0.0f };
    bool          nan    = false;
    for (int c = 0; c < QK; c++) {
        const float v = x[c];
        idx[c]        = 0;
        if (!isfinite(v)) {
            nan = true;
            continue;
        }
        const float xn = KVQ_DIV(KVQ_SUB(v, a.k_mid[c0 + c]), a.k_half[c0 + c]);
        idx[c]         = (uint8_t) nearest_level(a, xn);
        const float e  = KVQ_SUB(fabsf(xn), 1.0f);
        if (a.outliers && e > 0.0f) {
            if (e > ex[0]) {
                out[1] = out[0], ex[1] = ex[0];
                out[0] = c, ex[0] = e;
            } else if (e > ex[1]) {
                out[1] = c, ex[1] = e;
            }
        }
    }
    w[0] = 0x0000, w[1] = 0x3c00, w[2] = 0, w[3] = 0;
    if (nan) {
        w[0] = 0x7e00;
    } else {
        const int first = out[1] >= 0 && out[1] < out[0] ? 1 : 0;
        for (int s = 0, j = first; s < 2; s++, j = 1 - j) {
            if (out[j] >= 0) {
                w[2 * s]     = (uint16_t) (0x8000u | (unsigned) out[j]);
                w[2 * s + 1] = f2h(x[out[j]]);
            }
        }
        if (out[0] < 0 && out[1] < 0) {
            w[0] = 0x0000, w[1] = 0x3c00;
        }
    }
    pack_block(a.bits, a.dense_bytes, idx, w, blk);
}

// The decode op's lane kernel (kvquant_attn_cuda.cu's k_lanes) reads a V head row a lane at a time: lane l of a warp owns
// the values d = l + 32 k of the row (in block k / 2 the channels c = l and l + 32, the two halves of the block's slot
// order). lane_value is a block's value from its table value t, its trailer words and (keys) its channel's mid / half;
// block_value below is it with those looked up; lane_load and lane_values (below) give lane l's two values of a block,
// so dequantize_value's bits outside the sink rows (tests/cuda/kvquant_cuda_check.cu: every lane of every head row).
KVQ_HD float lane_value(const kvq_args & a, float t, const uint16_t * w, int c, float kmid, float khalf) {
    if (a.row_blocks > 0 && a.k_block) {
        if (is_tag(w[2]) && (w[2] & 63) == c) {
            return h2f(w[3]);
        }
        const float yn = KVQ_ADD(KVQ_MUL(t, h2f(w[1])), h2f(w[0]));
        return KVQ_ADD(KVQ_MUL(yn, khalf), kmid);
    }
    if (a.row_blocks > 0) {
        float y = KVQ_ADD(KVQ_MUL(t, khalf), kmid);
        if (is_tag(w[2]) && (w[2] & 63) == c) {
            y = h2f(w[3]);
        } else if (is_tag(w[0]) && (w[0] & 63) == c) {
            y = h2f(w[1]);
        }
        return y;
    }
    if (is_tag(w[2]) && (w[2] & 63) == c) {
        return h2f(w[3]);
    }
    return KVQ_ADD(KVQ_MUL(t, h2f(w[1])), h2f(w[0]));
}

// A block's value, in two parts (the decode op's kernels, kvquant_attn_cuda.cu, read a row's blocks this way, and
// dequantize_value below is the two for one value): the trailer words of the block, read once per block, then
// block_value for value c of a block that is not in a sink row, ch0 its first channel (keys: key_channel0), values the
// 2^B table (a.values or a copy of it). Values: (val * half_t + mid_t), the slot over it; per-channel keys: val *
// half_c + mid_c, two slots; block-scaled keys: the block's own mid / half, then the channel's calibrated ones (each
// product rounded before its sum), one slot (words 2, 3).
KVQ_HD void block_words(const kvq_args & a, const char * blk, uint16_t * w) {
    memcpy(w, blk + a.dense_bytes, 4 * sizeof(uint16_t));
}

KVQ_HD float block_value(const kvq_args & a, const float * values, int64_t ch0, const char * blk, const uint16_t * w,
                         int c) {
    const float t   = values[get_index((const uint8_t *) blk, a.bits, c)];  // a.values (or a copy in shared memory)
    const bool  key = a.row_blocks > 0;
    return lane_value(a, t, w, c, key ? a.k_mid[ch0 + c] : 0.0f, key ? a.k_half[ch0 + c] : 0.0f);
}

// value c of the block at blk: backend/kvquant_base.c's to_float, bit for bit
KVQ_HD float dequantize_value(const kvq_args & a, const char * blk, int c) {
    int64_t   off;
    const int s = sink_slot(a, blk, &off);
    if (s >= 0) {
        return a.sink_data[s * a.row_values + off + c];
    }
    uint16_t w[4];
    block_words(a, blk, w);
    return block_value(a, a.values, a.row_blocks > 0 ? key_channel0(a, blk) : 0, blk, w, c);
}

// A lane's part of one block (lane l holds channels l and l + 32): the index bytes get_index reads for them (4 bits:
// byte l; 2 / 3 bits: byte l % 16, and for 3 bits byte 16 + l % 8) and the trailer's words, fetched by independent
// loads so that the decode op's lane kernel has several cells' V blocks in flight before it decodes the first
// (8-byte aligned trailers: the kernel's launch checks the rows)
struct lane_blk {
    uint32_t q;     // bits 0-7: the index byte; 3 bits: bits 8-15 the high-bit byte
    uint32_t w[2];  // the trailer's four words, two a register (unpacked where they are used)
};

KVQ_HD lane_blk lane_load(const kvq_args & a, const char * blk, int lane) {
    const uint8_t * b = (const uint8_t *) blk;
    lane_blk        r;
    r.q = a.bits == 4 ? b[lane] : b[lane % 16];
    if (a.bits == 3) {
        r.q |= (uint32_t) b[16 + lane % 8] << 8;
    }
#ifdef __CUDA_ARCH__
    const uint2 t = *(const uint2 *) (blk + a.dense_bytes);  // one 8-byte load
    r.w[0] = t.x, r.w[1] = t.y;
#else
    memcpy(r.w, blk + a.dense_bytes, sizeof(r.w));
#endif
    return r;
}

// get_index of channel c (lane or lane + 32) from the lane's bytes
KVQ_HD int lane_index(int bits, uint32_t q, int c) {
    if (bits == 4) {
        return (q >> (4 * (c / 32))) & 15;
    }
    int v = (q >> (2 * (c / 16))) & 3;
    if (bits == 3) {
        v |= ((q >> (8 + c / 8)) & 1) << 2;
    }
    return v;
}

// the lane's two values of a loaded block that is not in a sink row: out[hh] = block_value's bits for channel
// lane + 32 hh (values: the 2^B table, a.values or a copy of it; mid / half: the block's channel scales by channel,
// zeros for values)
KVQ_HD void lane_values(const kvq_args & a, const float * values, const lane_blk & b, int lane, const float * mid,
                        const float * half, float * out) {
    const uint16_t w[4] = { (uint16_t) b.w[0], (uint16_t) (b.w[0] >> 16), (uint16_t) b.w[1], (uint16_t) (b.w[1] >> 16) };
    for (int hh = 0; hh < 2; hh++) {
        const int c = lane + 32 * hh;
        out[hh]     = lane_value(a, values[lane_index(a.bits, b.q, c)], w, c, mid[c], half[c]);
    }
}

// The head rows at row + i * nb_cell + s * nb_stream (the decode op's K or V rows of one KV head, cell i, stream s):
// when both strides are whole cache rows and the head row of n_blocks blocks lies inside one cache row, every such
// row has the same channels and the same place in its cache row, so what dequantize_value finds per value with
// 64-bit divisions (key_channel0, sink_slot's row and offset) is found once here; row_sink then finds a row's sink
// slot. Value d = 64 j + c of the head row: row_sink's floats [d] if not NULL, else block_value(a, a.values,
// g.ch0 + 64 j, block j, its words, c): dequantize_value's bits (tests/cuda/kvquant_cuda_check.cu).
struct row_geo {
    int64_t ch0;               // keys: the head row's first channel
    int64_t row0;              // the cache row of i = s = 0 (-1: no sink marks)
    int64_t off;               // the head row's first value in its cache row (the sink floats)
    int64_t d_cell, d_stream;  // cache rows per cell, per stream
};

// false: the strides or the head row do not allow it (read value by value then)
KVQ_HD bool row_geo_of(const kvq_args & a, const char * row, int64_t nb_cell, int64_t nb_stream, int n_blocks,
                       row_geo * g) {
    g->ch0 = 0, g->row0 = -1, g->off = 0, g->d_cell = 0, g->d_stream = 0;
    const int64_t bb = a.block_bytes;  // whole blocks (the trailer's words 2-byte aligned)
    if (nb_cell < 0 || nb_stream < 0 || nb_cell % bb || nb_stream % bb) {
        return false;
    }
    if (!a.lo) {  // outside every binding: uniform levels, nothing per row
        return a.row_blocks <= 0 && !a.sink && (uintptr_t) row % 2 == 0;
    }
    const int64_t o = row - a.lo;
    if (o < 0 || o % bb) {
        return false;
    }
    if (a.row_blocks > 0) {
        const int64_t rb = a.row_blocks, r = rb * bb;
        if (nb_cell % r || nb_stream % r || o / bb % rb + n_blocks > rb) {
            return false;
        }
        g->ch0 = o / bb % rb * QK;
    }
    if (a.sink) {
        const int64_t r = a.row_bytes;
        if (r <= 0 || r % bb || nb_cell % r || nb_stream % r || o % r + n_blocks * bb > r) {
            return false;
        }
        g->row0 = o / r, g->off = o % r / bb * QK, g->d_cell = nb_cell / r, g->d_stream = nb_stream / r;
    }
    return true;
}

// the sink floats of the head row of cell i, stream s (value d at [d]; sink_slot's first slot), NULL: not a sink row
KVQ_HD const float * row_sink(const kvq_args & a, const row_geo & g, int64_t i, int64_t s) {
    if (g.row0 < 0) {
        return nullptr;
    }
    const int64_t row = g.row0 + i * g.d_cell + s * g.d_stream;
    for (int64_t k = 0; k < a.sink[0]; k++) {
        if (a.sink[1 + k] == row) {
            return a.sink_data + k * a.row_values + g.off;
        }
    }
    return nullptr;
}

// a tensor's shape and byte strides (ggml's ne / nb)
struct shape4 {
    int64_t ne[4];
    size_t  nb[4];
};

// Block t of src's f32 rows (t = ib + nbr (i1 + ne1 (i2 + ne2 i3)), nbr = ne0 / 64) into dst: SET_ROWS (by_idx: dst
// row idx[i1, i2 % idx ne1, i3 % idx ne2] of dst's (i2, i3)) or CPY (dst of the same shape); a sink row's floats too.
template <typename idx_t>
KVQ_HD void quantize_at(int64_t t, const char * src, const shape4 & s, char * dst, const shape4 & d, const char * idx,
                        const shape4 & is, bool by_idx, const kvq_args & a) {
    const int64_t nbr = s.ne[0] / QK;
    const int64_t ib = t % nbr, i1 = t / nbr % s.ne[1], i2 = t / nbr / s.ne[1] % s.ne[2], i3 = t / nbr / s.ne[1] / s.ne[2];
    const float * x  = (const float *) (src + i1 * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3]) + ib * QK;
    int64_t       r1 = i1;
    if (by_idx) {
        r1 = (int64_t) *(const idx_t *) (idx + i1 * is.nb[0] + i2 % is.ne[1] * is.nb[1] + i3 % is.ne[2] * is.nb[2]);
    }
    char * blk = dst + r1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3] + ib * a.block_bytes;
    float  xv[QK];
    for (int c = 0; c < QK; c++) {
        xv[c] = x[c];
    }
    int64_t   off;
    const int slot = sink_slot(a, blk, &off);
    if (slot >= 0) {  // a sink row keeps the floats too (the blocks are written as well)
        for (int c = 0; c < QK; c++) {
            a.sink_data[slot * a.row_values + off + c] = xv[c];
        }
    }
    quantize_block(a, xv, (uint8_t *) blk);
}

// Value t of dst (t = i0 + ne0 (i1 + ne1 (i2 + ne2 i3)) over dst's shape): CPY (src of the same shape) or GET_ROWS
// (by_idx: dst (i0, i1, i2, i3) = src (i0, idx[i1, i2, i3], i2, i3)).
template <typename T, typename idx_t>
KVQ_HD void dequantize_at(int64_t t, const char * src, const shape4 & s, char * dst, const shape4 & d, const char * idx,
                          const shape4 & is, bool by_idx, const kvq_args & a) {
    const int64_t i0 = t % d.ne[0], i1 = t / d.ne[0] % d.ne[1], i2 = t / d.ne[0] / d.ne[1] % d.ne[2],
                  i3 = t / d.ne[0] / d.ne[1] / d.ne[2];
    const char *  row;
    if (by_idx) {
        const int64_t r = (int64_t) *(const idx_t *) (idx + i1 * is.nb[0] + i2 * is.nb[1] + i3 * is.nb[2]);
        row             = src + r * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3];
    } else {
        row = src + i1 * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3];
    }
    const float y = dequantize_value(a, row + i0 / QK * a.block_bytes, (int) (i0 % QK));
    *(T *) (dst + i0 * d.nb[0] + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) = from_f32<T>(y);
}

}  // namespace kvq
