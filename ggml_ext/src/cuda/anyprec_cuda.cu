// CUDA GEMV of the any-precision bitplanes (docs/formats/anyprec.md): y = W_b x reading only the first b
// planes of the file's layout and precision b's fp16 tables. Not an op yet (the op and the type are the
// next step): ggml_ext_apq_gemv_cuda is a plain launcher, compiled into ggml-cuda with GGML_EXT_CUDA=ON and
// by bench/device/device_anyprec.sh standalone, which checks it against the CPU reference and times it.
//
// Loads: thread t of a warp reads 32-bit word c = t, t+32, ... of a row's plane (consecutive words across
// the warp: each plane row is read in coalesced 128-byte runs). The activations are staged in shared
// memory transposed, xs[j * n_chunks + c] = x[32 c + j], so the 32 threads reading weight j of their
// chunks hit 32 consecutive words (no bank conflicts) without permuting the file's bytes (the paper
// permutes the bytes of the planes instead; that variant is the next step). Each warp handles rows in
// turn; its row's table sits in shared memory as float.
//
// v1..v4 (ggml_ext_apq_gemv_rl_cuda, below) run on the "row-lane" device layout of anyprec_cuda.h, made once
// at upload by ggml_ext_apq_relayout_cuda: lane l of a warp owns row 32 g + l of a 32-row group, so
//   * every lane loads 16 bytes per plane per 128 weights and the warp's load is 512 contiguous bytes;
//   * every lane reads its own row's table, stored lane-transposed in shared memory (entry e of lane l at
//     word e * 32 + l): the table lookups of a warp never conflict, at any table size;
//   * the activations are the same for the whole warp (broadcast float4 loads);
//   * the bit-transpose is the paper's 4-bit-lane one: word bits are permuted so that
//     ((plane_k >> m) & 0x11111111) << (b-1-k), OR-ed over the b planes, holds 8 codes of b <= 4 bits (two
//     per byte: weights 4m+i and 16+4m+i), and with mask 0x01010101 4 codes of up to 8 bits;
//   * b <= 4 with pair tables (the paper's merged tables, here for 1..4 bits): one lookup of the byte
//     (two codes) gives two centroids (float2), halving the lookups;
//   * the warps of a block split the row length; a shared-memory reduction per row at the end.
// Variants (ggml_ext_apq_gemv_rl_cuda's `variant`; bench/device/device_anyprec.sh times them all to pick one):
//   v1 singles (one lookup per weight), 8 warps per 32 rows, x read from global memory (L1, broadcast);
//   v2 pair tables for b <= 4, singles above (the default for 2..8 tokens until the second H100 run);
//   v3 v2 with 16 warps per block (more loads in flight for few rows);   v4 v2 with x in shared memory;
//   v5, v6 v2 with a cluster of 2 / 4 blocks per 32 rows (sm_90), row sums through distributed shared memory.
//   v7 v4 split-K: ks blocks per 32 rows (~4 blocks per SM; 4096-row shapes have only 128 row groups for 132
//      SMs), interleaved super-chunks, partial row sums added with atomicAdd into y (zeroed by the launcher);
//   v8 split-K over contiguous slices of the row: each block stages only its slice of x, all tokens, in
//      shared memory (<= 32 KiB), so 2..8 tokens read x from shared memory instead of L1/L2 (v2 at 8 tokens
//      streamed 8 x k floats through an L1 that the weights evict); 1..8 tokens.
//   v9, v10 (one token): v4 with the first two super-chunks' loads issued before the prologue (tables, x) and
//      the codes of b >= 5 built 8 at a time in 4-bit lanes; 8 / 16 warps per block (see apq_gemv_rl9_kernel);
//   v11, v12: v9, v10 with singles at every b (no pair tables to merge).
//   v13, v14 (one token; see apq_gemv_rl13_kernel): persistent blocks striding over row groups, x staged once
//      per block; b <= 3 with the row's table in 4 registers of its lane (byte-permute lookups, no shared
//      memory per lookup), b >= 4 singles in double-buffered shared tables addressed by one byte-permute;
//      plane loads running ahead across row groups; v14 = v13 with more warps per SM.
// The default (variant 0) is v4 for one token and v8 for 2..8 tokens: in the second H100 run of 2026-11-24
// (docs/RESULTS.md) v4 stayed the fastest at one token (v7 / v8 not ahead) and v8 took 69-102 us at 8
// tokens on the big shapes where v2 took 173-393 us.
// Above ~8 tokens: ggml_ext_apq_dequantize_rl_cuda to fp16 and cuBLAS.
#include "anyprec_cuda.h"

#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define APQ_WARPS 8
#define APQ_ROWS_PER_BLOCK 32

template <int BITS>
static __global__ void apq_gemv_kernel(const uint32_t * __restrict__ planes, const __half * __restrict__ tables,
                                       int64_t n_rows, int64_t n_per_row, int seed_bits,
                                       const float * __restrict__ x, float * __restrict__ y) {
    extern __shared__ float smem[];
    const int64_t n_chunks = n_per_row / 32;
    float *       xs       = smem;                            // n_per_row floats, transposed
    float *       luts     = smem + n_per_row;                // APQ_WARPS x 2^BITS floats
    for (int64_t i = threadIdx.x; i < n_per_row; i += blockDim.x) {
        xs[(i % 32) * n_chunks + i / 32] = x[i];
    }
    __syncthreads();
    const int     warp         = threadIdx.x / 32;
    const int     lane         = threadIdx.x % 32;
    float *       lut          = luts + warp * (1 << BITS);
    const int64_t plane_words  = n_rows * n_chunks;           // 32-bit words per plane
    const int64_t tab0         = n_rows * ((1 << BITS) - (1 << seed_bits));
    const int64_t row_begin    = (int64_t) blockIdx.x * APQ_ROWS_PER_BLOCK;
    for (int64_t r = row_begin + warp; r < row_begin + APQ_ROWS_PER_BLOCK && r < n_rows; r += APQ_WARPS) {
        const __half * t = tables + tab0 + r * (1 << BITS);
        for (int c = lane; c < (1 << BITS); c += 32) {
            lut[c] = __half2float(t[c]);
        }
        __syncwarp();
        float acc = 0.0f;
        for (int64_t c = lane; c < n_chunks; c += 32) {
            uint32_t w[BITS];
#pragma unroll
            for (int k = 0; k < BITS; k++) {
                w[k] = __ldg(planes + k * plane_words + r * n_chunks + c);
            }
#pragma unroll
            for (int j = 0; j < 32; j++) {
                int code = 0;
#pragma unroll
                for (int k = 0; k < BITS; k++) {
                    code |= ((w[k] >> j) & 1) << (BITS - 1 - k);
                }
                acc += lut[code] * xs[j * n_chunks + c];
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        }
        if (lane == 0) {
            y[r] = acc;
        }
        __syncwarp();
    }
}

template <int BITS>
static cudaError_t apq_launch(const uint8_t * planes, const uint16_t * tables, int64_t n_rows, int64_t n_per_row,
                              int seed_bits, const float * x, float * y, cudaStream_t stream) {
    const size_t smem = sizeof(float) * ((size_t) n_per_row + (size_t) APQ_WARPS * (1u << BITS));
    cudaError_t  e    = cudaFuncSetAttribute(apq_gemv_kernel<BITS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int) smem);
    if (e != cudaSuccess) {
        return e;
    }
    const unsigned blocks = (unsigned) ((n_rows + APQ_ROWS_PER_BLOCK - 1) / APQ_ROWS_PER_BLOCK);
    apq_gemv_kernel<BITS><<<blocks, 32 * APQ_WARPS, smem, stream>>>(
        (const uint32_t *) planes, (const __half *) tables, n_rows, n_per_row, seed_bits, x, y);
    return cudaGetLastError();
}

// planes, tables, x, y in device memory (the file's bytes as they are); n_per_row a multiple of 32 and at
// most about 50000 (x is staged in shared memory); 1 <= seed_bits <= bits <= 8. Returns cudaErrorInvalidValue
// for bad arguments.
extern "C" cudaError_t ggml_ext_apq_gemv_cuda(const uint8_t * planes, const uint16_t * tables, int64_t n_rows,
                                              int64_t n_per_row, int seed_bits, int bits, const float * x, float * y,
                                              cudaStream_t stream) {
    if (n_per_row <= 0 || n_per_row % 32 || seed_bits < 1 || bits < seed_bits || bits > 8 || n_rows < 0) {
        return cudaErrorInvalidValue;
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    switch (bits) {
        case 1: return apq_launch<1>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 2: return apq_launch<2>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 3: return apq_launch<3>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 4: return apq_launch<4>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 5: return apq_launch<5>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 6: return apq_launch<6>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 7: return apq_launch<7>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        default: return apq_launch<8>(planes, tables, n_rows, n_per_row, seed_bits, x, y, stream);
    }
}

// ---------------------------------------------------------------------------------------------------------
// row-lane layout

extern "C" size_t ggml_ext_apq_rl_plane_size(int64_t n_rows, int64_t n_per_row) {
    return (size_t) ((n_rows + 31) / 32) * 32 * (size_t) (n_per_row / 8);
}

// one thread per output word
static __global__ void apq_relayout_kernel(const uint8_t * __restrict__ planes, int64_t n, int64_t k, int P,
                                           uint32_t * __restrict__ out) {
    const int64_t Q     = k / 128;
    const int64_t G     = (n + 31) / 32;
    const int64_t total = (int64_t) P * G * Q * 128;
    for (int64_t o = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; o < total; o += (int64_t) gridDim.x * blockDim.x) {
        const int     t    = (int) (o & 3);
        const int     l    = (int) ((o >> 2) & 31);
        int64_t       rest = o >> 7;
        const int64_t q    = rest % Q;
        rest /= Q;
        const int64_t g = rest % G;
        const int64_t p = rest / G;
        const int64_t r = 32 * g + l;
        uint32_t      v = 0;
        if (r < n) {
            // file word: bit u = weight 32 c + u (bytes little-endian, bit j % 8 of byte j / 8)
            const uint8_t * src = planes + p * n * (k / 8) + r * (k / 8) + (4 * q + t) * 4;
            const uint32_t  in  = (uint32_t) src[0] | ((uint32_t) src[1] << 8) | ((uint32_t) src[2] << 16) |
                                ((uint32_t) src[3] << 24);
#pragma unroll
            for (int i = 0; i < 4; i++) {
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    v |= ((in >> (4 * m + i)) & 1u) << (8 * i + m);
                }
            }
        }
        out[o] = v;
    }
}

