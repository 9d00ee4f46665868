// CUDA kernels of the any-precision (APQ) op (GGML_OP_APQ_MUL_MAT, apq_mul_mat.cu; docs/formats/anyprec.md):
// y = W_b x reading only the first b bitplanes of the weight and precision b's fp16 tables. The op calls
//   * ggml_ext_anyprec_gemv_rl_cuda: one token, the persistent GEMV below (apq_gemv_token_kernel); 2..8 tokens,
//     the split-K GEMV (apq_gemv_batch_kernel): v14 and v8 in the measurements of docs/RESULTS.md, the
//     fastest at one and at 2..8 tokens of the variants measured there;
//   * above 8 tokens, ggml_ext_anyprec_dequantize_rl_cuda to fp16 and ggml_ext_anyprec_f32_to_f16_cuda for x, then
//     cuBLAS (in apq_mul_mat.cu).
// tests/c/test_ext_ops.cpp checks all three against the CPU backend (make test-cuda); tests/cuda/
// anyprec_cuda_bench.cu checks them against the C reference and times them (bench/device/device_anyprec.sh).
//
// All of them read the "row-lane" device layout of anyprec_cuda.h (apq_mul_mat.cu makes it when the weight is
// uploaded): lane l of a warp owns row 32 g + l of a 32-row group, so
//   * every lane loads 16 bytes per plane per 128 weights and the warp's load is 512 contiguous bytes;
//   * every lane reads its own row's table, stored lane-transposed in shared memory (entry e of lane l at
//     word e * 32 + l) or in its registers: the table lookups of a warp never conflict, at any table size;
//   * the activations are the same for the whole warp (broadcast float4 loads from shared memory);
//   * the bit-transpose is 4-bit-lane: word bits are permuted so that ((plane_k >> m) & 0x11111111) <<
//     (b-1-k), OR-ed over the b planes, holds 8 codes of b <= 4 bits (two per byte: weights 4m+i and
//     16+4m+i), and with mask 0x01010101 4 codes of up to 8 bits.
#include "anyprec_cuda.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

extern "C" size_t ggml_ext_anyprec_rl_plane_size(int64_t n_rows, int64_t n_per_row) {
    return (size_t) ((n_rows + 31) / 32) * 32 * (size_t) (n_per_row / 8);
}

