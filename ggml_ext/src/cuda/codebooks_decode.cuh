// How the CUDA kernels of the codebook types (codebooks_cuda.cu) read a block's bits: table indices and
// sub-group multipliers, __host__ __device__ and free of ggml-cuda, so tests/cuda/codebooks_decode_check.cu
// runs the very same functions on the host against the C reference (ggml's to_float of CB2 / CB3).
// Bits as in formats/codebooks/codebooks.h: weight jj of sub-group s has code bits 2 (s & 3) of
// qs[16 (s >> 2) + jj] (and, CB3, bit s & 7 of hmask[16 (s >> 3) + jj]); codebook bits 2 (s & 3) of
// cb[s >> 2]; scale nibble s & 1 of scales[s >> 1]; the value is d * (l + 1) * T[c][q].
#pragma once

#include "formats/codebooks/codebooks.h"
#include "formats/codebooks/codebooks_tables.h"

template <int BITS> struct cb_traits;
template <> struct cb_traits<2> {
    using block                = ggml_ext_block_cb2;
    static constexpr int n_tab = 16;  // 4 codebooks x 4 entries, index c << 2 | q
    static constexpr int shift = 2;
};
template <> struct cb_traits<3> {
    using block                = ggml_ext_block_cb3;
    static constexpr int n_tab = 32;  // 4 codebooks x 8 entries, index c << 3 | q
    static constexpr int shift = 3;
};

// The built-in tables (codebooks_tables.h) flattened codebook-major: entry c << shift | q.
struct cb_tables {
    int8_t t[32];
};

template <int BITS> cb_tables cb_make_tables() {
    cb_tables r = {};
    for (int c = 0; c < 4; c++) {
        for (int q = 0; q < (1 << BITS); q++) {
            r.t[(c << cb_traits<BITS>::shift) | q] = BITS == 2 ? ggml_ext_cb2_tables[c][q & 3] : ggml_ext_cb3_tables[c][q];
        }
    }
    return r;
}

// Multiplier l + 1 of sub-group s.
template <int BITS>
__host__ __device__ __forceinline__ int cb_mult(const typename cb_traits<BITS>::block * b, int s) {
    return ((b->scales[s >> 1] >> (4 * (s & 1))) & 15) + 1;
}

// Table index (c << shift | q) of weight jj of sub-group s (the dequantize kernel's reading: the format
// read literally, one weight at a time).
template <int BITS>
__host__ __device__ __forceinline__ int cb_code_index(const typename cb_traits<BITS>::block * b, int s, int jj) {
    int q = (b->qs[16 * (s >> 2) + jj] >> (2 * (s & 3))) & 3;
    if constexpr (BITS == 3) {
        q |= ((b->hmask[16 * (s >> 3) + jj] >> (s & 7)) & 1) << 2;
    }
    const int c = (b->cb[s >> 2] >> (2 * (s & 3))) & 3;
    return c << cb_traits<BITS>::shift | q;
}

// Two bytes p[0], p[1] at an even offset of a block (every pair the mat-vec reads is): one 16-bit load on
// the device (blocks are 2-byte aligned: they start with the fp16 d and are 78 / 110 bytes long), bytes on
// the host.
__host__ __device__ __forceinline__ int cb_ld16(const uint8_t * p) {
#ifdef __CUDA_ARCH__
    return *(const uint16_t *) p;
#else
    return p[0] | p[1] << 8;
#endif
}

// What lane `lane` (0..31) of the mat-vec loads of a block, before decoding: five loads, all issued for
// several blocks before any is used (the mat-vec keeps them in flight together). d: the fp16 bits of the
// super-scale; sc: scales[2 g4] | scales[2 g4 + 1] << 8; cb: cb[g4]; q: code bytes qs[2 lane] | qs[2 lane + 1] << 8;
// h (CB3): hmask bytes 16 (g4 >> 1) + jj0, + 1 likewise; g4 = lane >> 3, jj0 = 2 lane & 15.
struct cb_lane_raw {
    int d, sc, cb, q, h;
};