extern "C" cudaError_t ggml_ext_apq_relayout_cuda(const uint8_t * planes, int64_t n_rows, int64_t n_per_row,
                                                  int parent_bits, uint8_t * out, cudaStream_t stream) {
    if (n_rows < 0 || n_per_row <= 0 || n_per_row % 128 || parent_bits < 1 || parent_bits > 8) {
        return cudaErrorInvalidValue;
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    const int64_t words  = (int64_t) parent_bits * (int64_t) (ggml_ext_apq_rl_plane_size(n_rows, n_per_row) / 4);
    const int64_t blocks = (words + 255) / 256 < 65535 ? (words + 255) / 256 : 65535;
    apq_relayout_kernel<<<(unsigned) blocks, 256, 0, stream>>>(planes, n_rows, n_per_row, parent_bits,
                                                               (uint32_t *) out);
    return cudaGetLastError();
}

template <int B> static __device__ __forceinline__ void rl_load(uint4 (&v)[B], const uint4 * p, int64_t plane_u4) {
#pragma unroll
    for (int kk = 0; kk < B; kk++) {
        v[kk] = __ldg(p + kk * plane_u4);
    }
}

static __device__ __forceinline__ uint32_t rl_word(const uint4 & v, int t) {
    return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
}

// codes of the b planes' words w: mask 0x11111111 gives 8 codes of <= 4 bits (byte i: weight 4m+i in the low
// nibble, 16+4m+i in the high one), mask 0x01010101 4 codes (byte i: weight 4m+i)
template <int B> static __device__ __forceinline__ uint32_t rl_codes(const uint32_t (&w)[B], int m, uint32_t mask) {
    uint32_t o = 0;
#pragma unroll
    for (int kk = 0; kk < B; kk++) {
        o |= ((w[kk] >> m) & mask) << (B - 1 - kk);
    }
    return o;
}

template <bool XS> static __device__ __forceinline__ float4 rl_x(const float * p) {
    if constexpr (XS) {
        return *(const float4 *) p;
    } else {
        return __ldg((const float4 *) p);
    }
}

// The 32 rows' tables of row group r0 as float in shared memory, lane-transposed: ts[e * 32 + l] =
// T_b[r0 + l][e] (conflict-free lookups whatever the table size); rows past n read as 0. 16-byte loads of 8
// entries where the tables are aligned (TB >= 8 and S >= 3). Every thread of the block takes part
// (nthreads = blockDim.x); the caller syncs before reading.
template <int TB>
static __device__ __forceinline__ void stage_tables(float * ts, const __half * __restrict__ tab, int64_t r0,
                                                    int64_t n, int S, int nthreads) {
    if (TB >= 8 && S >= 3) {
        for (int idx = threadIdx.x; idx < 32 * TB / 8; idx += nthreads) {
            const int     l = idx & 31, c = idx >> 5;
            const int64_t r = r0 + l;
            uint4         v = make_uint4(0, 0, 0, 0);
            if (r < n) {
                v = __ldg((const uint4 *) (tab + r * TB) + c);
            }
            const __half * hv = (const __half *) &v;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                ts[(8 * c + u) * 32 + l] = __half2float(hv[u]);
            }
        }
    } else {
        for (int idx = threadIdx.x; idx < 32 * TB; idx += nthreads) {
            const int     l = idx & 31, e = idx >> 5;
            const int64_t r = r0 + l;
            ts[idx]         = r < n ? __half2float(tab[r * TB + e]) : 0.0f;
        }
    }
}

// One block per group of 32 rows, W warps splitting the row length (super-chunks q = warp, warp + W, ...);
// NT: tokens handled (nt <= NT at run time); PAIR: pair tables (B <= 4); XS: x staged in shared memory;
// CL > 1: a cluster of CL blocks per row group splits the row length further (more warps in flight for
// few rows), each building the tables, the row sums added through distributed shared memory.
template <int B, int NT, int W, bool PAIR, bool XS, int CL>
static __global__ void __launch_bounds__(32 * W)
    apq_gemv_rl_kernel(const uint4 * __restrict__ rl, const __half * __restrict__ tables, int64_t n, int64_t k,
                       int S, int nt, int ks, int64_t plane_u4, const float * __restrict__ x,
                       float * __restrict__ y) {
    constexpr int E = PAIR ? (16 << B) : (1 << B);  // table entries per lane (pairs: index lo | hi << 4)
    extern __shared__ float4 smem4[];
    float *       sm   = (float *) smem4;
    const int     lane = threadIdx.x & 31;
    const int     warp = threadIdx.x >> 5;
    constexpr bool SLICE = CL < 0;  // ks blocks per row group, each a contiguous slice of QS super-chunks
    const int     nblk = CL > 0 ? CL : ks;  // blocks per row group (CL <= 0: ks, sums added with atomics)
    const int64_t g    = blockIdx.x / nblk;
    const int     crank = (int) (blockIdx.x % nblk);
    const int64_t r0   = 32 * g;
    constexpr int  TB  = 1 << B;
    const __half * tab = tables + n * (TB - (1 << S));
    const int64_t  Q    = k / 128;
    const int64_t  QS   = SLICE ? (Q + ks - 1) / ks : Q;           // super-chunks per slice
    const int64_t  q0   = SLICE ? (int64_t) crank * QS : 0;        // this block's first one
    const int64_t  q1   = SLICE ? (q0 + QS < Q ? q0 + QS : Q) : Q;  // and its end
    const int      qstep = SLICE ? W : W * nblk;
    const int64_t  xstride = SLICE ? QS * 128 : k;                  // token stride of x as the loop reads it
    const uint4 *  base = rl + g * Q * 32 + lane;
    int64_t        q    = SLICE ? q0 + warp : (int64_t) crank * W + warp;
    uint4          cur[B];
    if (q < q1) {  // the first planes' loads fly while the tables are built
        rl_load<B>(cur, base + q * 32, plane_u4);
    }
    // the 32 rows' tables as float, lane-transposed: ts[e * 32 + l] = T_b[r0 + l][e] (for pairs: staged, then
    // merged below). 16-byte loads of 8 entries where the tables are aligned (TB >= 8 and S >= 3).
    float * ts = PAIR ? sm + 2 * E * 32 : sm;
    stage_tables<TB>(ts, tab, r0, n, S, 32 * W);
    if constexpr (PAIR) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < E * 32; idx += 32 * W) {
            const int l = idx & 31, e = idx >> 5;
            const int lo = e & 15, hi = e >> 4;
            ((float2 *) sm)[idx] = lo < TB ? make_float2(ts[lo * 32 + l], ts[hi * 32 + l]) : make_float2(0.0f, 0.0f);
        }
    }
    float * red = sm + (PAIR ? 2 * E * 32 + TB * 32 : E * 32);
    float * fin = red + NT * W * 32;  // CL > 1: this block's row sums
    float * xs  = fin + (CL > 1 ? NT * 32 : 0);
    if constexpr (XS && SLICE) {  // only this slice of x, all tokens: xs[tt * QS * 128 + j] = x[tt][q0 * 128 + j]
        for (int64_t i = threadIdx.x; i < (int64_t) nt * QS * 32; i += 32 * W) {
            const int64_t tt = i / (QS * 32), j = i % (QS * 32);
            ((float4 *) xs)[i] = q0 * 32 + j < k / 4 ? __ldg((const float4 *) (x + tt * k) + q0 * 32 + j)
                                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    } else if constexpr (XS) {
        for (int64_t i = threadIdx.x; i < (int64_t) nt * k / 4; i += 32 * W) {
            ((float4 *) xs)[i] = __ldg((const float4 *) x + i);
        }
    }
    __syncthreads();
    const float *  xb  = XS ? xs : x;
    const int64_t  xq0 = XS && SLICE ? q0 : 0;  // super-chunk at xb[0]
    const float2 * lp  = (const float2 *) sm + lane;
    const float *  ls  = sm + lane;
    float          acc[NT][2];  // two chains per token (FMA latency)
#pragma unroll
    for (int tt = 0; tt < NT; tt++) {
        acc[tt][0] = acc[tt][1] = 0.0f;
    }
    for (; q < q1; q += qstep) {
        uint4 nxt[B];  // next super-chunk, loaded before this one is used (the last one reloads itself)
        rl_load<B>(nxt, base + (q + qstep < q1 ? q + qstep : q) * 32, plane_u4);
#pragma unroll
        for (int t = 0; t < 4; t++) {
            uint32_t w[B];
#pragma unroll
            for (int kk = 0; kk < B; kk++) {
                w[kk] = rl_word(cur[kk], t);
            }
            const float * xq = xb + (q - xq0) * 128 + 32 * t;
            if constexpr (PAIR) {
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    const uint32_t o = rl_codes<B>(w, m, 0x11111111u);
                    float2         v[4];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        v[i] = lp[((o >> (8 * i)) & 0xff) * 32];
                    }
#pragma unroll
                    for (int tt = 0; tt < NT; tt++) {
                        if (tt < nt) {
                            const float4 xl = rl_x<XS>(xq + tt * xstride + 4 * m);
                            const float4 xh = rl_x<XS>(xq + tt * xstride + 4 * m + 16);
                            acc[tt][0] = fmaf(v[0].x, xl.x, acc[tt][0]);
                            acc[tt][1] = fmaf(v[0].y, xh.x, acc[tt][1]);
                            acc[tt][0] = fmaf(v[1].x, xl.y, acc[tt][0]);
                            acc[tt][1] = fmaf(v[1].y, xh.y, acc[tt][1]);
                            acc[tt][0] = fmaf(v[2].x, xl.z, acc[tt][0]);
                            acc[tt][1] = fmaf(v[2].y, xh.z, acc[tt][1]);
                            acc[tt][0] = fmaf(v[3].x, xl.w, acc[tt][0]);
                            acc[tt][1] = fmaf(v[3].y, xh.w, acc[tt][1]);
                        }
                    }
                }
            } else {
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    const uint32_t o = rl_codes<B>(w, m, 0x01010101u);
                    float          v[4];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        v[i] = ls[((o >> (8 * i)) & 0xff) * 32];
                    }
#pragma unroll
                    for (int tt = 0; tt < NT; tt++) {
                        if (tt < nt) {
                            const float4 xv = rl_x<XS>(xq + tt * xstride + 4 * m);
                            acc[tt][0] = fmaf(v[0], xv.x, acc[tt][0]);
                            acc[tt][1] = fmaf(v[1], xv.y, acc[tt][1]);
                            acc[tt][0] = fmaf(v[2], xv.z, acc[tt][0]);
                            acc[tt][1] = fmaf(v[3], xv.w, acc[tt][1]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int kk = 0; kk < B; kk++) {
            cur[kk] = nxt[kk];
        }
    }
#pragma unroll
    for (int tt = 0; tt < NT; tt++) {
        red[(tt * W + warp) * 32 + lane] = acc[tt][0] + acc[tt][1];
    }
    __syncthreads();
    if constexpr (CL > 1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // clusters: sm_90 and later (the launcher refuses before)
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        for (int o = threadIdx.x; o < NT * 32; o += 32 * W) {
            float s = 0.0f;
#pragma unroll
            for (int ww = 0; ww < W; ww++) {
                s += red[((o >> 5) * W + ww) * 32 + (o & 31)];
            }
            fin[o] = s;
        }
        cluster.sync();
        if (crank == 0) {
            for (int o = threadIdx.x; o < NT * 32; o += 32 * W) {
                const int     tt = o >> 5, l = o & 31;
                const int64_t r  = r0 + l;
                if (tt < nt && r < n) {
                    float s = 0.0f;
#pragma unroll
                    for (int c = 0; c < CL; c++) {
                        s += cluster.map_shared_rank(fin, c)[o];
                    }
                    y[tt * n + r] = s;
                }
            }
        }
        cluster.sync();  // the other blocks' shared memory stays until block 0 has read it
#else
        __trap();
#endif
    } else {
        for (int o = threadIdx.x; o < NT * 32; o += 32 * W) {
            const int     tt = o >> 5, l = o & 31;
            const int64_t r  = r0 + l;
            if (tt < nt && r < n) {
                float s = 0.0f;
#pragma unroll
                for (int ww = 0; ww < W; ww++) {
                    s += red[(tt * W + ww) * 32 + l];
                }
                if constexpr (CL <= 0) {
                    atomicAdd(y + tt * n + r, s);
                } else {
                    y[tt * n + r] = s;
                }
            }
        }
    }
}

template <int B, int NT, int W, bool PAIR, bool XS, int CL>
static cudaError_t rl_launch(const uint8_t * rl, const uint16_t * tables, int64_t n, int64_t k, int S, int nt,
                             const float * x, float * y, cudaStream_t stream) {
    constexpr int E   = PAIR ? (16 << B) : (1 << B);
    int           dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64 ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        return cudaErrorInvalidDevice;
    }
    // split-K (CL <= 0): ks blocks per row group, at least ~4 blocks per SM; CL < 0 (contiguous slices with
    // their x in shared memory) also at most 32 KiB of x per block
    const int64_t G  = (n + 31) / 32;
    const int64_t Q  = k / 128;
    int64_t       ks = CL > 0 ? CL : (4 * (int64_t) sms + G - 1) / G;
    if constexpr (CL == 0) {
        ks = ks > (Q + W - 1) / W ? (Q + W - 1) / W : ks;
    } else if constexpr (CL < 0) {
        const int64_t qs_max = 8192 / (128 * nt) > 0 ? 8192 / (128 * nt) : 1;  // 32 KiB of x (2 blocks/SM)
        ks                   = ks > (Q + qs_max - 1) / qs_max ? ks : (Q + qs_max - 1) / qs_max;
        ks                   = ks > Q ? Q : ks;
    }
    ks                = ks < 1 ? 1 : ks;
    const int64_t QS  = CL < 0 ? (Q + ks - 1) / ks : Q;
    const size_t smem = (size_t) (PAIR ? 8 * E * 32 + 4 * 32 * (1 << B) : 4 * E * 32) + 4u * NT * W * 32 +
                        (CL > 1 ? 4u * NT * 32 : 0) + (XS ? 4u * (size_t) nt * QS * 128 : 0);
    static size_t attr[64];  // per device: dynamic shared memory this instantiation may use (raised on demand)
    if (smem > 48 * 1024 && smem > attr[dev]) {
        const cudaError_t e = cudaFuncSetAttribute(apq_gemv_rl_kernel<B, NT, W, PAIR, XS, CL>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
        if (e != cudaSuccess) {
            return e;
        }
        attr[dev] = smem;
    }
    const int64_t plane_u4 = (int64_t) (ggml_ext_apq_rl_plane_size(n, k) / 16);
    if constexpr (CL == 1) {
        apq_gemv_rl_kernel<B, NT, W, PAIR, XS, 1><<<(unsigned) ((n + 31) / 32), 32 * W, smem, stream>>>(
            (const uint4 *) rl, (const __half *) tables, n, k, S, nt, 1, plane_u4, x, y);
        return cudaGetLastError();
    } else if constexpr (CL <= 0) {  // split-K: y zeroed, the blocks' partial sums added
        cudaError_t e = cudaMemsetAsync(y, 0, sizeof(float) * (size_t) nt * (size_t) n, stream);
        if (e != cudaSuccess) {
            return e;
        }
        apq_gemv_rl_kernel<B, NT, W, PAIR, XS, CL><<<(unsigned) (G * ks), 32 * W, smem, stream>>>(
            (const uint4 *) rl, (const __half *) tables, n, k, S, nt, (int) ks, plane_u4, x, y);
        return cudaGetLastError();
    } else {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9) {
            return cudaErrorInvalidValue;  // clusters need sm_90
        }
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim            = dim3((unsigned) ((n + 31) / 32 * CL));
        cfg.blockDim           = dim3(32 * W);
        cfg.dynamicSmemBytes   = smem;
        cfg.stream             = stream;
        cudaLaunchAttribute attr_cl[1];
        attr_cl[0].id               = cudaLaunchAttributeClusterDimension;
        attr_cl[0].val.clusterDim.x = CL;
        attr_cl[0].val.clusterDim.y = 1;
        attr_cl[0].val.clusterDim.z = 1;
        cfg.attrs                   = attr_cl;
        cfg.numAttrs                = 1;
        return cudaLaunchKernelEx(&cfg, apq_gemv_rl_kernel<B, NT, W, PAIR, XS, CL>, (const uint4 *) rl,
                                  (const __half *) tables, n, k, S, nt, CL, plane_u4, x, y);
    }
}