// f(std::integral_constant<int, b>) for the precision b in 1..8: every kernel is instantiated per precision
template <class F> static cudaError_t apq_by_bits(int b, F && f) {
    switch (b) {
        case 1: return f(std::integral_constant<int, 1>());
        case 2: return f(std::integral_constant<int, 2>());
        case 3: return f(std::integral_constant<int, 3>());
        case 4: return f(std::integral_constant<int, 4>());
        case 5: return f(std::integral_constant<int, 5>());
        case 6: return f(std::integral_constant<int, 6>());
        case 7: return f(std::integral_constant<int, 7>());
        default: return f(std::integral_constant<int, 8>());
    }
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

// byte codes of weights 4m+i (lo) and 16+4m+i (hi), i < 4, of the b planes' words w, m < 4 (codes of b >= 5
// built 8 at a time in 4-bit lanes: the top 4 planes and the b-4 lower ones each give a nibble code per
// weight, merged into byte codes with one shift and one and/or per 4 weights)
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

// ---------------------------------------------------------------------------------------------------------
// 2..8 tokens: split-K over contiguous slices of the row. ks blocks of W warps per 32-row group (~4 blocks
// per SM), block j taking super-chunks [j QS, (j + 1) QS) of 128 weights and staging only that slice of x,
// all tokens, in shared memory (<= 32 KiB), so that the tokens' activations are read from shared memory
// rather than streamed through an L1 that the weights evict. b <= 4 with pair tables: one lookup of a byte
// (two codes) gives two centroids (float2), halving the lookups. The blocks' partial row sums are added with
// atomicAdd into y (zeroed by the launcher), so the order of the final additions varies from run to run.
// NT: tokens handled (nt <= NT at run time); PAIR: pair tables (B <= 4).
template <int B, int NT, int W, bool PAIR>
static __global__ void __launch_bounds__(32 * W)
    apq_gemv_batch_kernel(const uint4 * __restrict__ rl, const __half * __restrict__ tables, int64_t n, int64_t k,
                          int S, int nt, int ks, int64_t plane_u4, const float * __restrict__ x,
                          float * __restrict__ y) {
    constexpr int E = PAIR ? (16 << B) : (1 << B);  // table entries per lane (pairs: index lo | hi << 4)
    extern __shared__ float4 smem4[];
    float *        sm    = (float *) smem4;
    const int      lane  = threadIdx.x & 31;
    const int      warp  = threadIdx.x >> 5;
    const int64_t  g     = blockIdx.x / ks;
    const int      part  = (int) (blockIdx.x % ks);
    const int64_t  r0    = 32 * g;
    constexpr int  TB    = 1 << B;
    const __half * tab   = tables + n * (TB - (1 << S));
    const int64_t  Q     = k / 128;
    const int64_t  QS    = (Q + ks - 1) / ks;             // super-chunks per slice
    const int64_t  q0    = (int64_t) part * QS;           // this block's first one
    const int64_t  q1    = q0 + QS < Q ? q0 + QS : Q;     // and its end
    const int64_t  xstride = QS * 128;                    // token stride of the staged x
    const uint4 *  base  = rl + g * Q * 32 + lane;
    int64_t        q     = q0 + warp;
    uint4          cur[B];
    if (q < q1) {  // the first planes' loads fly while the tables are built
        rl_load<B>(cur, base + q * 32, plane_u4);
    }
    // the 32 rows' tables as float, lane-transposed: ts[e * 32 + l] = T_b[r0 + l][e] (for pairs: staged, then
    // merged below)
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
    float * xs  = red + NT * W * 32;
    // only this slice of x, all tokens: xs[tt * QS * 128 + j] = x[tt][q0 * 128 + j]
    for (int64_t i = threadIdx.x; i < (int64_t) nt * QS * 32; i += 32 * W) {
        const int64_t tt = i / (QS * 32), j = i % (QS * 32);
        ((float4 *) xs)[i] = q0 * 32 + j < k / 4 ? __ldg((const float4 *) (x + tt * k) + q0 * 32 + j)
                                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __syncthreads();
    const float2 * lp = (const float2 *) sm + lane;
    const float *  ls = sm + lane;
    float          acc[NT][2];  // two chains per token (FMA latency)
#pragma unroll
    for (int tt = 0; tt < NT; tt++) {
        acc[tt][0] = acc[tt][1] = 0.0f;
    }
    for (; q < q1; q += W) {
        uint4 nxt[B];  // next super-chunk, loaded before this one is used (the last one reloads itself)
        rl_load<B>(nxt, base + (q + W < q1 ? q + W : q) * 32, plane_u4);
#pragma unroll
        for (int t = 0; t < 4; t++) {
            uint32_t w[B];
#pragma unroll
            for (int kk = 0; kk < B; kk++) {
                w[kk] = rl_word(cur[kk], t);
            }
            const float * xq = xs + (q - q0) * 128 + 32 * t;
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
                            const float4 xl = *(const float4 *) (xq + tt * xstride + 4 * m);
                            const float4 xh = *(const float4 *) (xq + tt * xstride + 4 * m + 16);
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
                            const float4 xv = *(const float4 *) (xq + tt * xstride + 4 * m);
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
    for (int o = threadIdx.x; o < NT * 32; o += 32 * W) {
        const int     tt = o >> 5, l = o & 31;
        const int64_t r  = r0 + l;
        if (tt < nt && r < n) {
            float s = 0.0f;
#pragma unroll
            for (int ww = 0; ww < W; ww++) {
                s += red[(tt * W + ww) * 32 + l];
            }
            atomicAdd(y + tt * n + r, s);
        }
    }
}

template <int B, int NT, int W, bool PAIR>
static cudaError_t batch_launch(const uint8_t * rl, const uint16_t * tables, int64_t n, int64_t k, int S, int nt,
                                const float * x, float * y, cudaStream_t stream) {
    constexpr int E   = PAIR ? (16 << B) : (1 << B);
    int           dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64 ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        return cudaErrorInvalidDevice;
    }
    // ks blocks per row group: at least ~4 blocks per SM, and at most 32 KiB of x per block (2 blocks per SM)
    const int64_t G      = (n + 31) / 32;
    const int64_t Q      = k / 128;
    int64_t       ks     = (4 * (int64_t) sms + G - 1) / G;
    const int64_t qs_max = 8192 / (128 * nt) > 0 ? 8192 / (128 * nt) : 1;
    ks                   = ks > (Q + qs_max - 1) / qs_max ? ks : (Q + qs_max - 1) / qs_max;
    ks                   = ks > Q ? Q : ks;
    ks                   = ks < 1 ? 1 : ks;
    const int64_t QS     = (Q + ks - 1) / ks;
    const size_t  smem   = (size_t) (PAIR ? 8 * E * 32 + 4 * 32 * (1 << B) : 4 * E * 32) + 4u * NT * W * 32 +
                        4u * (size_t) nt * QS * 128;
    static size_t attr[64];  // per device: dynamic shared memory this instantiation may use (raised on demand)
    if (smem > 48 * 1024 && smem > attr[dev]) {
        const cudaError_t e = cudaFuncSetAttribute(apq_gemv_batch_kernel<B, NT, W, PAIR>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
        if (e != cudaSuccess) {
            return e;
        }
        attr[dev] = smem;
    }
    const int64_t plane_u4 = (int64_t) (ggml_ext_anyprec_rl_plane_size(n, k) / 16);
    cudaError_t   e        = cudaMemsetAsync(y, 0, sizeof(float) * (size_t) nt * (size_t) n, stream);
    if (e != cudaSuccess) {
        return e;
    }
    apq_gemv_batch_kernel<B, NT, W, PAIR><<<(unsigned) (G * ks), 32 * W, smem, stream>>>(
        (const uint4 *) rl, (const __half *) tables, n, k, S, nt, (int) ks, plane_u4, x, y);
    return cudaGetLastError();
}

// 8 warps per block; pair tables for b <= 4, singles above
template <int NT>
static cudaError_t batch_bits(int b, const uint8_t * rl, const uint16_t * t, int64_t n, int64_t k, int S, int nt,
                              const float * x, float * y, cudaStream_t st) {
    return apq_by_bits(b, [&](auto B) {
        return batch_launch<decltype(B)::value, NT, 8, (decltype(B)::value <= 4)>(rl, t, n, k, S, nt, x, y, st);
    });
}

// ---------------------------------------------------------------------------------------------------------
// One token. A GEMV at one token is bound by instruction issue and by its per-row-group prologue rather than
// by loads in flight (docs/RESULTS.md, "Any-precision GEMV, L2-cold and back to back"), so:
//   * b <= 3: the row's 8 fp16 centroids live in 4 REGISTERS of its lane (low bytes of entries 0-3 / 4-7,
//     high bytes of entries 0-3 / 4-7); the 4-bit-lane codes are byte-permute selectors, so one PRMT looks
//     up 4 weights' low bytes, one their high bytes, two more interleave them into two half2: no shared
//     memory per lookup at all (x only), ~4 instructions per weight (2 of them the fp16->fp32 conversion
//     and the FFMA), nothing to stage or merge per row group (one 16-byte load per lane);
//   * b >= 4: singles, float, lane-transposed in shared memory, the lookup address made by ONE PRMT from
//     the byte code (entry e of lane l at byte e * 256 + l * 4: the code byte is the address's second byte,
//     the lane's offset its first); the other 128 bytes of each 256 hold a second buffer, so the next row
//     group's table is converted into it while the current one is used (double-buffered, no extra barrier);
//     codes of b >= 5 built 8 at a time in 4-bit lanes (rl_codes_nib);
//   * a persistent grid (at most the blocks that fit on the SMs; each block strides over row groups), x
//     staged once per block; the W warps of a block split each row group's super-chunks, and each warp's
//     plane loads run D super-chunks ahead in registers ACROSS row-group boundaries (and across the one
//     __syncthreads per row group, which also publishes the next table and the row sums: the partial sums
//     go to a double-buffered shared array that warp 0 adds after the barrier); the next group's raw table
//     is loaded at the start of a group and converted at its end, so its latency hides behind the group;
//   * 16 warps per block where the row groups are fewer than the SMs (4096-row matrices) or the table is
//     large (b >= 7), 8 otherwise; MB blocks per SM in the launch bounds (token_bits says which).
static __device__ __forceinline__ float2 apq_h2f2(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2 *>(&u));
}

// the matrix: its row-lane planes, precision b's tables (offset applied), y, rows, plane stride (uint4), row groups
struct apq_token_set {
    const uint4 *  rl;
    const __half * tab;
    float *        y;
    int64_t        n;
    int64_t        plane_u4;
    int64_t        G;
};

template <int B, int W, int D, int MB>
static __global__ void __launch_bounds__(32 * W, MB)
    apq_gemv_token_kernel(const apq_token_set ms, int64_t k, const float * __restrict__ x) {
    constexpr bool REG    = B <= 3;                  // tables in registers, byte-permute lookups
    constexpr int  TB     = 1 << B;
    constexpr int  TBYTES = REG ? 0 : TB * 256;      // two interleaved float tables (b >= 4)
    constexpr int  NR     = REG ? 1 : (4 * TB + 32 * W - 1) / (32 * W);  // raw 16-byte table pieces per thread
    extern __shared__ float4 smem4[];
    char *         smc   = (char *) smem4;
    float *        red   = (float *) (smc + TBYTES);  // 2 x W x 32 partial row sums
    float *        xs    = red + 2 * W * 32;          // x, k floats
    const int      lane  = threadIdx.x & 31;
    const int      warp  = threadIdx.x >> 5;
    const int64_t  G     = ms.G;
    const int64_t  Q     = k / 128;
    const int64_t  gstep = gridDim.x;
    const bool     act   = warp < Q;                         // the warp has super-chunks (q = warp, warp + W, ...)
    int64_t        g     = blockIdx.x;

    // planes: a ring of D super-chunks, the load cursor (lg, lq) running D - 1 items ahead of the compute
    uint4     buf[D][B];
    int64_t   lg = g, lq = warp;
    if (act) {
#pragma unroll
        for (int d = 0; d < D - 1; d++) {
            if (lg < G) {
                rl_load<B>(buf[d], ms.rl + (lg * Q + lq) * 32 + lane, ms.plane_u4);
            }
            lq += W;
            if (lq >= Q) {
                lq = warp;
                lg += gstep;
            }
        }
    }

    // the tables of row group gg: b <= 3, the lane's row (8 halves, zero past TB and past n); b >= 4, this
    // thread's share of the 32 rows' raw tables (16-byte pieces idx = l + 32 c: row l, entries 8c .. 8c+7)
    auto raw_row = [&](int64_t gg) {
        uint4           v   = make_uint4(0, 0, 0, 0);
        const __half *  tab = ms.tab;
        const int64_t   r   = 32 * gg + lane;
        if (gg < G && r < ms.n) {
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
        const __half *  tab  = ms.tab;
        const bool      al16 = ((uintptr_t) tab & 15) == 0;  // precision b's tables start 16-byte aligned
#pragma unroll
        for (int j = 0; j < NR; j++) {
            const int idx = threadIdx.x + j * 32 * W;
            v[j]          = make_uint4(0, 0, 0, 0);
            if (idx < 4 * TB && gg < G) {
                const int     l = idx & 31, c = idx >> 5;
                const int64_t r = 32 * gg + l;
                if (r < ms.n) {
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
    uint4 raw[NR];
    if constexpr (REG) {
        set_regs(raw_row(g));
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
        if (act) {
            for (int64_t q = warp; q < Q; q += W) {
                if (lg < G) {
                    rl_load<B>(buf[D - 1], ms.rl + (lg * Q + lq) * 32 + lane, ms.plane_u4);
                }
                lq += W;
                if (lq >= Q) {
                    lq = warp;
                    lg += gstep;
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
                        if constexpr (REG) {
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
#define APQ_TOKEN_LK(c, i) (*(const float *) (smc + __byte_perm((c), lreg, 0x5504 | ((i) << 4))))
                            a0 = fmaf(APQ_TOKEN_LK(lo, 0), xl.x, a0);
                            a1 = fmaf(APQ_TOKEN_LK(hi, 0), xh.x, a1);
                            a0 = fmaf(APQ_TOKEN_LK(lo, 1), xl.y, a0);
                            a1 = fmaf(APQ_TOKEN_LK(hi, 1), xh.y, a1);
                            a0 = fmaf(APQ_TOKEN_LK(lo, 2), xl.z, a0);
                            a1 = fmaf(APQ_TOKEN_LK(hi, 2), xh.z, a1);
                            a0 = fmaf(APQ_TOKEN_LK(lo, 3), xl.w, a0);
                            a1 = fmaf(APQ_TOKEN_LK(hi, 3), xh.w, a1);
#undef APQ_TOKEN_LK
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
        }
        red[(it & 1) * W * 32 + warp * 32 + lane] = a0 + a1;
        a0 = a1 = 0.0f;
        __syncthreads();
        if (warp == 0) {
            const int64_t r = 32 * g + lane;
            float         s = 0.0f;
#pragma unroll
            for (int ww = 0; ww < W; ww++) {
                s += red[(it & 1) * W * 32 + ww * 32 + lane];
            }
            if (r < ms.n) {
                ms.y[r] = s;
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

template <int B, int W, int D, int MB>
static cudaError_t token_launch(const apq_token_set & ms, int64_t k, const float * x, cudaStream_t stream, int dev,
                                int sms) {
    constexpr int TBYTES = B <= 3 ? 0 : (1 << B) * 256;
    const size_t  smem   = (size_t) TBYTES + 4u * 2 * W * 32 + 4u * (size_t) k;
    auto          kern   = apq_gemv_token_kernel<B, W, D, MB>;
    static size_t attr[64];                     // dynamic shared memory allowed so far, per device
    static size_t occ_smem[64][4];              // blocks per SM for the last 4 shared memory sizes (row lengths)
    static int    occ[64][4];
    if (smem > attr[dev]) {
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
    const int64_t G    = ms.G;
    const int64_t cap  = (int64_t) occ[dev][slot] * sms;
    const int64_t grid = G < cap ? G : cap;
    kern<<<(unsigned) grid, 32 * W, smem, stream>>>(ms, k, x);
    return cudaGetLastError();
}

// D = 2 super-chunks in the ring (one in flight during a compute) and launch bounds of 3 blocks of 8 warps
// (b <= 5) / 2 of 16 (b <= 3), i.e. at most 80 / 64 registers: more warps per SM rather than more loads in
// flight per warp. Above those b ptxas (sm_90) would spill, so there 2 blocks of 8 warps / 1 of 16 (at most
// 128 registers).
template <int B>
static cudaError_t token_width(const uint8_t * rl, const uint16_t * t, int64_t n, int64_t k, int S, const float * x,
                               float * y, cudaStream_t st) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        return cudaErrorInvalidDevice;
    }
    const int sms = apq_sm_count(dev);
    if (sms <= 0) {
        return cudaErrorInvalidDevice;
    }
    constexpr int D    = 2;
    constexpr int MB16 = B <= 3 ? 2 : 1;
    constexpr int MB8  = B <= 5 ? 3 : 2;
    apq_token_set ms;
    ms.rl             = (const uint4 *) rl;
    ms.tab            = (const __half *) t + n * ((1 << B) - (1 << S));
    ms.y              = y;
    ms.n              = n;
    ms.plane_u4       = (int64_t) (ggml_ext_anyprec_rl_plane_size(n, k) / 16);
    ms.G              = (n + 31) / 32;
    const int64_t G   = ms.G;
    if (G == 0) {
        return cudaSuccess;
    }
    if (B >= 7 || G <= sms) {
        return token_launch<B, 16, D, MB16>(ms, k, x, st, dev, sms);
    }
    return token_launch<B, 8, D, MB8>(ms, k, x, st, dev, sms);
}

static cudaError_t token_bits(int b, const uint8_t * rl, const uint16_t * t, int64_t n, int64_t k, int S,
                              const float * x, float * y, cudaStream_t st) {
    return apq_by_bits(b, [&](auto B) { return token_width<decltype(B)::value>(rl, t, n, k, S, x, y, st); });
}

extern "C" cudaError_t ggml_ext_anyprec_gemv_rl_cuda(const uint8_t * rl, const uint16_t * tables, int64_t n_rows,
                                                 int64_t n_per_row, int seed_bits, int bits, const float * x,
                                                 int64_t n_tokens, float * y, cudaStream_t stream) {
    if (n_rows < 0 || n_per_row <= 0 || n_per_row % 128 || seed_bits < 1 || bits < seed_bits || bits > 8 ||
        n_tokens < 1 || n_tokens > 8) {
        return cudaErrorInvalidValue;
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    const int nt = (int) n_tokens;
    if (nt == 1) {
        return token_bits(bits, rl, tables, n_rows, n_per_row, seed_bits, x, y, stream);
    } else if (nt == 2) {
        return batch_bits<2>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
    } else if (nt <= 4) {
        return batch_bits<4>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
    }
    return batch_bits<8>(bits, rl, tables, n_rows, n_per_row, seed_bits, nt, x, y, stream);
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

extern "C" cudaError_t ggml_ext_anyprec_dequantize_rl_cuda(const uint8_t * rl, const uint16_t * tables, int64_t n_rows,
                                                           int64_t n_per_row, int seed_bits, int bits, uint16_t * out,
                                                           cudaStream_t stream) {
    if (n_rows < 0 || n_per_row <= 0 || n_per_row % 128 || seed_bits < 1 || bits < seed_bits || bits > 8) {
        return cudaErrorInvalidValue;
    }
    if (n_rows == 0) {
        return cudaSuccess;
    }
    const int64_t  plane_u4 = (int64_t) (ggml_ext_anyprec_rl_plane_size(n_rows, n_per_row) / 16);
    const uint4 *  p        = (const uint4 *) rl;
    const __half * t        = (const __half *) tables;
    __half *       o        = (__half *) out;
    return apq_by_bits(bits, [&](auto B) {
        return dq_launch<decltype(B)::value>(p, t, n_rows, n_per_row, seed_bits, plane_u4, o, stream);
    });
}

static __global__ void apq_f32_to_f16_kernel(const float * __restrict__ x, __half * __restrict__ y, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        y[i] = __float2half(x[i]);
    }
}

extern "C" cudaError_t ggml_ext_anyprec_f32_to_f16_cuda(const float * x, uint16_t * out, int64_t n, cudaStream_t stream) {
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
