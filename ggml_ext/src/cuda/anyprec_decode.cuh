// How the one-token GEMV of the any-precision op (anyprec_cuda.cu, apq_gemv_token_kernel) turns row-lane words
// into tensor-core fragments at b <= 4: __host__ __device__ and free of ggml-cuda, so tests/cuda/
// anyprec_decode_check.cu runs these very functions on the host, with the MMA emulated from PTX's fragment
// layout, against a double-precision dot product of the file's codes.
//
// The row-lane layout (anyprec_cuda.h): lane l of a warp owns row 32 g + l; per plane and super-chunk q of 128
// weights it holds 4 words, word t's bit 8 i + m being weight 32 t + 4 m + i (i < 4, m < 8).
//
// Why tensor cores at one token: at b <= 4 the per-weight work of an FFMA loop is ~4 instructions (code bits,
// two byte permutes, half -> float, FFMA), which at 132 SMs caps a 14336 x 4096 GEMV near half the HBM rate.
// The lookup already yields fp16 pairs; one mma.sync.m16n8k16 (f16 inputs, f32 accumulation) replaces the 4
// conversions and 4 FFMAs of 4 weights per lane. The MMA is used as 32 independent 4-term dot products, one per
// lane, so that the row-lane layout stays as it is:
//   * B (16 x 8, "col"): lane (gid = l / 4, tig = l % 4) gives B[2 tig, 2 tig + 1][gid] and B[2 tig + 8,
//     2 tig + 9][gid]: its own row's 4 weights j0, j1, j0 + 1, j1 + 1 (apq_b_frag);
//   * A (16 x 16, row-major): zero except on the 4 "diagonal" lanes gid == tig (lanes 0, 5, 10, 15), which hold
//     x at those 4 positions: row tig the high fp16 part, row tig + 8 the remainder x - hi as fp16 (apq_x_frag),
//     so that x keeps ~22 significant bits (fp16 x alone would give a normalised error ~8e-8 against the 1e-7
//     the op's tests allow), x first scaled by a power of two (apq_x_scale) so that neither part overflows;
//   * D (16 x 8): D[tig'][n] is the high-part sum of lane 4 n + tig', D[8 + tig'][n] its remainder part; lane
//     (gid < 4, tig) holds D[gid][2 tig], D[gid][2 tig + 1] (c0, c1) and D[gid + 8][..] (c2, c3), i.e. the sums of
//     lanes 8 tig + gid (c0 + c2) and 8 tig + 4 + gid (c1 + c3): apq_acc_source says which lane and which half a
//     row's lane reads after the last MMA;
//   * two tokens in one MMA: A's rows 4..7 and 12..15, unused by one token, hold a second token's x on the lanes
//     gid == tig + 4 (16, 21, 26, 31), and its sums land in the lanes gid >= 4, 16 lanes further on.
// A product of two fp16 values is exact in f32, so the sums differ from an FFMA loop's only by order, by the
// tensor core's f32 additions and by x's ~22 bits.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