template <int NT, int W, bool PAIR, bool XS, int CL = 1>
static cudaError_t rl_bits(int b, const uint8_t * rl, const uint16_t * t, int64_t n, int64_t k, int S, int nt,
                           const float * x, float * y, cudaStream_t st) {
    switch (b) {
        case 1: return rl_launch<1, NT, W, PAIR, XS, CL>(rl, t, n, k, S, nt, x, y, st);
        case 2: return rl_launch<2, NT, W, PAIR, XS, CL>(rl, t, n, k, S, nt, x, y, st);
        case 3: return rl_launch<3, NT, W, PAIR, XS, CL>(rl, t, n, k, S, nt, x, y, st);
        case 4: return rl_launch<4, NT, W, PAIR, XS, CL>(rl, t, n, k, S, nt, x, y, st);
        case 5: return rl_launch<5, NT, W, false, XS, CL>(rl, t, n, k, S, nt, x, y, st);
        case 6: return rl_launch<6, NT, W, false, XS, CL>(rl, t, n, k, S, nt, x, y, st);
        case 7: return rl_launch<7, NT, W, false, XS, CL>(rl, t, n, k, S, nt, x, y, st);
        default: return rl_launch<8, NT, W, false, XS, CL>(rl, t, n, k, S, nt, x, y, st);
    }
}

// ---------------------------------------------------------------------------------------------------------
// v9 (one token): v4's block (one block of V9_W warps per 32-row group, x and the tables in shared memory)
// with three changes aimed at what kept v4 at 16-54% of bandwidth (docs/RESULTS.md, "Any-precision"):
//   * every lane issues the loads of its first TWO super-chunks (2 x b x 16 bytes) before the table
//     staging and the x staging, so the DRAM latency of the first round overlaps the block's prologue
//     (v4 issued one; at 4096 columns a warp has only 4 super-chunks, so the prologue was half its life);
//   * b >= 5 (singles) build the codes 8 at a time in 4-bit lanes, like the pair path: the top 4 planes
//     and the b-4 lower ones each give a nibble code per weight (mask 0x11111111), merged into byte codes
//     with one shift and one and/or per 4 weights. v4 built them 4 at a time (mask 0x01010101), b shift +
//     and + shift + or per 4 weights. A small cut: the PTX of the inner loop at 8 bits has 12.5
//     instructions per weight for v4, 11.1 for v9 (the lookup addressing is now the larger part);
//   * the launcher does no per-call device queries (v4's asks for the SM count each call).
// Pairs (b <= 4) as in v4. The block's row sums go through shared memory; one store per row, no atomics.
// v9: 8 warps per block (as v4); v10: 16 (twice the loads in flight per SM where the rows give fewer blocks
// than the SMs can hold: 4096 rows are 128 blocks for the H100's 132 SMs). v11 / v12: v9 / v10 without pair
// tables (singles at every b, codes in 4-bit lanes): a pair lookup reads 8 bytes per lane, two shared-memory
// wavefronts, as much as two single lookups, so pairs save only instructions, while their merge is part of
// the prologue (at 4 bits 8192 float2 per block, ~0.5 us) and their 64 KiB per block (4 bits) limits the
// blocks per SM.

// byte codes of weights 4m+i (lo) and 16+4m+i (hi), i < 4, of the b planes' words w, m < 4
template <int B>
static __device__ __forceinline__ void rl_codes_nib(const uint32_t (&w)[B], int m, uint32_t & lo, uint32_t & hi) {
    constexpr int BT = B < 4 ? B : 4;  // planes in the top nibble code
    uint32_t      t  = 0, u = 0;
#pragma unroll
    for (int kk = 0; kk < BT; kk++) {
        t |= ((w[kk] >> m) & 0x11111111u) << (BT - 1 - kk);
    }
#pragma unroll
    for (int kk = BT; kk < B; kk++) {
        u |= ((w[kk] >> m) & 0x11111111u) << (B - 1 - kk);
    }
    lo = ((t & 0x0f0f0f0fu) << (B - BT)) | (u & 0x0f0f0f0fu);
    hi = (((t >> 4) & 0x0f0f0f0fu) << (B - BT)) | ((u >> 4) & 0x0f0f0f0fu);
}

