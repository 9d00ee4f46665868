// CUDA kernels of the any-precision (APQ) op (GGML_OP_APQ_MUL_MAT, apq_mul_mat.cu; docs/formats/anyprec.md):
// y = W_b x reading only the first b bitplanes of the weight and precision b's fp16 tables. The op calls
//   * ggml_ext_anyprec_gemv_rl_cuda: one token, the persistent GEMV below (apq_gemv_token_kernel; at b <= 4 its
//     sums on tensor cores, anyprec_decode.cuh), which also takes 2 tokens at b <= 4 (rows up to 16384 long);
//     otherwise 2..8 tokens, the split-K GEMV (apq_gemv_batch_kernel);
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
//   * the activations are the same for the whole warp (broadcast loads from shared memory: float4, or at one
//     token and b <= 4 the MMA's A fragments);
//   * the bit-transpose is 4-bit-lane: word bits are permuted so that ((plane_k >> m) & 0x11111111) <<
//     (b-1-k), OR-ed over the b planes, holds 8 codes of b <= 4 bits (two per byte: weights 4m+i and
//     16+4m+i), and with mask 0x01010101 4 codes of up to 8 bits.
#include "anyprec_cuda.h"
#include "anyprec_decode.cuh"

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
//     up 4 weights' low bytes, one their high bytes, two more interleave them into two half2, which are the
//     B fragment of one tensor-core MMA (anyprec_decode.cuh): the MMA, fed x split into two fp16 parts staged
//     once per block in the A fragment's order, does the 4 weights' products and sums in f32, so a weight
//     costs ~2.4 instructions (code bits, one PRMT, a quarter of an MMA and of an x load) instead of ~4 with
//     half -> float conversions and FFMAs; nothing to stage or merge per row group (one 16-byte load per lane);
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
// d += A b for one m16n8k16 MMA (f16 inputs, f32 accumulation): a the A fragment (4 registers of fp16 pairs),
// b0, b1 the B fragment (anyprec_decode.cuh says what they hold here)
static __device__ __forceinline__ void apq_mma(float (&d)[4], const uint4 & a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the APQ one-token GEMV needs mma.sync.m16n8k16 (sm_80 or later; GGML_EXT_CUDA_ARCHITECTURES)"
#endif
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
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

// shared memory of the tables: none (b <= 3), two interleaved pair tables (b = 4), two interleaved float tables
static constexpr __host__ __device__ int apq_token_table_bytes(int b) {
    return b <= 3 ? 0 : b == 4 ? 256 * 256 : (1 << b) * 256;
}

// NT tokens (1, or 2 at b <= 4: the second token in the MMA's spare rows, anyprec_decode.cuh)
template <int B, int W, int D, int MB, int NT>
static __global__ void __launch_bounds__(32 * W, MB)
    apq_gemv_token_kernel(const apq_token_set ms, int64_t k, const float * __restrict__ x) {
    constexpr bool REG    = B <= 3;                  // tables in registers, byte-permute lookups
    constexpr bool PAIR   = B == 4;                  // pair tables in shared memory
    constexpr bool MMA    = B <= 4;                  // tensor-core sums (anyprec_decode.cuh)
    constexpr int  TB     = 1 << B;
    constexpr int  TBYTES = apq_token_table_bytes(B);
    constexpr int  NR     = MMA ? 1 : (4 * TB + 32 * W - 1) / (32 * W);  // raw 16-byte table pieces per thread
    constexpr int  HPT    = 16 / W;                  // b = 4: pair-table high entries built per thread
    static_assert(!PAIR || 16 % W == 0, "b = 4 builds the pairs of 16 / W high entries per thread");
    static_assert(NT == 1 || (NT == 2 && MMA), "two tokens only on the tensor-core path");
    extern __shared__ float4 smem4[];
    char *         smc   = (char *) smem4;
    float *        red   = (float *) (smc + TBYTES);  // 2 x NT x W x 32 partial row sums
    float *        xs    = red + 2 * NT * W * 32;     // x, NT k floats (b <= 4: NT k / 4 A fragments, apq_x_frag)
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
    // b = 4: thread (row l = tid % 32, part = tid / 32) loads row l's 16 entries and writes the pairs whose high
    // entry is part + W j (j < HPT) into buffer u
    auto raw_pair = [&](int64_t gg, uint4 (&v)[2]) {
        const int64_t r = 32 * gg + lane;
        v[0] = v[1] = make_uint4(0, 0, 0, 0);
        if (gg < G && r < ms.n) {
            const __half * row = ms.tab + r * 16;
            if (((uintptr_t) row & 15) == 0) {
                v[0] = __ldg((const uint4 *) row);
                v[1] = __ldg((const uint4 *) row + 1);
            } else {
                uint32_t h[8];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    h[e] = __half_as_ushort(row[2 * e]) | (uint32_t) __half_as_ushort(row[2 * e + 1]) << 16;
                }
                v[0] = make_uint4(h[0], h[1], h[2], h[3]);
                v[1] = make_uint4(h[4], h[5], h[6], h[7]);
            }
        }
    };
    auto store_pair = [&](const uint4 (&v)[2], int u) {
#pragma unroll
        for (int j = 0; j < HPT; j++) {
            const int      h  = warp + W * j;  // warp-uniform
            const uint4    vh = (h >> 3) ? v[1] : v[0];
            const int      c  = (h >> 1) & 3;
            const uint32_t hw = c == 0 ? vh.x : c == 1 ? vh.y : c == 2 ? vh.z : vh.w;
            const uint32_t th = (h & 1) ? hw >> 16 : hw & 0xffff;
#pragma unroll
            for (int lo = 0; lo < 16; lo++) {
                const uint32_t lw = rl_word(v[lo >> 3], (lo >> 1) & 3);
                const uint32_t tl = (lo & 1) ? lw >> 16 : lw;
                *(uint32_t *) (smc + apq_pair_offset(lo | h << 4, u, lane)) = apq_pair(tl, th);
            }
        }
    };
    // b <= 3: the lane's row table as byte planes for the permutes
    apq_reg_table tb       = { 0, 0, 0, 0 };
    auto          set_regs = [&](const uint4 v) { tb = apq_reg_table_of(v.x, v.y, v.z, v.w); };
    uint4         raw[NR];
    uint4         praw[2];
    if constexpr (REG) {
        set_regs(raw_row(g));
    } else if constexpr (PAIR) {
        raw_pair(g, praw);
        store_pair(praw, 0);
    } else {
        raw_block(g, raw);
        store_block(raw, 0);
    }
    float xscale = 1.0f, xinv = 1.0f;  // b <= 4: x's power-of-two scale (apq_x_scale)
    // b <= 4: fragment u of chunk q of token tt holds weights 128 q + apq_x_frag_j0(u) + 0, 1, 16, 17 of x
    auto stage_frags = [&](float s) {
        float mx = 0.0f;  // max |x| of the tokens' x (fmaxf drops NaN: apq_x_scale's rule for it)
        for (int64_t i = threadIdx.x; i < NT * k / 4; i += 32 * W) {
            const int64_t tt = NT == 2 && i >= k / 4, ii = i - tt * (k / 4);  // NT <= 2
            const int64_t j  = tt * k + 128 * (ii >> 5) + apq_x_frag_j0((int) (ii & 31));
            const float2  lo = __ldg((const float2 *) (x + j));
            const float2  hi = __ldg((const float2 *) (x + j + 16));
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(lo.x), fabsf(lo.y)), fmaxf(fabsf(hi.x), fabsf(hi.y))));
            ((uint4 *) xs)[i] = apq_x_frag(lo.x * s, lo.y * s, hi.x * s, hi.y * s);
        }
        return mx;
    };
    if constexpr (MMA) {
        // converted once at scale 1, which apq_x_scale keeps for max |x| in [2^-6, 2^15); the max is known after
        // the barrier, and a block whose x is outside converts it again (block-uniform). Its per-warp maxima go
        // to red's second half, which the first row group does not write.
        float mx = stage_frags(1.0f);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        }
        red[NT * W * 32 + warp] = mx;
        __syncthreads();
        for (int ww = 0; ww < W; ww++) {
            mx = fmaxf(mx, red[NT * W * 32 + ww]);
        }
        apq_x_scale(mx, xscale, xinv);
        if (xscale != 1.0f) {
            stage_frags(xscale);
            __syncthreads();
        }
    } else {
        for (int64_t i = threadIdx.x; i < k / 4; i += 32 * W) {
            ((float4 *) xs)[i] = __ldg((const float4 *) x + i);
        }
        __syncthreads();
    }

    float a0 = 0.0f, a1 = 0.0f;
    // b <= 4: NACC accumulators (chains of 32 / NACC dependent MMAs per super-chunk), and the A fragments, zero
    // on the lanes that carry no x (only the diagonal lanes load them)
    constexpr int NACC = 4, NXA = 2;  // NXA A fragments in registers (more spill at 80 registers)
    float      acc[NACC][4] = {};
    uint4      xa[NXA];
