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