template <int B, int W, bool PAIRS>
static __global__ void __launch_bounds__(32 * W)
    apq_gemv_rl9_kernel(const uint4 * __restrict__ rl, const __half * __restrict__ tables, int64_t n, int64_t k,
                        int S, int64_t plane_u4, const float * __restrict__ x, float * __restrict__ y) {
    constexpr bool PAIR = PAIRS && B <= 4;
    constexpr int  TB   = 1 << B;
    constexpr int  E    = PAIR ? (16 << B) : TB;
    extern __shared__ float4 smem4[];
    float *        sm   = (float *) smem4;
    const int      lane = threadIdx.x & 31;
    const int      warp = threadIdx.x >> 5;
    const int64_t  g    = blockIdx.x;
    const int64_t  r0   = 32 * g;
    const int64_t  Q    = k / 128;
    const uint4 *  base = rl + g * Q * 32 + lane;
    int64_t        q    = warp;
    uint4          cur[B], nxt[B];
    if (q < Q) {
        rl_load<B>(cur, base + q * 32, plane_u4);
    }
    if (q + W < Q) {
        rl_load<B>(nxt, base + (q + W) * 32, plane_u4);
    }
    const __half * tab = tables + n * (TB - (1 << S));
    float *        ts  = PAIR ? sm + 2 * E * 32 : sm;
    stage_tables<TB>(ts, tab, r0, n, S, 32 * W);
    float * red = sm + (PAIR ? 2 * E * 32 + TB * 32 : E * 32);
    float * xs  = red + W * 32;
    for (int64_t i = threadIdx.x; i < k / 4; i += 32 * W) {
        ((float4 *) xs)[i] = __ldg((const float4 *) x + i);
    }
    if constexpr (PAIR) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < E * 32; idx += 32 * W) {
            const int l = idx & 31, e = idx >> 5;
            const int lo = e & 15, hi = e >> 4;
            ((float2 *) sm)[idx] = lo < TB ? make_float2(ts[lo * 32 + l], ts[hi * 32 + l]) : make_float2(0.0f, 0.0f);
        }
    }
    __syncthreads();
    const float2 * lp   = (const float2 *) sm + lane;
    const float *  ls   = sm + lane;
    float          a0   = 0.0f, a1 = 0.0f;
    for (; q < Q; q += W) {
#pragma unroll
        for (int t = 0; t < 4; t++) {
            uint32_t w[B];
#pragma unroll
            for (int kk = 0; kk < B; kk++) {
                w[kk] = rl_word(cur[kk], t);
            }
            const float * xq = xs + q * 128 + 32 * t;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const float4 xl = *(const float4 *) (xq + 4 * m);
                const float4 xh = *(const float4 *) (xq + 4 * m + 16);
                if constexpr (PAIR) {
                    const uint32_t o = rl_codes<B>(w, m, 0x11111111u);
                    float2         v[4];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        v[i] = lp[((o >> (8 * i)) & 0xff) * 32];
                    }
                    a0 = fmaf(v[0].x, xl.x, a0);
                    a1 = fmaf(v[0].y, xh.x, a1);
                    a0 = fmaf(v[1].x, xl.y, a0);
                    a1 = fmaf(v[1].y, xh.y, a1);
                    a0 = fmaf(v[2].x, xl.z, a0);
                    a1 = fmaf(v[2].y, xh.z, a1);
                    a0 = fmaf(v[3].x, xl.w, a0);
                    a1 = fmaf(v[3].y, xh.w, a1);
                } else {
                    uint32_t lo, hi;
                    rl_codes_nib<B>(w, m, lo, hi);
                    a0 = fmaf(ls[(lo & 0xff) * 32], xl.x, a0);
                    a1 = fmaf(ls[(hi & 0xff) * 32], xh.x, a1);
                    a0 = fmaf(ls[((lo >> 8) & 0xff) * 32], xl.y, a0);
                    a1 = fmaf(ls[((hi >> 8) & 0xff) * 32], xh.y, a1);
                    a0 = fmaf(ls[((lo >> 16) & 0xff) * 32], xl.z, a0);
                    a1 = fmaf(ls[((hi >> 16) & 0xff) * 32], xh.z, a1);
                    a0 = fmaf(ls[(lo >> 24) * 32], xl.w, a0);
                    a1 = fmaf(ls[(hi >> 24) * 32], xh.w, a1);
                }
            }
        }
        // shift the prefetch window: cur <- nxt, nxt <- the super-chunk after it (if any)
#pragma unroll
        for (int kk = 0; kk < B; kk++) {
            cur[kk] = nxt[kk];
        }
        if (q + 2 * W < Q) {
            rl_load<B>(nxt, base + (q + 2 * W) * 32, plane_u4);
        }
    }
    red[warp * 32 + lane] = a0 + a1;
    __syncthreads();
    if (threadIdx.x < 32) {
        const int64_t r = r0 + threadIdx.x;
        float         s = 0.0f;
#pragma unroll
        for (int ww = 0; ww < W; ww++) {
            s += red[ww * 32 + threadIdx.x];
        }
        if (r < n) {
            y[r] = s;
        }
    }
}

template <int B, int W, bool PAIRS>
static cudaError_t rl9_launch(const uint8_t * rl, const uint16_t * tables, int64_t n, int64_t k, int S,
                              const float * x, float * y, cudaStream_t stream) {
    constexpr bool PAIR = PAIRS && B <= 4;
    constexpr int  E    = PAIR ? (16 << B) : (1 << B);
    const size_t   smem = (size_t) (PAIR ? 8 * E * 32 + 4 * 32 * (1 << B) : 4 * E * 32) + 4u * W * 32 + 4u * (size_t) k;
    if (smem > 48 * 1024) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
            return cudaErrorInvalidDevice;
        }
        static size_t attr[64];  // per device: dynamic shared memory allowed so far (raised on demand)
        if (smem > attr[dev]) {
            const cudaError_t e =
                cudaFuncSetAttribute(apq_gemv_rl9_kernel<B, W, PAIRS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
            if (e != cudaSuccess) {
                return e;
            }
            attr[dev] = smem;
        }
    }
    const int64_t plane_u4 = (int64_t) (ggml_ext_apq_rl_plane_size(n, k) / 16);
    apq_gemv_rl9_kernel<B, W, PAIRS><<<(unsigned) ((n + 31) / 32), 32 * W, smem, stream>>>(
        (const uint4 *) rl, (const __half *) tables, n, k, S, plane_u4, x, y);
    return cudaGetLastError();
}

template <int W, bool PAIRS>
static cudaError_t rl9_bits(int b, const uint8_t * rl, const uint16_t * t, int64_t n, int64_t k, int S,
                            const float * x, float * y, cudaStream_t st) {
    switch (b) {
        case 1: return rl9_launch<1, W, PAIRS>(rl, t, n, k, S, x, y, st);
        case 2: return rl9_launch<2, W, PAIRS>(rl, t, n, k, S, x, y, st);
        case 3: return rl9_launch<3, W, PAIRS>(rl, t, n, k, S, x, y, st);
        case 4: return rl9_launch<4, W, PAIRS>(rl, t, n, k, S, x, y, st);
        case 5: return rl9_launch<5, W, PAIRS>(rl, t, n, k, S, x, y, st);
        case 6: return rl9_launch<6, W, PAIRS>(rl, t, n, k, S, x, y, st);
        case 7: return rl9_launch<7, W, PAIRS>(rl, t, n, k, S, x, y, st);
        default: return rl9_launch<8, W, PAIRS>(rl, t, n, k, S, x, y, st);
    }
}


// ---------------------------------------------------------------------------------------------------------
// v13 (one token): aimed at what the L2-cold round 4 showed (docs/RESULTS.md, "Any-precision"): v4 at 24-59% of bandwidth, its inner loop instruction- and shared-memory-bound
// (v4 at 3 bits: ~5 instructions and 1.25 shared-memory wavefronts per weight and lane, i.e. at most ~26
// weights per SM clock, while the H100's DRAM delivers ~35 3-bit weights per SM clock), and its block
// prologue (tables staged, pairs merged, x staged) in front of every row group. Changes:
//   * b <= 3: the row's 8 fp16 centroids live in 4 REGISTERS of its lane (low bytes of entries 0-3 / 4-7,
//     high bytes of entries 0-3 / 4-7); the 4-bit-lane codes are byte-permute selectors, so one PRMT looks
//     up 4 weights' low bytes, one their high bytes, two more interleave them into two half2: no shared
//     memory per lookup at all (x only), ~4 instructions per weight (2 of them the fp16->fp32 conversion
//     and the FFMA), nothing to stage or merge per row group (one 16-byte load per lane);
//   * b >= 4: singles, float, lane-transposed in shared memory, the lookup address made by ONE PRMT from
//     the byte code (entry e of lane l at byte e * 256 + l * 4: the code byte is the address's second byte,
//     the lane's offset its first); the other 128 bytes of each 256 hold a second buffer, so the next row
//     group's table is converted into it while the current one is used (double-buffered, no extra barrier);
//     codes of b >= 5 built 8 at a time in 4-bit lanes (v9's rl_codes_nib);
//   * a persistent grid (at most the blocks that fit on the SMs; each block strides over row groups), x
//     staged once per block; the W warps of a block split each row group's super-chunks, and each warp's
//     plane loads run D super-chunks ahead in registers ACROSS row-group boundaries (and across the one
//     __syncthreads per row group, which also publishes the next table and the row sums: the partial sums
//     go to a double-buffered shared array that warp 0 adds after the barrier); the next group's raw table
//     is loaded at the start of a group and converted at its end, so its latency hides behind the group;
//   * 16 warps per block where the row groups are fewer than the SMs (4096-row matrices) or the table is
//     large (b >= 7), 8 otherwise.
static __device__ __forceinline__ float2 apq_h2f2(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2 *>(&u));
}

// v15 (HYB, b = 3 only): half the lookups (m = 0, 1: weights 4m+i, 16+4m+i of each word) through the
// register tables, the other half (m = 2, 3) through float2 PAIR tables in shared memory, which the lanes build
// from their own register tables (64 pairs per row and row group, double-buffered: index byte lo | 8 u | 16 hi
// for buffer u, entry at byte index * 256 + 8 l): a pair lookup is 1 PRMT + 1 LDS.64 + 2 FFMA for 2 weights
// (2 wavefronts) against 2 PRMT + 1 conversion + 1 FFMA per weight in registers, so the split balances the
// issue slots (register path) against the shared-memory pipe (pair path).
// NM matrices sharing x and the row length (q/k/v, gate/up: one launch); their row groups are numbered one
// after the other (gend: cumulative row groups), every field picked with static indices (no local copy).
template <int NM> struct apq13_set {
    const uint4 *  rl[NM];
    const __half * tab[NM];  // precision b's tables (offset applied)
    float *        y[NM];
    int64_t        n[NM];
    int64_t        plane_u4[NM];
    int64_t        gend[NM];
};

struct apq13_loc {
    const uint4 *  rl;
    const __half * tab;
    float *        y;
    int64_t        n, pu4, gl;  // rows, plane stride (uint4), row group within the matrix
};