// __byte_perm(x, y, s) (selector nibbles 0..7, no sign-replicate mode); the host's twin for the check.
__host__ __device__ __forceinline__ uint32_t apq_prmt(uint32_t x, uint32_t y, uint32_t s) {
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

// codes of the b planes' words w: mask 0x11111111 gives 8 codes of <= 4 bits (byte i: weight 4m+i in the low
// nibble, 16+4m+i in the high one), mask 0x01010101 4 codes (byte i: weight 4m+i)
template <int B>
__host__ __device__ __forceinline__ uint32_t rl_codes(const uint32_t (&w)[B], int m, uint32_t mask) {
    uint32_t o = 0;
    for (int kk = 0; kk < B; kk++) {  // B is a constant: unrolled by the compiler
        o |= ((w[kk] >> m) & mask) << (B - 1 - kk);
    }
    return o;
}

// A row's table of <= 8 fp16 centroids (entries past 2^b zero) as byte planes for the permutes: low bytes of
// entries 0-3 / 4-7, high bytes of entries 0-3 / 4-7. raw: the 8 halves, entry e in bits 16 (e & 1) of word e / 2.
struct apq_reg_table {
    uint32_t l0, l1, h0, h1;
};

__host__ __device__ __forceinline__ apq_reg_table apq_reg_table_of(uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    return { apq_prmt(r0, r1, 0x6420), apq_prmt(r2, r3, 0x6420), apq_prmt(r0, r1, 0x7531), apq_prmt(r2, r3, 0x7531) };
}

// The B fragment of one MMA from s = the nibble codes of rl_codes(w, m, 0x11111111) shifted right by 16 hh:
// b0 = (T[code of 4m+2hh], T[code of 16+4m+2hh]), b1 = (T[.. 4m+2hh+1], T[.. 16+4m+2hh+1]) as fp16 pairs (low half
// first): weights j0 = 32 t + 4 m + 2 hh, j1 = j0 + 16, then j0 + 1, j1 + 1 of word t. Four permutes per 4 weights.
__host__ __device__ __forceinline__ void apq_b_frag(uint32_t s, const apq_reg_table & tb, uint32_t & b0, uint32_t & b1) {
    const uint32_t L = apq_prmt(tb.l0, tb.l1, s);  // low bytes of the 4 weights' centroids
    const uint32_t H = apq_prmt(tb.h0, tb.h1, s);  // their high bytes
    b0               = apq_prmt(L, H, 0x5140);
    b1               = apq_prmt(L, H, 0x7362);
}

// b = 4: pair tables. rl_codes(w, m, 0x11111111) at b = 4 holds in byte i the codes of weights 4m+i (low nibble)
// and 16+4m+i (high nibble), so the byte is an index into the row's table of 256 fp16 pairs (T[p & 15],
// T[p >> 4]): bytes 2 hh and 2 hh + 1 give the same b0 and b1 as apq_b_frag, one shared-memory load each.
// Pair p of lane l sits at byte p * 256 + l * 4 (+ 128 for the second buffer), so the address is one permute of
// the code byte (second byte) and the lane's offset (first byte).
__host__ __device__ __forceinline__ uint32_t apq_pair(uint32_t lo_half, uint32_t hi_half) {
    return (lo_half & 0xffff) | hi_half << 16;
}

// where pair p of lane l, buffer u is stored
__host__ __device__ __forceinline__ uint32_t apq_pair_offset(int p, int u, int lane) {
    return (uint32_t) (p * 256 + u * 128 + lane * 4);
}

// byte address of the pair of code byte i of o; lreg = l * 4 + buffer * 128 (the low byte of apq_pair_offset)
__host__ __device__ __forceinline__ uint32_t apq_pair_addr(uint32_t o, uint32_t lreg, int i) {
    return apq_prmt(o, lreg, 0x5504 | (i << 4));
}

// MMA u of super-chunk q (u = 8 t + 2 m + hh, t < 4, m < 4, hh < 2) covers weights j0 = 32 t + 4 m + 2 hh,
// j0 + 16, j0 + 1, j0 + 17 of the chunk
__host__ __device__ __forceinline__ int apq_x_frag_j0(int u) {
    return 32 * (u >> 3) + 4 * ((u >> 1) & 3) + 2 * (u & 1);
}

// The power of two s that x is multiplied by before the split (the sums by 1 / s after the MMAs): 1 where max |x|
// is in [2^-6, 2^15) (the kernel converts x once, assuming so), else max |x| s in [2^13, 2^14): hi never
// overflows fp16 (|x| up to 65504 otherwise) and the remainders of the largest values keep ~18 bits or more
// (small vectors would otherwise lose them to subnormals). Exact: only exponents change. maxabs zero, infinite
// or NaN: s = 1 (an infinity or NaN in x then reaches the sums as in f32).
__host__ __device__ __forceinline__ void apq_x_scale(float maxabs, float & s, float & inv) {
    s = inv = 1.0f;
    if (maxabs > 0.0f && maxabs <= 3.4e38f && !(maxabs >= 0.015625f && maxabs < 32768.0f)) {
        int e;
        frexpf(maxabs, &e);  // maxabs = f 2^e, f in [0.5, 1)
        e   = e < -100 ? -100 : e > 100 ? 100 : e;
        s   = ldexpf(1.0f, 14 - e);
        inv = ldexpf(1.0f, e - 14);
    }
}

// x split as hi = fp16(x), lo = fp16(x - hi)
__host__ __device__ __forceinline__ void apq_split(float x, uint32_t & hi, uint32_t & lo) {
    const __half h = __float2half_rn(x);
    hi             = __half_as_ushort(h);
    lo             = __half_as_ushort(__float2half_rn(x - __half2float(h)));
}

// The A fragment of a diagonal lane for the MMA whose weights are j0, j0 + 16, j0 + 1, j0 + 17 (x0 = x[j0],
// x0[1] = x[j0 + 1], x16 = x[j0 + 16], x16[1] = x[j0 + 17]): registers a0..a3 = (hi j0, hi j0+16), (lo j0,
// lo j0+16), (hi j0+1, hi j0+17), (lo j0+1, lo j0+17), low half first.
__host__ __device__ __forceinline__ uint4 apq_x_frag(float x0, float x1, float x16, float x17) {
    uint32_t h0, l0, h1, l1, h16, l16, h17, l17;
    apq_split(x0, h0, l0);
    apq_split(x1, h1, l1);
    apq_split(x16, h16, l16);
    apq_split(x17, h17, l17);
    return make_uint4(h0 | h16 << 16, l0 | l16 << 16, h1 | h17 << 16, l1 | l17 << 16);
}

// Lane l's row sum of token tok after the MMAs: lane src's c[half] + c[half + 2] (src = 4 (l % 4) + l / 8 + 16 tok,
// half = (l / 4) % 2)
__host__ __device__ __forceinline__ int apq_acc_source(int lane, int tok, int & half) {
    half = (lane >> 2) & 1;
    return 4 * (lane & 3) + (lane >> 3) + 16 * tok;
}

// whether lane carries token tok's x in the A fragment (gid == tig + 4 tok)
__host__ __device__ __forceinline__ bool apq_diag_lane(int lane, int tok) {
    return (lane >> 2) == (lane & 3) + 4 * tok;
}