template <int BITS>
__host__ __device__ __forceinline__ cb_lane_raw cb_lane_load(const typename cb_traits<BITS>::block * b, int lane) {
    const int   g4 = lane >> 3;
    cb_lane_raw r;
    r.d  = cb_ld16((const uint8_t *) &b->d);
    r.sc = cb_ld16(b->scales + 2 * g4);
    r.cb = b->cb[g4];
    r.q  = cb_ld16(b->qs + 2 * lane);
    r.h  = 0;
    if constexpr (BITS == 3) {
        r.h = cb_ld16(b->hmask + 16 * (g4 >> 1) + ((2 * lane) & 15));
    }
    return r;
}

// The mat-vec's reading of a block by lane `lane` (0..31), from what cb_lane_load loaded: the code bytes
// qs[2 lane], qs[2 lane + 1] hold weights jj0 = 2 lane & 15 and jj0 + 1 of the four sub-groups s = 4 g4 + p,
// g4 = lane >> 3, p = 0..3. For each p: idx[p][u] the table index of weight 16 s + jj0 + u, mult[p] the
// multiplier of s.
template <int BITS>
__host__ __device__ __forceinline__ void cb_lane_unpack(const cb_lane_raw & r, int lane, int idx[4][2], int mult[4]) {
    const int g4 = lane >> 3;
    const int q0 = r.q & 0xff, q1 = r.q >> 8;
    // hmask byte 16 (s >> 3) + jj holds bit s & 7 = 4 (g4 & 1) + p of the sub-groups s = 4 g4 + p
    const int h0 = (r.h & 0xff) >> (4 * (g4 & 1)), h1 = (r.h >> 8) >> (4 * (g4 & 1));
#pragma unroll
    for (int p = 0; p < 4; p++) {
        mult[p]      = ((r.sc >> (4 * p)) & 15) + 1;  // nibble p of scales[2 g4] | scales[2 g4 + 1] << 8
        const int c  = ((r.cb >> (2 * p)) & 3) << cb_traits<BITS>::shift;
        int       k0 = (q0 >> (2 * p)) & 3, k1 = (q1 >> (2 * p)) & 3;
        if constexpr (BITS == 3) {
            k0 |= ((h0 >> p) & 1) << 2;
            k1 |= ((h1 >> p) & 1) << 2;
        }
        idx[p][0] = c | k0;
        idx[p][1] = c | k1;
    }
}

// Both steps for one block (what tests/cuda/codebooks_decode_check.cu checks against the C reference).
template <int BITS>
__host__ __device__ __forceinline__ void cb_lane_decode(const typename cb_traits<BITS>::block * b, int lane,
                                                        int idx[4][2], int mult[4]) {
    cb_lane_unpack<BITS>(cb_lane_load<BITS>(b, lane), lane, idx, mult);
}

// ---- the integer mat-vec's reading (activations quantized to q8_1, products by dp4a) ----
// Four lanes per block: lane quarter t (0..3) takes the 16 code bytes qs[16 t .. 16 t + 15], i.e. all 16 weights
// of the four sub-groups 4 t + p (p = 0..3), with their codebook byte cb[t], their scales scales[2 t],
// scales[2 t + 1] (CB3: the 16 hmask bytes 16 (t >> 1) .. + 15, bits 4 (t & 1) + p). It loads them as four 32-bit
// words (from 16-bit loads: blocks are only 2-byte aligned) and decodes each word of each sub-group -- 4 weights --
// into 4 int8 weights with one byte permute (prmt) of the sub-group's codebook, which sits in one 32-bit register
// (CB2: 4 entries) or two (CB3: 8): the codes become the permute's 4 selector nibbles, no table in memory.

// __byte_perm(x, y, s) (selector nibbles 0..7, no sign-replicate mode); the host's twin for the check.
__host__ __device__ __forceinline__ uint32_t cb_prmt(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = (uint64_t) y << 32 | x;
    uint32_t       r = 0;
    for (int k = 0; k < 4; k++) {
        r |= (uint32_t) ((v >> (8 * ((s >> (4 * k)) & 7))) & 0xff) << (8 * k);
    }
    return r;
#endif
}