template <int B, int W, int D, int MB, bool HYB, int NM>
static __global__ void __launch_bounds__(32 * W, MB)
    apq_gemv_rl13_kernel(const apq13_set<NM> ms, int64_t k, const float * __restrict__ x) {
    constexpr bool REG    = B <= 3;                  // tables in registers, byte-permute lookups
    constexpr bool PH     = HYB && B == 3;           // v15: and pair tables for half the lookups
    constexpr int  TB     = 1 << B;
    constexpr int  TBYTES = REG ? 0 : TB * 256;      // two interleaved float tables (b >= 4)
    // v15's pair tables: static shared memory, so that the lookups' address is the PRMT's result plus an
    // immediate (in dynamic shared memory ptxas added the window's base in a register per lookup)
    __shared__ __align__(16) char pht[PH ? 128 * 256 : 16];
    constexpr int  NR     = REG ? 1 : (4 * TB + 32 * W - 1) / (32 * W);  // raw 16-byte table pieces per thread
    extern __shared__ float4 smem4[];
    char *         smc   = (char *) smem4;
    float *        red   = (float *) (smc + TBYTES);  // 2 x W x 32 partial row sums
    float *        xs    = red + 2 * W * 32;          // x, k floats
    const int      lane  = threadIdx.x & 31;
    const int      warp  = threadIdx.x >> 5;
    const int64_t  G     = ms.gend[NM - 1];
    const int64_t  Q     = k / 128;
    const int64_t  gstep = gridDim.x;
    const bool     act   = warp < Q;                         // the warp has super-chunks (q = warp, warp + W, ...)
    int64_t        g     = blockIdx.x;
    auto           pick  = [&](int64_t gg) {  // the matrix of global row group gg
        apq13_loc L = { ms.rl[0], ms.tab[0], ms.y[0], ms.n[0], ms.plane_u4[0], gg };
#pragma unroll
        for (int j = 1; j < NM; j++) {
            if (gg >= ms.gend[j - 1]) {
                L = { ms.rl[j], ms.tab[j], ms.y[j], ms.n[j], ms.plane_u4[j], gg - ms.gend[j - 1] };
            }
        }
        return L;
    };

    // planes: a ring of D super-chunks, the load cursor (lg, lq) running D - 1 items ahead of the compute
    uint4     buf[D][B];
    int64_t   lg = g, lq = warp;
    apq13_loc LL = pick(lg);
    if (act) {
#pragma unroll
        for (int d = 0; d < D - 1; d++) {
            if (lg < G) {
                rl_load<B>(buf[d], (NM == 1 ? ms.rl[0] : LL.rl) + ((NM == 1 ? lg : LL.gl) * Q + lq) * 32 + lane,
                           NM == 1 ? ms.plane_u4[0] : LL.pu4);
            }
            lq += W;
            if (lq >= Q) {
                lq = warp;
                lg += gstep;
                LL = pick(lg);
            }
        }
    }

    // the tables of row group gg: b <= 3, the lane's row (8 halves, zero past TB and past n); b >= 4, this
    // thread's share of the 32 rows' raw tables (16-byte pieces idx = l + 32 c: row l, entries 8c .. 8c+7)
    auto raw_row = [&](int64_t gg) {
        uint4           v   = make_uint4(0, 0, 0, 0);
        const apq13_loc L   = pick(gg);
        const __half *  tab = L.tab;
        const int64_t   r   = 32 * L.gl + lane;
        if (gg < G && r < L.n) {
            if (B == 3 && ((uintptr_t) tab & 15) == 0) {
                v = __ldg((const uint4 *) (tab + r * TB));
            } else {
                uint16_t h[8] = {};
#pragma unroll
                for (int e = 0; e < (TB < 8 ? TB : 8); e++) {
                    h[e] = __half_as_ushort(tab[r * TB + e]);
                }
                v = make_uint4(h[0] | (uint32_t) h[1] << 16, h[2] | (uint32_t) h[3] << 16, h[4] | (uint32_t) h[5] << 16,
                               h[6] | (uint32_t) h[7] << 16);
            }
        }
        return v;
    };
    auto raw_block = [&](int64_t gg, uint4 (&v)[NR]) {
        const apq13_loc L    = pick(gg);
        const __half *  tab  = L.tab;
        const bool      al16 = ((uintptr_t) tab & 15) == 0;  // precision b's tables start 16-byte aligned
#pragma unroll
        for (int j = 0; j < NR; j++) {
            const int idx = threadIdx.x + j * 32 * W;
            v[j]          = make_uint4(0, 0, 0, 0);
            if (idx < 4 * TB && gg < G) {
                const int     l = idx & 31, c = idx >> 5;
                const int64_t r = 32 * L.gl + l;
                if (r < L.n) {
                    if (al16) {
                        v[j] = __ldg((const uint4 *) (tab + r * TB) + c);
                    } else {
                        uint16_t h[8];
#pragma unroll
                        for (int e = 0; e < 8; e++) {
                            h[e] = __half_as_ushort(tab[r * TB + 8 * c + e]);
                        }
                        v[j] = make_uint4(h[0] | (uint32_t) h[1] << 16, h[2] | (uint32_t) h[3] << 16,
                                          h[4] | (uint32_t) h[5] << 16, h[6] | (uint32_t) h[7] << 16);
                    }
                }
            }
        }
    };
    auto store_block = [&](const uint4 (&v)[NR], int u) {  // entry e of lane l, buffer u: byte e*256 + u*128 + l*4
#pragma unroll
        for (int j = 0; j < NR; j++) {
            const int idx = threadIdx.x + j * 32 * W;
            if (idx < 4 * TB) {
                const int      l  = idx & 31, c = idx >> 5;
                const __half * hv = (const __half *) &v[j];
#pragma unroll
                for (int uu = 0; uu < 8; uu++) {
                    *(float *) (smc + (8 * c + uu) * 256 + u * 128 + l * 4) = __half2float(hv[uu]);
                }
            }
        }
    };
    // b <= 3: low bytes of entries 0-3 / 4-7, high bytes of entries 0-3 / 4-7
    uint32_t tl0 = 0, tl1 = 0, th0 = 0, th1 = 0;
    auto     set_regs = [&](const uint4 v) {
        tl0 = __byte_perm(v.x, v.y, 0x6420);
        th0 = __byte_perm(v.x, v.y, 0x7531);
        tl1 = __byte_perm(v.z, v.w, 0x6420);
        th1 = __byte_perm(v.z, v.w, 0x7531);
    };
    // v15: the pair tables of the row group whose register tables are set, into buffer u (the lane's own row)
    auto build_pairs = [&](int u) {
        for (int e = warp; e < 64; e += W) {
            const uint32_t sel = (uint32_t) (e & 7) | (uint32_t) (e >> 3) << 4;
            const float2   f   = apq_h2f2(__byte_perm(__byte_perm(tl0, tl1, sel), __byte_perm(th0, th1, sel), 0x5140));
            *(float2 *) (pht + ((e & 7) | u << 3 | (e >> 3) << 4) * 256 + lane * 8) = f;
        }
    };
    uint4 raw[NR];
    if constexpr (REG) {
        set_regs(raw_row(g));
        if constexpr (PH) {
            build_pairs(0);
        }
    } else {
        raw_block(g, raw);
        store_block(raw, 0);
    }
    for (int64_t i = threadIdx.x; i < k / 4; i += 32 * W) {
        ((float4 *) xs)[i] = __ldg((const float4 *) x + i);
    }
    __syncthreads();

    float a0 = 0.0f, a1 = 0.0f;
    for (int it = 0; g < G; g += gstep, it++) {
        const int64_t gn = g + gstep;
        uint4         rraw;  // b <= 3: the next group's row table, loaded now, used after the barrier
        if constexpr (REG) {
            rraw = raw_row(gn);
        } else {
            raw_block(gn, raw);
        }
        const uint32_t lreg = (uint32_t) lane * 4 + (uint32_t) (it & 1) * 128;
        const uint32_t bufm = (it & 1) ? 0x08080808u : 0u;  // v15: the pair buffer's bit in each index byte
        const uint32_t l8   = (uint32_t) lane * 8;
        if (act) {
            for (int64_t q = warp; q < Q; q += W) {
                if (lg < G) {
                    // (one matrix: the kernel's parameters, so that the plane stride stays a constant operand)
                    rl_load<B>(buf[D - 1], (NM == 1 ? ms.rl[0] : LL.rl) + ((NM == 1 ? lg : LL.gl) * Q + lq) * 32 + lane,
                               NM == 1 ? ms.plane_u4[0] : LL.pu4);
                }
                lq += W;
                if (lq >= Q) {
                    lq = warp;
                    lg += gstep;
                    LL = pick(lg);
                }
                const float * xq = xs + q * 128;
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    uint32_t w[B];
#pragma unroll
                    for (int kk = 0; kk < B; kk++) {
                        w[kk] = rl_word(buf[0][kk], t);
                    }
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        const float4 xl = *(const float4 *) (xq + 32 * t + 4 * m);
                        const float4 xh = *(const float4 *) (xq + 32 * t + 4 * m + 16);
                        if (PH && m >= 2) {
                            uint32_t o = bufm;  // byte i: code(4m+i) | u << 3 | code(16+4m+i) << 4
#pragma unroll
                            for (int kk = 0; kk < B; kk++) {
                                o |= ((w[kk] >> m) & 0x11111111u) << (B - 1 - kk);
                            }
#define APQ15_LK(i) (*(const float2 *) (pht + __byte_perm(o, l8, 0x5504 | ((i) << 4))))
                            const float2 v0 = APQ15_LK(0), v1 = APQ15_LK(1), v2 = APQ15_LK(2), v3 = APQ15_LK(3);
#undef APQ15_LK
                            a0 = fmaf(v0.x, xl.x, a0);
                            a1 = fmaf(v0.y, xh.x, a1);
                            a0 = fmaf(v1.x, xl.y, a0);
                            a1 = fmaf(v1.y, xh.y, a1);
                            a0 = fmaf(v2.x, xl.z, a0);
                            a1 = fmaf(v2.y, xh.z, a1);
                            a0 = fmaf(v3.x, xl.w, a0);
                            a1 = fmaf(v3.y, xh.w, a1);
                        } else if constexpr (REG) {
                            // nibble 2i: weight 4m+i, nibble 2i+1: weight 16+4m+i (codes < 8: no sign mode)
                            const uint32_t o = rl_codes<B>(w, m, 0x11111111u);
#pragma unroll
                            for (int hh = 0; hh < 2; hh++) {
                                const uint32_t s  = hh ? o >> 16 : o;
                                const uint32_t L  = __byte_perm(tl0, tl1, s);
                                const uint32_t H  = __byte_perm(th0, th1, s);
                                const float2   f0 = apq_h2f2(__byte_perm(L, H, 0x5140));  // 4m+2hh, 16+4m+2hh
                                const float2   f1 = apq_h2f2(__byte_perm(L, H, 0x7362));  // 4m+2hh+1, 16+..
                                a0 = fmaf(f0.x, hh ? xl.z : xl.x, a0);
                                a1 = fmaf(f0.y, hh ? xh.z : xh.x, a1);
                                a0 = fmaf(f1.x, hh ? xl.w : xl.y, a0);
                                a1 = fmaf(f1.y, hh ? xh.w : xh.y, a1);
                            }
                        } else {
                            uint32_t lo, hi;  // byte i: code of weight 4m+i / 16+4m+i
                            rl_codes_nib<B>(w, m, lo, hi);
#define APQ13_LK(c, i) (*(const float *) (smc + __byte_perm((c), lreg, 0x5504 | ((i) << 4))))
                            a0 = fmaf(APQ13_LK(lo, 0), xl.x, a0);
                            a1 = fmaf(APQ13_LK(hi, 0), xh.x, a1);
                            a0 = fmaf(APQ13_LK(lo, 1), xl.y, a0);
                            a1 = fmaf(APQ13_LK(hi, 1), xh.y, a1);
                            a0 = fmaf(APQ13_LK(lo, 2), xl.z, a0);
                            a1 = fmaf(APQ13_LK(hi, 2), xh.z, a1);
                            a0 = fmaf(APQ13_LK(lo, 3), xl.w, a0);
                            a1 = fmaf(APQ13_LK(hi, 3), xh.w, a1);
#undef APQ13_LK
                        }
                    }
                }
#pragma unroll
                for (int d = 0; d < D - 1; d++) {
#pragma unroll
                    for (int kk = 0; kk < B; kk++) {
                        buf[d][kk] = buf[d + 1][kk];
                    }
                }
            }
        }
        if constexpr (!REG) {
            store_block(raw, (it + 1) & 1);  // the next group's table into the other buffer
        } else {
            set_regs(rraw);  // this warp is done with the current group's tables
            if constexpr (PH) {
                build_pairs((it + 1) & 1);
            }
        }
        red[(it & 1) * W * 32 + warp * 32 + lane] = a0 + a1;
        a0 = a1 = 0.0f;
        __syncthreads();
        if (warp == 0) {
            const apq13_loc L = pick(g);
            const int64_t   r = 32 * L.gl + lane;
            float           s = 0.0f;
#pragma unroll
            for (int ww = 0; ww < W; ww++) {
                s += red[(it & 1) * W * 32 + ww * 32 + lane];
            }
            if (r < L.n) {
                L.y[r] = s;
            }
        }
    }
}