#pragma unroll
    for (int i = 0; i < NXA; i++) {
        xa[i] = make_uint4(0, 0, 0, 0);
    }
    const bool    diag1 = NT == 2 && apq_diag_lane(lane, 1);
    const bool    diag  = apq_diag_lane(lane, 0) || diag1;
    const uint4 * xlane = (const uint4 *) xs + (diag1 ? k / 4 : 0);  // the A fragments of this lane's token
    for (int it = 0; g < G; g += gstep, it++) {
        const int64_t gn = g + gstep;
        uint4         rraw;  // b <= 3: the next group's row table, loaded now, used after the barrier
        if constexpr (REG) {
            rraw = raw_row(gn);
        } else if constexpr (PAIR) {
            raw_pair(gn, praw);
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
                        if constexpr (MMA) {
                            // nibble 2i: weight 4m+i, nibble 2i+1: weight 16+4m+i (b <= 3, codes < 8: no sign mode)
                            const uint32_t o = rl_codes<B>(w, m, 0x11111111u);
#pragma unroll
                            for (int hh = 0; hh < 2; hh++) {
                                uint32_t b0, b1;
                                if constexpr (PAIR) {
                                    b0 = *(const uint32_t *) (smc + apq_pair_addr(o, lreg, 2 * hh));
                                    b1 = *(const uint32_t *) (smc + apq_pair_addr(o, lreg, 2 * hh + 1));
                                } else {
                                    apq_b_frag(hh ? o >> 16 : o, tb, b0, b1);
                                }
                                const int u = 8 * t + 2 * m + hh;
                                if (diag) {
                                    xa[u % NXA] = xlane[32 * q + u];
                                }
                                apq_mma(acc[u % NACC], xa[u % NXA], b0, b1);
                            }
                        } else {
                            const float4 xl = *(const float4 *) (xq + 32 * t + 4 * m);
                            const float4 xh = *(const float4 *) (xq + 32 * t + 4 * m + 16);
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
        if constexpr (REG) {
            set_regs(rraw);  // this warp is done with the current group's tables
        } else if constexpr (PAIR) {
            store_pair(praw, (it + 1) & 1);  // the next group's pairs into the other buffer
        } else {
            store_block(raw, (it + 1) & 1);  // the next group's table into the other buffer
        }
        float * redp = red + (it & 1) * NT * W * 32;  // [token][warp][lane]
        if constexpr (MMA) {  // lane l's row sum of token tt sits in lane apq_acc_source(l, tt)'s accumulators
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int i = 0; i < NACC; i++) {
                s0 += acc[i][0] + acc[i][2];
                s1 += acc[i][1] + acc[i][3];
            }
#pragma unroll
            for (int tt = 0; tt < NT; tt++) {
                int         half;
                const int   src = apq_acc_source(lane, tt, half);
                const float v0  = __shfl_sync(0xffffffffu, s0, src);
                const float v1  = __shfl_sync(0xffffffffu, s1, src);
                redp[(tt * W + warp) * 32 + lane] = (half ? v1 : v0) * xinv;
            }
#pragma unroll
            for (int i = 0; i < NACC; i++) {
                acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
            }
        } else {
            redp[warp * 32 + lane] = a0 + a1;
        }
        a0 = a1 = 0.0f;
        __syncthreads();
        if (warp == 0) {
            const int64_t r = 32 * g + lane;
#pragma unroll
            for (int tt = 0; tt < NT; tt++) {
                float s = 0.0f;
#pragma unroll
                for (int ww = 0; ww < W; ww++) {
                    s += redp[(tt * W + ww) * 32 + lane];
                }
                if (r < ms.n) {
                    ms.y[tt * ms.n + r] = s;
                }
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

template <int B, int W, int D, int MB, int NT>
static cudaError_t token_launch(const apq_token_set & ms, int64_t k, const float * x, cudaStream_t stream, int dev,
                                int sms) {
    constexpr int TBYTES = apq_token_table_bytes(B);
    const size_t  smem   = (size_t) TBYTES + 4u * 2 * NT * W * 32 + 4u * NT * (size_t) k;
    auto          kern   = apq_gemv_token_kernel<B, W, D, MB, NT>;
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
// (b <= 5 but 4), i.e. at most 80 registers: more warps per SM rather than more loads in flight per warp. Above
// that b ptxas (sm_90) would spill, so there 2 blocks of 8 warps; at b = 4 the 64 KiB of pair tables leave room
// for 2 blocks anyway, and the 128 registers afford D = 3 (16 warps with one super-chunk ahead would have 32 KiB
// in flight per SM). 16 warps run where the row groups are at most the SMs (one block per SM whatever the
// bound) and at b >= 7: one block of 16 per SM (at most 128 registers), which at b <= 5 affords D = 3: with 16
// warps per SM, one super-chunk ahead is 24-40 KiB in flight per SM, below what the HBM's latency needs.
template <int B, int NT>
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
    constexpr int D    = B == 4 ? 3 : 2;  // b = 4: 2 blocks of 8 warps (64 KiB of pairs each), 128 registers: 3
    constexpr int D16  = B <= 5 ? 3 : 2;  // 16 warps, one block per SM: two super-chunks ahead where registers allow
    constexpr int MB16 = 1;  // 16 warps: G <= SMs (one block per SM) or b >= 7 (large tables)
    constexpr int MB8  = B <= 5 && B != 4 ? 3 : 2;  // b = 4: 64 KiB of pair tables, 2 blocks fit anyway
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
        return token_launch<B, 16, D16, MB16, NT>(ms, k, x, st, dev, sms);
    }
    return token_launch<B, 8, D, MB8, NT>(ms, k, x, st, dev, sms);
}

static cudaError_t token_bits(int b, const uint8_t * rl, const uint16_t * t, int64_t n, int64_t k, int S,
                              const float * x, float * y, cudaStream_t st) {
    return apq_by_bits(b, [&](auto B) { return token_width<decltype(B)::value, 1>(rl, t, n, k, S, x, y, st); });
}

// two tokens at b <= 4: the one-token kernel with the second token in the MMAs' spare rows
static cudaError_t token2_bits(int b, const uint8_t * rl, const uint16_t * t, int64_t n, int64_t k, int S,
                               const float * x, float * y, cudaStream_t st) {
    switch (b) {
        case 1: return token_width<1, 2>(rl, t, n, k, S, x, y, st);
        case 2: return token_width<2, 2>(rl, t, n, k, S, x, y, st);
        case 3: return token_width<3, 2>(rl, t, n, k, S, x, y, st);
        default: return token_width<4, 2>(rl, t, n, k, S, x, y, st);
    }
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
    } else if (nt == 2 && bits <= 4 && n_per_row <= 16384) {  // both tokens' x in shared memory (<= 128 KiB)
        return token2_bits(bits, rl, tables, n_rows, n_per_row, seed_bits, x, y, stream);
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