// The tables as 32-bit words for the permutes: CB2 word c = codebook c's 4 entries, CB3 words 2c, 2c + 1 =
// codebook c's entries 0..3, 4..7 (little-endian bytes).
struct cb_qtables {
    uint32_t w[8];
};

template <int BITS> cb_qtables cb_make_qtables() {
    const cb_tables t = cb_make_tables<BITS>();
    cb_qtables      r = {};
    for (int i = 0; i < 4 << (BITS - 2); i++) {
        r.w[i] = (uint32_t) (uint8_t) t.t[4 * i] | (uint32_t) (uint8_t) t.t[4 * i + 1] << 8 |
                 (uint32_t) (uint8_t) t.t[4 * i + 2] << 16 | (uint32_t) (uint8_t) t.t[4 * i + 3] << 24;
    }
    return r;
}

// What lane quarter t loads of a block: q[i] = qs bytes 16 t + 4 i .. + 3, h[i] likewise of hmask (CB3),
// sc = scales[2 t] | scales[2 t + 1] << 8, cb = cb[t], d = the fp16 bits of the super-scale.
struct cb_q8_raw {
    uint32_t q[4], h[4];
    int      sc, cb, d;
};

template <int BITS>
__host__ __device__ __forceinline__ cb_q8_raw cb_q8_load(const typename cb_traits<BITS>::block * b, int t) {
    cb_q8_raw r;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        r.q[i] = (uint32_t) cb_ld16(b->qs + 16 * t + 4 * i) | (uint32_t) cb_ld16(b->qs + 16 * t + 4 * i + 2) << 16;
        r.h[i] = 0;
        if constexpr (BITS == 3) {
            const uint8_t * h = b->hmask + 16 * (t >> 1) + 4 * i;
            r.h[i]            = (uint32_t) cb_ld16(h) | (uint32_t) cb_ld16(h + 2) << 16;
        }
    }
    r.sc = cb_ld16(b->scales + 2 * t);
    r.cb = b->cb[t];
    r.d  = cb_ld16((const uint8_t *) &b->d);
    return r;
}

// From what cb_q8_load loaded: w[p][i] = the int8 weights 4 i .. 4 i + 3 of sub-group 4 t + p (byte k: weight
// 4 i + k), mult[p] its multiplier l + 1.
template <int BITS>
__host__ __device__ __forceinline__ void cb_q8_unpack(const cb_q8_raw & r, int t, const cb_qtables & tab,
                                                      uint32_t w[4][4], int mult[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        // bytes in the order 0, 2, 1, 3: after the shift by 12 below, the selector's nibbles are weights 0..3
        const uint32_t q = cb_prmt(r.q[i], 0, 0x3120);
        const uint32_t h = BITS == 3 ? cb_prmt(r.h[i], 0, 0x3120) >> (4 * (t & 1)) : 0;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            uint32_t x = (q >> (2 * p)) & 0x03030303u;  // the codes of weights 4i + {0, 2, 1, 3}, one per byte
            if constexpr (BITS == 3) {
                x |= ((h >> p) & 0x01010101u) << 2;
            }
            const uint32_t sel = (x | (x >> 12)) & 0xffffu;  // nibble k: the code of weight 4 i + k
            const int      c   = (r.cb >> (2 * p)) & 3;
            if constexpr (BITS == 2) {
                const uint32_t tc = (c & 2) ? ((c & 1) ? tab.w[3] : tab.w[2]) : ((c & 1) ? tab.w[1] : tab.w[0]);
                w[p][i]           = cb_prmt(tc, 0, sel);
            } else {
                const uint32_t lo = (c & 2) ? ((c & 1) ? tab.w[6] : tab.w[4]) : ((c & 1) ? tab.w[2] : tab.w[0]);
                const uint32_t hi = (c & 2) ? ((c & 1) ? tab.w[7] : tab.w[5]) : ((c & 1) ? tab.w[3] : tab.w[1]);
                w[p][i]           = cb_prmt(lo, hi, sel);
            }
        }
    }
#pragma unroll
    for (int p = 0; p < 4; p++) {
        mult[p] = ((r.sc >> (4 * p)) & 15) + 1;
    }
}