static int apq_sm_count(int dev) {
    static int sms[64];
    if (sms[dev] <= 0 && cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        sms[dev] = 0;
    }
    return sms[dev];
}

template <int B, int W, int D, int MB, bool HYB, int NM>
static cudaError_t rl13_launch(const apq13_set<NM> & ms, int64_t k, const float * x, cudaStream_t stream, int dev,
                               int sms) {
    constexpr int TBYTES = B <= 3 ? 0 : (1 << B) * 256;  // (v15's pair tables are static shared memory)
    const size_t  smem   = (size_t) TBYTES + 4u * 2 * W * 32 + 4u * (size_t) k;
    auto          kern   = apq_gemv_rl13_kernel<B, W, D, MB, HYB, NM>;
    static size_t attr[64];                     // dynamic shared memory allowed so far, per device
    static size_t occ_smem[64][4];              // blocks per SM for the last 4 shared memory sizes (row lengths)
    static int    occ[64][4];
    if (smem > attr[dev]) {  // also below 48 KiB: v15's static pair tables lower the default dynamic limit
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
        if (e != cudaSuccess) {
            return e;
        }
        attr[dev] = smem;
    }
    int slot = 0;
    while (slot < 4 && occ_smem[dev][slot] != smem) {
        slot++;
    }
    if (slot == 4) {
        int               o = 0;
        const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kern, 32 * W, smem);
        if (e != cudaSuccess) {
            return e;
        }
        if (o < 1) {
            return cudaErrorInvalidConfiguration;  // x too long for shared memory (k above ~50000)
        }
        for (slot = 3; slot > 0; slot--) {  // newest first
            occ_smem[dev][slot] = occ_smem[dev][slot - 1];
            occ[dev][slot]      = occ[dev][slot - 1];
        }
        occ_smem[dev][0] = smem;
        occ[dev][0]      = o;
    }
    const int64_t G    = ms.gend[NM - 1];
    const int64_t cap  = (int64_t) occ[dev][slot] * sms;
    const int64_t grid = G < cap ? G : cap;
    kern<<<(unsigned) grid, 32 * W, smem, stream>>>(ms, k, x);
    return cudaGetLastError();
}

// v13: D = 3 super-chunks in the ring at b <= 4 (two in flight during a compute), 2 above; at most 128
// registers (launch bounds: 2 blocks of 8 warps or 1 of 16 per SM). v14 (HI): D = 2 and launch bounds of 3
// blocks of 8 warps (b <= 5) / 2 of 16 (b <= 3) (at most 80 / 64 registers; above those b ptxas spills, so
// v13's bounds): more warps per SM, fewer loads in flight per warp.
// count (<= NM) matrices sharing x and k; unused slots repeat the last row-group end (never picked)
template <int B, bool HI, bool HYB = false, int NM = 1>
static cudaError_t rl13_width(int count, const uint8_t * const * rl, const uint16_t * const * t, const int64_t * n,
                              int64_t k, int S, const float * x, float * const * y, cudaStream_t st) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        return cudaErrorInvalidDevice;
    }
    const int sms = apq_sm_count(dev);
    if (sms <= 0) {
        return cudaErrorInvalidDevice;
    }
    constexpr int D    = HI || B > 4 ? 2 : 3;
    constexpr int MB16 = HI && B <= 3 ? 2 : 1;  // v14's bounds only where ptxas (sm_90) spills nothing
    constexpr int MB8  = HI && B <= 5 ? 3 : 2;
    if (count < 1 || count > NM) {
        return cudaErrorInvalidValue;
    }
    apq13_set<NM> ms;
    int64_t       G = 0;
    for (int m = 0; m < NM; m++) {
        const int i    = m < count ? m : count - 1;
        ms.rl[m]       = (const uint4 *) rl[i];
        ms.tab[m]      = (const __half *) t[i] + n[i] * ((1 << B) - (1 << S));
        ms.y[m]        = y[i];
        ms.n[m]        = n[i];
        ms.plane_u4[m] = (int64_t) (ggml_ext_apq_rl_plane_size(n[i], k) / 16);
        G += m < count ? (n[i] + 31) / 32 : 0;
        ms.gend[m] = G;
    }
    if (G == 0) {
        return cudaSuccess;
    }
    if (B >= 7 || G <= sms) {
        return rl13_launch<B, 16, D, MB16, HYB, NM>(ms, k, x, st, dev, sms);
    }
    return rl13_launch<B, 8, D, MB8, HYB, NM>(ms, k, x, st, dev, sms);
}

template <bool HI, int NM = 1>
static cudaError_t rl13_bits(int b, int count, const uint8_t * const * rl, const uint16_t * const * t, const int64_t * n,
                             int64_t k, int S, const float * x, float * const * y, cudaStream_t st) {
    switch (b) {
        case 1: return rl13_width<1, HI, false, NM>(count, rl, t, n, k, S, x, y, st);
        case 2: return rl13_width<2, HI, false, NM>(count, rl, t, n, k, S, x, y, st);
        case 3: return rl13_width<3, HI, false, NM>(count, rl, t, n, k, S, x, y, st);
        case 4: return rl13_width<4, HI, false, NM>(count, rl, t, n, k, S, x, y, st);
        case 5: return rl13_width<5, HI, false, NM>(count, rl, t, n, k, S, x, y, st);
        case 6: return rl13_width<6, HI, false, NM>(count, rl, t, n, k, S, x, y, st);
        case 7: return rl13_width<7, HI, false, NM>(count, rl, t, n, k, S, x, y, st);
        default: return rl13_width<8, HI, false, NM>(count, rl, t, n, k, S, x, y, st);
    }
}

extern "C" cudaError_t ggml_ext_apq_gemv_rl_multi_cuda(int count, const uint8_t * const * rl,
                                                       const uint16_t * const * tables, const int64_t * n_rows,
                                                       int64_t n_per_row, int seed_bits, int bits, const float * x,
                                                       float * const * y, cudaStream_t stream) {
    if (count < 1 || count > 4 || n_per_row <= 0 || n_per_row % 128 || seed_bits < 1 || bits < seed_bits ||
        bits > 8) {
        return cudaErrorInvalidValue;
    }
    for (int m = 0; m < count; m++) {
        if (n_rows[m] < 0) {
            return cudaErrorInvalidValue;
        }
    }
    return rl13_bits<false, 4>(bits, count, rl, tables, n_rows, n_per_row, seed_bits, x, y, stream);
}

extern "C" cudaError_t ggml_ext_apq_gemv_rl_cuda(const uint8_t * rl, const uint16_t * tables, int64_t n_rows,
                                                 int64_t n_per_row, int seed_bits, int bits, int variant,
                                                 const float * x, int64_t n_tokens, float * y, cudaStream_t stream) {
    if (n_rows < 0 || n_per_row <= 0 || n_per_row % 128 || seed_bits < 1 || bits < seed_bits || bits > 8 ||
        n_tokens < 1 || n_tokens > 8 || variant < 0 || variant > 15 ||
        (((variant >= 3 && variant <= 7) || variant >= 9) && n_tokens != 1) ||
        (variant == 1 && n_tokens != 1)) {
        return cudaErrorInvalidValue;
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    const int nt = (int) n_tokens;
    switch (variant) {
        case 1: return rl_bits<1, 8, false, false>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
        case 3: return rl_bits<1, 16, true, false>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
        case 4: return rl_bits<1, 8, true, true>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
        case 5: return rl_bits<1, 8, true, false, 2>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
        case 6: return rl_bits<1, 8, true, false, 4>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
        case 7: return rl_bits<1, 8, true, true, 0>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
        case 9: return rl9_bits<8, true>(bits, rl, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 10: return rl9_bits<16, true>(bits, rl, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 11: return rl9_bits<8, false>(bits, rl, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 12: return rl9_bits<16, false>(bits, rl, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 13: return rl13_bits<false>(bits, 1, &rl, &tables, &n_rows, n_per_row, seed_bits, x, &y, stream);
        case 14: return rl13_bits<true>(bits, 1, &rl, &tables, &n_rows, n_per_row, seed_bits, x, &y, stream);
        case 15:  // v15 differs from v13 at 3 bits only
            return bits == 3 ?
                       rl13_width<3, false, true>(1, &rl, &tables, &n_rows, n_per_row, seed_bits, x, &y, stream) :
                       rl13_bits<false>(bits, 1, &rl, &tables, &n_rows, n_per_row, seed_bits, x, &y, stream);
        case 0:  // the default: v14 for one token (rounds 5 and 6: fastest or within 1 % on every shape and
                 // precision, 1.1-1.3x v4), v8 for 2..8 (docs/RESULTS.md)
            if (nt == 1) {
                return rl13_bits<true>(bits, 1, &rl, &tables, &n_rows, n_per_row, seed_bits, x, &y, stream);
            }
            [[fallthrough]];
        case 8:
            if (nt == 1) {
                return rl_bits<1, 8, true, true, -1>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
            } else if (nt == 2) {
                return rl_bits<2, 8, true, true, -1>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
            } else if (nt <= 4) {
                return rl_bits<4, 8, true, true, -1>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
            }
            return rl_bits<8, 8, true, true, -1>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
        case 2:
            if (nt == 1) {
                return rl_bits<1, 8, true, false>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
            } else if (nt == 2) {
                return rl_bits<2, 8, true, false>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
            } else if (nt <= 4) {
                return rl_bits<4, 8, true, false>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
            }
            return rl_bits<8, 8, true, false>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
        default: return cudaErrorInvalidValue;
    }
}

// ---------------------------------------------------------------------------------------------------------
// dequantize (row-lane layout -> fp16 row-major). One block per row group g and a share of its super-chunks
// (DQ_W warps, ks blocks per group, so that there are ~4 blocks per SM). The block stages the 32 rows' tables
// in shared memory as float, lane-transposed (ts[e * 32 + l], conflict-free lookups; the first version looked
// every weight up in global memory, 32 rows' tables per warp instruction, and ran at 3-10% of bandwidth).
// Lane l decodes row 32 g + l, 32 weights at a time, into the warp's shared tile (32 rows x 64 bytes, rows
// padded to 80 bytes: conflict-free 16-byte stores), then the warp writes the tile out row by row: each
// store instruction covers 8 rows x 64 contiguous bytes (whole 32-byte sectors; the first version wrote
// 16 bytes in each of 32 rows).

#define DQ_W 4
#define DQ_ROW_BYTES 80

template <int B>
static __global__ void __launch_bounds__(32 * DQ_W)
    apq_dequantize_rl_kernel(const uint4 * __restrict__ rl, const __half * __restrict__ tables, int64_t n, int64_t k,
                             int S, int ks, int64_t plane_u4, __half * __restrict__ out) {
    constexpr int TB = 1 << B;
    extern __shared__ float4 smem4[];
    float *       ts    = (float *) smem4;                                   // TB * 32 floats
    uint8_t *     tiles = (uint8_t *) (ts + TB * 32);                        // DQ_W tiles of 32 x DQ_ROW_BYTES
    const int     lane  = threadIdx.x & 31;
    const int     warp  = threadIdx.x >> 5;
    const int64_t g     = blockIdx.x / ks;
    const int     part  = (int) (blockIdx.x % ks);
    const int64_t r0    = 32 * g;
    const int64_t Q     = k / 128;
    const __half * tab  = tables + n * (TB - (1 << S));
    stage_tables<TB>(ts, tab, r0, n, S, 32 * DQ_W);
    __syncthreads();
    uint8_t *     tile = tiles + warp * 32 * DQ_ROW_BYTES;
    const float * ls   = ts + lane;
    const uint4 * base = rl + g * Q * 32 + lane;
    for (int64_t q = (int64_t) part * DQ_W + warp; q < Q; q += (int64_t) DQ_W * ks) {
        uint4 v[B];
        rl_load<B>(v, base + q * 32, plane_u4);
#pragma unroll
        for (int t = 0; t < 4; t++) {
            uint32_t w[B];
#pragma unroll
            for (int kk = 0; kk < B; kk++) {
                w[kk] = rl_word(v[kk], t);
            }
            uint32_t h2[16];  // h2[u]: weights 2u, 2u+1 of the 32 as an fp16 pair
#pragma unroll
            for (int m = 0; m < 8; m++) {  // codes of weights 4m .. 4m+3
                const uint32_t c = rl_codes<B>(w, m, 0x01010101u);
#pragma unroll
                for (int i = 0; i < 4; i += 2) {
                    const __half lo = __float2half(ls[((c >> (8 * i)) & 0xff) * 32]);
                    const __half hi = __float2half(ls[((c >> (8 * i + 8)) & 0xff) * 32]);
                    h2[2 * m + i / 2] = (uint32_t) __half_as_ushort(lo) | ((uint32_t) __half_as_ushort(hi) << 16);
                }
            }
            uint4 * mine = (uint4 *) (tile + lane * DQ_ROW_BYTES);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                mine[u] = make_uint4(h2[4 * u], h2[4 * u + 1], h2[4 * u + 2], h2[4 * u + 3]);
            }
            __syncwarp();
#pragma unroll
            for (int it = 0; it < 4; it++) {  // 32 rows x 4 uint4: 8 rows per instruction
                const int     i   = it * 32 + lane;
                const int     row = i >> 2, c = i & 3;
                const int64_t r   = r0 + row;
                if (r < n) {
                    ((uint4 *) (out + r * k + q * 128 + 32 * t))[c] =
                        *(const uint4 *) (tile + row * DQ_ROW_BYTES + 16 * c);
                }
            }
            __syncwarp();
        }
    }
}

template <int B>
static cudaError_t dq_launch(const uint4 * p, const __half * t, int64_t n, int64_t k, int S, int64_t plane_u4,
                             __half * o, cudaStream_t stream) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        return cudaErrorInvalidDevice;
    }
    const size_t  smem = 4u * 32u * (1u << B) + (size_t) DQ_W * 32 * DQ_ROW_BYTES;  // at most 42 KiB
    const int64_t G    = (n + 31) / 32;
    const int64_t Q    = k / 128;
    int64_t       ks   = (4 * (int64_t) sms + G - 1) / G;
    ks                 = ks < 1 ? 1 : ks > (Q + DQ_W - 1) / DQ_W ? (Q + DQ_W - 1) / DQ_W : ks;
    apq_dequantize_rl_kernel<B><<<(unsigned) (G * ks), 32 * DQ_W, smem, stream>>>(p, t, n, k, S, (int) ks, plane_u4, o);
    return cudaGetLastError();
}

extern "C" cudaError_t ggml_ext_apq_dequantize_rl_cuda(const uint8_t * rl, const uint16_t * tables, int64_t n_rows,
                                                       int64_t n_per_row, int seed_bits, int bits, uint16_t * out,
                                                       cudaStream_t stream) {
    if (n_rows < 0 || n_per_row <= 0 || n_per_row % 128 || seed_bits < 1 || bits < seed_bits || bits > 8) {
        return cudaErrorInvalidValue;
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    const int64_t  plane_u4 = (int64_t) (ggml_ext_apq_rl_plane_size(n_rows, n_per_row) / 16);
    const uint4 *  p        = (const uint4 *) rl;
    const __half * t        = (const __half *) tables;
    __half *       o        = (__half *) out;
    switch (bits) {
        case 1: return dq_launch<1>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
        case 2: return dq_launch<2>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
        case 3: return dq_launch<3>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
        case 4: return dq_launch<4>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
        case 5: return dq_launch<5>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
        case 6: return dq_launch<6>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
        case 7: return dq_launch<7>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
        default: return dq_launch<8>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
    }
}

static __global__ void apq_f32_to_f16_kernel(const float * __restrict__ x, __half * __restrict__ y, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        y[i] = __float2half(x[i]);
    }
}

extern "C" cudaError_t ggml_ext_apq_f32_to_f16_cuda(const float * x, uint16_t * out, int64_t n, cudaStream_t stream) {
    if (n < 0) {
        return cudaErrorInvalidValue;
    }
    if (n == 0) {
        return cudaSuccess;
    }
    const unsigned blocks = (unsigned) ((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    apq_f32_to_f16_kernel<<<blocks, 256, 0, stream>>>(x, (__half *) out, n);
    return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------------------
// v16 (one token, b <= 3): tensor cores. Round 5 showed v13/v14 ISSUE-bound at 3 bits, not short of loads
// in flight: v13 keeps 2 super-chunks x 3 planes x 512 B = 3 KB per warp in flight, 16 warps per SM = 48 KB
// per SM (Little's law asks ~20-25 KB), but needs 4.05 SASS instructions per weight where 3 TB/s at 3 bits
// (8e12 weights/s) over 132 SMs x 4 schedulers x 32 lanes x ~1.98 GHz leaves 4.2: ~97% issue efficiency
// needed, and the FFMA per weight alone is 1. Here the lookups produce fp16 PAIRS (one byte-permute per two
// weights, as v13) that go straight into mma.sync.m16n8k16 as the B operand (K = 16 weights x N = 8 rows;
// lane 4 g + c holds row g's weights 2c, 2c+1, 2c+8, 2c+9 of each step of 16: one row per lane, so its table
// stays in 4 registers), A = x split into x_hi (row 0) + x_lo (row 8) (fp16: products exact, sum ~fp32 accurate;
// the other rows are copies whose outputs are unused, so one LDS.128 per step is the whole A fragment): per
// step of 16 weights x 8 rows a lane issues 3 instructions of codes, 4 PRMT, one LDS.128 and one MMA for its 4
// weights; SASS (nvdisasm, b = 3): 93 instructions per chunk of 32 weights per lane = 2.9 per weight (v13 4.05).
// Device layout ("tile layout", ggml_ext_apq_relayout_tc_cuda, same size as the row-lane layout): plane p,
// tile of 8 rows (rows padded to a multiple of 32), chunk q of 128 weights: 32 lanes x 32-bit word, lane
// 4 g + c's word holding row 8 tile + g: bit 4 j + m (j < 8, m < 4) = weight 128 q + 16 s + o with step
// s = 2 m + (j >> 2), o = 2 c + {0, 1, 8, 9}[j & 3]; so rl_codes(m) gives the nibble codes of steps 2m
// (nibbles 0-3: b0 = (o 2c, 2c+1), b1 = (2c+8, 2c+9)) and 2m + 1 (nibbles 4-7).
// Block: 4 tiles (32 rows) x H slices of the row (chunks q = h, h + H, ...; H = 4, or 8 where the row groups
// are no more than the SMs); each warp keeps D
// chunks of loads in flight (issued before the block stages x); x staged once per block as the A fragments
// (uint4 per step and lane c); the H slices' row sums added through shared memory.
static __global__ void apq_relayout_tc_kernel(const uint8_t * __restrict__ planes, int64_t n, int64_t k, int P,
                                              uint32_t * __restrict__ out) {
    const int64_t Q     = k / 128;
    const int64_t T     = (n + 31) / 32 * 4;
    const int64_t total = (int64_t) P * T * Q * 32;
    for (int64_t o = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; o < total; o += (int64_t) gridDim.x * blockDim.x) {
        const int     lane = (int) (o & 31);
        int64_t       rest = o >> 5;
        const int64_t q    = rest % Q;
        rest /= Q;
        const int64_t tile = rest % T;
        const int64_t p    = rest / T;
        const int     g = lane >> 2, c = lane & 3;
        const int64_t r = 8 * tile + g;
        uint32_t      v = 0;
        if (r < n) {
            const uint8_t * src = planes + p * n * (k / 8) + r * (k / 8);
            for (int j = 0; j < 8; j++) {
                for (int m = 0; m < 4; m++) {
                    const int64_t col = 128 * q + 16 * (2 * m + (j >> 2)) + 2 * c + (j & 1) + ((j & 2) ? 8 : 0);
                    v |= (uint32_t) ((src[col >> 3] >> (col & 7)) & 1) << (4 * j + m);
                }
            }
        }
        out[o] = v;
    }
}

extern "C" cudaError_t ggml_ext_apq_relayout_tc_cuda(const uint8_t * planes, int64_t n_rows, int64_t n_per_row,
                                                     int parent_bits, uint8_t * out, cudaStream_t stream) {
    if (n_rows < 0 || n_per_row <= 0 || n_per_row % 128 || parent_bits < 1 || parent_bits > 8) {
        return cudaErrorInvalidValue;
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    const int64_t words  = (int64_t) parent_bits * (int64_t) (ggml_ext_apq_rl_plane_size(n_rows, n_per_row) / 4);
    const int64_t blocks = (words + 255) / 256 < 65535 ? (words + 255) / 256 : 65535;
    apq_relayout_tc_kernel<<<(unsigned) blocks, 256, 0, stream>>>(planes, n_rows, n_per_row, parent_bits,
                                                                  (uint32_t *) out);
    return cudaGetLastError();
}

static __device__ __forceinline__ void apq_mma16816(float (&d)[4], const uint4 a, uint32_t b0, uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // mma.m16n8k16: sm_80 and later (the launcher refuses before)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// prmt without __byte_perm's masking of the selector's sign bits (the codes are < 8: those bits are 0)
static __device__ __forceinline__ uint32_t apq_prmt(uint32_t a, uint32_t b, uint32_t s) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}

// H slices of the row per tile: 4 (16 warps, 2 blocks per SM), 8 where the row groups are no more than the SMs
// (32 warps, 1 block per SM: 4096-row matrices would otherwise have 16 warps per SM)
template <int B, int D, int H>
static __global__ void __launch_bounds__(128 * H, 8 / H)
    apq_gemv_tc16_kernel(const uint32_t * __restrict__ tc, const __half * __restrict__ tab, int64_t n, int64_t k,
                         int64_t plane_u32, const float * __restrict__ x, float * __restrict__ y) {
    constexpr int TB   = 1 << B;
    extern __shared__ uint4 xa[];                      // k / 16 steps x 4: the A fragment of lane c of each step
    float *       red  = (float *) (xa + (k / 16) * 4);  // H slices x 32 rows
    const int     lane = threadIdx.x & 31;
    const int     warp = threadIdx.x >> 5;
    const int     h    = warp >> 2;
    const int64_t tile = (int64_t) blockIdx.x * 4 + (warp & 3);
    const int64_t Q    = k / 128;
    const int     ni   = Q > h ? (int) ((Q - h + H - 1) / H) : 0;  // chunks q = h + H i of this warp
    const uint32_t * base = tc + tile * Q * 32 + lane;

    uint32_t buf[D][B];  // ring: chunk i in slot i % D
#pragma unroll
    for (int d = 0; d < D - 1; d++) {
        if (d < ni) {
#pragma unroll
            for (int kk = 0; kk < B; kk++) {
                buf[d][kk] = __ldg(base + kk * plane_u32 + (int64_t) (h + H * d) * 32);
            }
        }
    }
    // the lane's row table (row 8 tile + g), 8 halves, zero past TB and past n
    uint32_t tl0 = 0, tl1 = 0, th0 = 0, th1 = 0;
    {
        const int64_t r = 8 * tile + (lane >> 2);
        uint4         v = make_uint4(0, 0, 0, 0);
        if (r < n) {
            if (B == 3 && ((uintptr_t) tab & 15) == 0) {
                v = __ldg((const uint4 *) (tab + r * TB));
            } else {
                uint16_t hh[8] = {};
#pragma unroll
                for (int e = 0; e < (TB < 8 ? TB : 8); e++) {
                    hh[e] = __half_as_ushort(tab[r * TB + e]);
                }
                v = make_uint4(hh[0] | (uint32_t) hh[1] << 16, hh[2] | (uint32_t) hh[3] << 16,
                               hh[4] | (uint32_t) hh[5] << 16, hh[6] | (uint32_t) hh[7] << 16);
            }
        }
        tl0 = __byte_perm(v.x, v.y, 0x6420);
        th0 = __byte_perm(v.x, v.y, 0x7531);
        tl1 = __byte_perm(v.z, v.w, 0x6420);
        th1 = __byte_perm(v.z, v.w, 0x7531);
    }
    // x as A: row 0 = x_hi, row 8 = x_lo (rows 1-7 and 9-15: copies, their outputs unused). Entry 4 s + c = lane
    // c's fragment of step s: a0 = hi(x[16s + 2c], x[16s + 2c + 1]), a1 = lo(same), a2 = hi(x[16s + 2c + 8],
    // x[16s + 2c + 9]), a3 = lo(same); every lane 4 g + c loads entry 4 s + c (broadcast).
    for (int64_t e = threadIdx.x; e < (k / 16) * 4; e += 128 * H) {
        const int     c = (int) (e & 3);
        const int64_t st = e >> 2;
        uint32_t      wv[4];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const float2 xv = __ldg((const float2 *) (x + 16 * st + 2 * c + 8 * u));
            const __half h0 = __float2half_rn(xv.x), h1 = __float2half_rn(xv.y);
            const __half l0 = __float2half_rn(xv.x - __half2float(h0)), l1 = __float2half_rn(xv.y - __half2float(h1));
            wv[2 * u]     = (uint32_t) __half_as_ushort(h0) | (uint32_t) __half_as_ushort(h1) << 16;
            wv[2 * u + 1] = (uint32_t) __half_as_ushort(l0) | (uint32_t) __half_as_ushort(l1) << 16;
        }
        xa[e] = make_uint4(wv[0], wv[1], wv[2], wv[3]);
    }
    __syncthreads();

    float          acc[2][4] = {};
    const uint4 *  xl        = xa + (lane & 3);
    for (int i0 = 0; i0 < ni; i0 += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int i = i0 + d;
            if (i < ni) {
                if (i + D - 1 < ni) {
#pragma unroll
                    for (int kk = 0; kk < B; kk++) {
                        buf[(d + D - 1) % D][kk] = __ldg(base + kk * plane_u32 + (int64_t) (h + H * (i + D - 1)) * 32);
                    }
                }
                const int64_t q = h + H * i;
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    const uint32_t o = rl_codes<B>(buf[d], m, 0x11111111u);
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const uint4    xv = xl[(q * 8 + 2 * m + hh) * 4];
                        const uint32_t s  = hh ? o >> 16 : o;
                        const uint32_t lo = apq_prmt(tl0, tl1, s);  // low / high bytes of the 4 entries
                        const uint32_t hi = apq_prmt(th0, th1, s);
                        apq_mma16816(acc[hh], xv, apq_prmt(lo, hi, 0x5140), apq_prmt(lo, hi, 0x7362));
                    }
                }
            }
        }
    }
    // lanes 0-3: D row 0 (x_hi) and row 8 (x_lo), columns 2c, 2c + 1 = rows of the tile
    if (lane < 4) {
        red[h * 32 + (warp & 3) * 8 + 2 * lane]     = acc[0][0] + acc[1][0] + acc[0][2] + acc[1][2];
        red[h * 32 + (warp & 3) * 8 + 2 * lane + 1] = acc[0][1] + acc[1][1] + acc[0][3] + acc[1][3];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int64_t r = (int64_t) blockIdx.x * 32 + threadIdx.x;
        float         v = 0.0f;
#pragma unroll
        for (int hh = 0; hh < H; hh++) {
            v += red[hh * 32 + threadIdx.x];
        }
        if (r < n) {
            y[r] = v;
        }
    }
}

template <int B, int D, int H>
static cudaError_t tc16_launch(const uint8_t * tc, const uint16_t * tables, int64_t n, int64_t k, int S,
                               const float * x, float * y, cudaStream_t stream) {
    const size_t  smem = (size_t) (k / 16) * 4 * 16 + (size_t) H * 32 * 4;
    auto          kern = apq_gemv_tc16_kernel<B, D, H>;
    static size_t attr[64];
    int           dev  = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        return cudaErrorInvalidDevice;
    }
    if (smem > 48 * 1024 && smem > attr[dev]) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
        if (e != cudaSuccess) {
            return e;
        }
        attr[dev] = smem;
    }
    const __half * t = (const __half *) tables + n * ((1 << B) - (1 << S));
    kern<<<(unsigned) ((n + 31) / 32), 128 * H, smem, stream>>>(
        (const uint32_t *) tc, t, n, k, (int64_t) (ggml_ext_apq_rl_plane_size(n, k) / 4), x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t ggml_ext_apq_gemv_tc_cuda(const uint8_t * tc, const uint16_t * tables, int64_t n_rows,
                                                 int64_t n_per_row, int seed_bits, int bits, const float * x,
                                                 float * y, cudaStream_t stream) {
    if (n_rows < 0 || n_per_row <= 0 || n_per_row % 128 || seed_bits < 1 || bits < seed_bits || bits > 3) {
        return cudaErrorInvalidValue;  // b >= 4: not written yet (tables in shared memory)
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        return cudaErrorInvalidDevice;
    }
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 8) {
        return cudaErrorNotSupported;  // mma.m16n8k16 needs sm_80
    }
    const bool few = (n_rows + 31) / 32 <= apq_sm_count(dev);
    switch (bits) {
        case 1: return few ? tc16_launch<1, 12, 8>(tc, tables, n_rows, n_per_row, seed_bits, x, y, stream) :
                             tc16_launch<1, 12, 4>(tc, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        case 2: return few ? tc16_launch<2, 8, 8>(tc, tables, n_rows, n_per_row, seed_bits, x, y, stream) :
                             tc16_launch<2, 8, 4>(tc, tables, n_rows, n_per_row, seed_bits, x, y, stream);
        default: return few ? tc16_launch<3, 6, 8>(tc, tables, n_rows, n_per_row, seed_bits, x, y, stream) :
                              tc16_launch<3, 6, 4>(tc, tables, n_rows, n_per_row, seed_bits, x, y, stream);
    }
}
