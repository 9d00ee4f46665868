// GGML_OP_DEC_MUL_MAT on CUDA: QDEC's fused kernel (docs/QDEC.md, "The CUDA kernel"), checked against the
// CPU reference (ggml_ext/src/ops/dec_mul_mat_cpu.c) by tests/c/test_ext_ops.cpp.
//
//   dst[m, r] = y[m, r] + scales[m] * sum_{j in sel(x_r)} q[j][m] * x[j, r]
//
// y is the base GEMV's output (ggml's own mul_mat of the base weight, an earlier node); this op adds the
// residual term. Two phases:
//   1. selection: one thread block (256 threads, 4 channels each, in index order) per (row, 1024-channel
//      chunk) picks the chunk's k channels exactly as ggml_ext_qdec_select does (approximate: 32 bucket
//      counters in shared memory, whole buckets from the top, the overflowing bucket's first channels in
//      index order by a block scan; exact: each channel's rank by (|x| descending, index)), and writes
//      their indices and x values to a small scratch list (the only GPU memory QDEC takes); every block
//      also copies y into dst.
//   2. residual GEMV: n_tb blocks; thread (piece p, lane c) reads 16 bytes (32 outputs) of each selected
//      channel's residual row c, c + C, ... straight from r (zero-copy when r is pinned, mapped host memory:
//      a warp's loads are one contiguous run of a row), sums q * x in registers and adds scale * sum
//      atomically into dst. The lanes C = n_tb * 256 / pieces trade loads in flight (more lanes) against
//      atomics (min(C, n_sel) * M per row): what n_tb tunes.
// Between them a grid-wide sync: cooperative groups' grid.sync() in one cooperative launch on ggml's stream
// (the grid is n_tb blocks, all resident; phase 1's items are looped over), also while ggml-cuda captures
// the stream into a CUDA graph (CUDA 12 captures cooperative launches; upstream's soft_max launches its
// cooperative kernel the same way). When the device has no cooperative launch or n_tb blocks cannot all
// be resident: two kernels on the same stream (the stream orders them; one launch more).
// GGML_EXT_DEC_LAUNCH=coop|split forces one (the tests run both, the benchmark compares them).
//
// The one-pass kernel (default for the approximate selection when a row selects at most DEC_OP_MAX_SEL
// channels; GGML_EXT_DEC_LAUNCH=onepass forces it): no grid-wide sync, no atomics in global memory, no copy
// of y. A block owns (row, slab of 1024 outputs); its 8 warps select the row's channels themselves, one
// 1024-channel chunk per warp at a time, with the same bucket rule in warp shuffles (lane l holds channels
// 32 l .. 32 l + 31, so "first in index order" is a warp scan), into shared memory -- the selection is
// recomputed by every slab's block (a few warp instructions per chunk, far cheaper than a grid sync); then
// lane l reads piece l of the slab (16 bytes, 32 outputs) of the selected residual rows, the warps taking
// every 8th slot, sums in registers, adds into a padded shared accumulator, and the block writes
// dst = y + scale * acc once. Its sums differ from the CPU's in order only, like the others.
//
// Where r lives: the op reads r->data as a device pointer. In a CUDA buffer (the tests' first run) that is
// GPU memory; in pinned host memory (ggml's CUDA host buffer, cudaHostAlloc(..., cudaHostAllocMapped), or a
// loader's mapping registered with ggml_ext_cuda_qdec_pin below) the pointer CUDA maps it to is used and
// every residual byte crosses PCIe at each use - never copied to GPU memory. Unregistered host memory is
// refused with a clear message (a kernel cannot read it).
//
// Bucket arithmetic: ggml-cuda builds with -use_fast_math, whose division is approximate; the bucket is
// computed with the _rn intrinsics (IEEE round-to-nearest, as the C reference) so both pick the same
// channels bit for bit. Results differ from the CPU's only by the summation order of the atomics.
#include "ggml-cuda/common.cuh"

#include "ggml-ext-cuda.cuh"
#include "ggml-ext-ops.h"
#include "common/settings.h"
#include "ggml-ext-qdec.h"

#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <algorithm>

namespace cg = cooperative_groups;

#define DEC_THREADS 256                                    // every kernel's block
#define DEC_PER_THREAD (GGML_EXT_QDEC_CHUNK / DEC_THREADS)  // channels of a chunk per thread, consecutive
#define DEC_PIECE 16                                       // residual bytes a thread reads per channel

static_assert(GGML_EXT_QDEC_CHUNK == DEC_THREADS * DEC_PER_THREAD, "a chunk is one block's channels");

struct dec_args {
    const char *    y;
    const char *    x;
    const uint8_t * r;   // device pointer of the residual (GPU memory or mapped host memory)
    const float *   sc;  // scales [M]
    char *          dst;
    int32_t *       idx;  // [rows, n_sel] selected channel per slot
    float *         xs;   // [rows, n_sel] its activation
    int64_t         M, K, rows, ne1, ne2;
    size_t          y_nb1, y_nb2, y_nb3, x_nb1, x_nb2, x_nb3, d_nb1, d_nb2, d_nb3;
    size_t          rs;      // bytes of one residual row ((M + 1) / 2)
    int64_t         pieces;  // DEC_PIECE-byte pieces of a row
    int             kk;      // min(k_chunk, GGML_EXT_QDEC_CHUNK): chunk c's slots start at c * kk
    int             n_sel;   // slots of a row
    int             n_chunks;
    int             exact;
    float           b0, b15;
};

static __device__ __forceinline__ const float * row_ptr(const char * base, int64_t r, int64_t ne1, int64_t ne2,
                                                        size_t nb1, size_t nb2, size_t nb3) {
    const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    return (const float *) (base + i1 * nb1 + i2 * nb2 + i3 * nb3);
}

// ggml_ext_qdec_bucket in IEEE round-to-nearest arithmetic whatever the fast-math flags
static __device__ __forceinline__ int dec_bucket(float v, float b0, float b15) {
    if (!(v > 0.0f)) {
        return 31;
    }
    if (v >= b15) {
        if (!(b0 > b15)) {
            return 0;
        }
        const float t = __fmul_rn(__fdiv_rn(__fsub_rn(v, b15), __fsub_rn(b0, b15)), 16.0f);
        const int   i = t >= 15.0f ? 15 : (int) t;
        return 15 - i;
    }
    const float t = __fmul_rn(__fdiv_rn(v, b15), 16.0f);
    const int   i = t >= 15.0f ? 15 : (int) t;
    return 31 - i;
}

// exclusive prefix sum of v over the block (DEC_THREADS threads, thread order); *total the sum
static __device__ int block_scan(int v, int * total) {
    __shared__ int warp_sum[DEC_THREADS / WARP_SIZE + 1];
    const int      lane = threadIdx.x % WARP_SIZE, w = threadIdx.x / WARP_SIZE;
    int            inc  = v;
#pragma unroll
    for (int o = 1; o < WARP_SIZE; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffff, inc, o);
        inc += lane >= o ? n : 0;
    }
    if (lane == WARP_SIZE - 1) {
        warp_sum[w] = inc;
    }
    __syncthreads();
    if (w == 0) {
        const int s  = lane < DEC_THREADS / WARP_SIZE ? warp_sum[lane] : 0;
        int       si = s;
#pragma unroll
        for (int o = 1; o < WARP_SIZE; o <<= 1) {
            const int n = __shfl_up_sync(0xffffffff, si, o);
            si += lane >= o ? n : 0;
        }
        if (lane < DEC_THREADS / WARP_SIZE) {
            warp_sum[lane] = si - s;
        }
        if (lane == DEC_THREADS / WARP_SIZE - 1) {
            warp_sum[DEC_THREADS / WARP_SIZE] = si;
        }
    }
    __syncthreads();
    const int ex = warp_sum[w] + inc - v;
    *total       = warp_sum[DEC_THREADS / WARP_SIZE];
    __syncthreads();  // warp_sum is reused by the next call
    return ex;
}

// phase 1 for one (row, chunk): the chunk's selected channels into idx / xs at slots c * kk + 0..k-1
static __device__ void select_chunk(const dec_args & a, int64_t row, int c) {
    __shared__ int   cnt[32];
    __shared__ int   cut[2];  // the last bucket taken, how many of its channels
    __shared__ float mags[GGML_EXT_QDEC_CHUNK];

    const float * xr = row_ptr(a.x, row, a.ne1, a.ne2, a.x_nb1, a.x_nb2, a.x_nb3) + (int64_t) c * GGML_EXT_QDEC_CHUNK;
    const int64_t Ll = a.K - (int64_t) c * GGML_EXT_QDEC_CHUNK;
    const int     L  = Ll < GGML_EXT_QDEC_CHUNK ? (int) Ll : GGML_EXT_QDEC_CHUNK;
    const int     k  = a.kk < L ? a.kk : L;
    const int     j0 = threadIdx.x * DEC_PER_THREAD;

    float v[DEC_PER_THREAD];
    bool  sel[DEC_PER_THREAD];
#pragma unroll
    for (int e = 0; e < DEC_PER_THREAD; e++) {
        v[e]   = j0 + e < L ? xr[j0 + e] : 0.0f;
        sel[e] = false;
    }

    if (a.exact) {
        // rank by (|x| descending, index), NaN as 0: the k of rank < k
#pragma unroll
        for (int e = 0; e < DEC_PER_THREAD; e++) {
            if (j0 + e < L) {
                mags[j0 + e] = v[e] == v[e] ? fabsf(v[e]) : 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int e = 0; e < DEC_PER_THREAD; e++) {
            const int j = j0 + e;
            if (j < L) {
                const float m    = mags[j];
                int         rank = 0;
                for (int i = 0; i < L && rank < k; i++) {
                    const float o = mags[i];
                    rank += o > m || (o == m && i < j);
                }
                sel[e] = rank < k;
            }
        }
        __syncthreads();  // mags is reused by the block's next chunk
    } else {
        int b[DEC_PER_THREAD];
        if (threadIdx.x < 32) {
            cnt[threadIdx.x] = 0;
        }
        __syncthreads();
#pragma unroll
        for (int e = 0; e < DEC_PER_THREAD; e++) {
            b[e] = j0 + e < L ? dec_bucket(fabsf(v[e]), a.b0, a.b15) : 32;
            if (b[e] < 32) {
                atomicAdd(&cnt[b[e]], 1);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int last = 0, before = 0;
            while (last < 31 && before + cnt[last] < k) {
                before += cnt[last++];
            }
            cut[0] = last;
            cut[1] = k - before;
        }
        __syncthreads();
        const int last = cut[0], take = cut[1];
        int       n_last = 0;
#pragma unroll
        for (int e = 0; e < DEC_PER_THREAD; e++) {
            n_last += b[e] == last;
        }
        int total;
        int before = block_scan(n_last, &total);  // channels of bucket `last` at lower indices
#pragma unroll
        for (int e = 0; e < DEC_PER_THREAD; e++) {
            if (b[e] < last) {
                sel[e] = true;
            } else if (b[e] == last) {
                sel[e] = before++ < take;
            }
        }
    }

    int n = 0;
#pragma unroll
    for (int e = 0; e < DEC_PER_THREAD; e++) {
        n += sel[e];
    }
    int       total;
    int       pos  = block_scan(n, &total);
    const int slot = (int) (row * a.n_sel) + c * a.kk;
#pragma unroll
    for (int e = 0; e < DEC_PER_THREAD; e++) {
        if (sel[e]) {
            a.idx[slot + pos] = c * GGML_EXT_QDEC_CHUNK + j0 + e;
            a.xs[slot + pos]  = v[e];
            pos++;
        }
    }
}

// phase 1 over the grid: dst = y, and every (row, chunk) selected by some block
static __device__ void phase_select(const dec_args & a) {
    const int64_t n_out = a.M * a.rows;
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t r = i / a.M, m = i % a.M;
        float *       d = (float *) row_ptr(a.dst, r, a.ne1, a.ne2, a.d_nb1, a.d_nb2, a.d_nb3);
        d[m]            = row_ptr(a.y, r, a.ne1, a.ne2, a.y_nb1, a.y_nb2, a.y_nb3)[m];
    }
    if (a.n_sel == 0) {
        return;
    }
    const int64_t items = a.rows * a.n_chunks;
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        select_chunk(a, it / a.n_chunks, (int) (it % a.n_chunks));
    }
}

// acc[0..31] += x * the 32 residual codes of piece p (16 bytes) of residual row `rr_row` (bytes past the row's
// end read as code 0: 0x88); VEC: one 16-byte load
template <bool VEC>
static __device__ __forceinline__ void dec_piece_fma(const dec_args & a, const uint8_t * rr_row, int64_t p, float xv,
                                                     float * acc) {
    const uint8_t * rr = rr_row + p * DEC_PIECE;
    uint8_t         q[DEC_PIECE];
    if (VEC) {
        const uint4 u = *(const uint4 *) rr;
        memcpy(q, &u, DEC_PIECE);
    } else {
#pragma unroll
        for (int i = 0; i < DEC_PIECE; i++) {
            q[i] = p * DEC_PIECE + i < (int64_t) a.rs ? rr[i] : 0x88;
        }
    }
#pragma unroll
    for (int i = 0; i < DEC_PIECE; i++) {
        acc[2 * i] += (float) ((int) (q[i] & 15) - 8) * xv;
        acc[2 * i + 1] += (float) ((int) (q[i] >> 4) - 8) * xv;
    }
}

// phase 2: the residual GEMV over the selected channels, added atomically into dst
template <bool VEC> static __device__ void phase_gemv(const dec_args & a) {
    const int64_t nthreads = (int64_t) gridDim.x * blockDim.x;
    const int64_t gt       = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    // thread -> (piece p, lane c); lanes C split the selected channels; when a row has more pieces than the
    // grid has threads, one lane walks the pieces instead
    const int64_t C  = nthreads >= a.pieces ? nthreads / a.pieces : 1;
    const int64_t c  = nthreads >= a.pieces ? gt / a.pieces : 0;
    const int64_t p0 = nthreads >= a.pieces ? gt % a.pieces : gt;
    const int64_t dp = nthreads >= a.pieces ? a.pieces : nthreads;
    if (c >= C || c >= a.n_sel) {
        return;
    }
    for (int64_t p = p0; p < a.pieces; p += dp) {
        const int64_t m0 = p * 2 * DEC_PIECE;
        for (int64_t row = 0; row < a.rows; row++) {
            const int32_t * idx = a.idx + row * a.n_sel;
            const float *   xs  = a.xs + row * a.n_sel;
            float           acc[2 * DEC_PIECE];
#pragma unroll
            for (int i = 0; i < 2 * DEC_PIECE; i++) {
                acc[i] = 0.0f;
            }
            // unrolled: a thread keeps several zero-copy loads in flight (PCIe latency is ~1 us)
#pragma unroll 4
            for (int64_t s = c; s < a.n_sel; s += C) {
                dec_piece_fma<VEC>(a, a.r + (size_t) idx[s] * a.rs, p, xs[s], acc);
            }
            float * d = (float *) row_ptr(a.dst, row, a.ne1, a.ne2, a.d_nb1, a.d_nb2, a.d_nb3);
#pragma unroll
            for (int i = 0; i < 2 * DEC_PIECE; i++) {
                if (m0 + i < a.M) {
                    atomicAdd(d + m0 + i, a.sc[m0 + i] * acc[i]);
                }
            }
        }
    }
}

static __global__ void __launch_bounds__(DEC_THREADS) k_dec_select(const dec_args a) {
    phase_select(a);
}

template <bool VEC> static __global__ void __launch_bounds__(DEC_THREADS) k_dec_gemv(const dec_args a) {
    phase_gemv<VEC>(a);
}

// the fused kernel: a cooperative launch of n_tb blocks, all resident
template <bool VEC> static __global__ void __launch_bounds__(DEC_THREADS) k_dec_fused(const dec_args a) {
    phase_select(a);
    if (a.n_sel == 0) {
        return;  // uniform over the grid: no block waits at the sync
    }
    __threadfence();
    cg::this_grid().sync();
    phase_gemv<VEC>(a);
}

#define DEC_OP_MAX_SEL 2048                        // slots of a row the one-pass kernel holds in shared memory
#define DEC_OP_SLAB    WARP_SIZE                   // pieces per block: one per lane (32 x 32 = 1024 outputs)
#define DEC_OP_WARPS   (DEC_THREADS / WARP_SIZE)
#define DEC_OP_LANE_CH (GGML_EXT_QDEC_CHUNK / WARP_SIZE)  // channels of a chunk per lane, consecutive

static __device__ __forceinline__ int warp_incl_scan(int v, int lane) {
#pragma unroll
    for (int o = 1; o < WARP_SIZE; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffff, v, o);
        v += lane >= o ? n : 0;
    }
    return v;
}

// chunk c of row x (approximate selection) by one warp, ggml_ext_qdec_select's rule: whole buckets from the
// top, then the overflowing bucket's first channels in index order; slots c * kk + 0..k-1 of sidx / sxs
static __device__ void warp_select_chunk(const dec_args & a, const float * xr, int c, int lane, int * hist,
                                         int32_t * sidx, float * sxs) {
    const int64_t Ll = a.K - (int64_t) c * GGML_EXT_QDEC_CHUNK;
    const int     L  = Ll < GGML_EXT_QDEC_CHUNK ? (int) Ll : GGML_EXT_QDEC_CHUNK;
    const int     k  = a.kk < L ? a.kk : L;
    const int     j0 = lane * DEC_OP_LANE_CH;
    float         v[DEC_OP_LANE_CH];
    int           b[DEC_OP_LANE_CH];
    hist[lane] = 0;
    __syncwarp();
#pragma unroll
    for (int e = 0; e < DEC_OP_LANE_CH; e++) {
        const bool in = j0 + e < L;
        v[e]          = in ? xr[(int64_t) c * GGML_EXT_QDEC_CHUNK + j0 + e] : 0.0f;
        b[e]          = in ? dec_bucket(fabsf(v[e]), a.b0, a.b15) : 32;
        if (b[e] < 32) {
            atomicAdd(&hist[b[e]], 1);
        }
    }
    __syncwarp();
    // last = the first bucket l <= 30 whose inclusive count reaches k, else 31; before = the count above it
    const int      cnt  = hist[lane];
    const int      incl = warp_incl_scan(cnt, lane);
    const unsigned hit  = __ballot_sync(0xffffffff, lane < 31 && incl >= k);
    const int      last = hit ? __ffs(hit) - 1 : 31;
    const int      before_last = __shfl_sync(0xffffffff, incl - cnt, last);
    const int      take = k - before_last;
    int            n_last = 0;
#pragma unroll
    for (int e = 0; e < DEC_OP_LANE_CH; e++) {
        n_last += b[e] == last;
    }
    int      seen = warp_incl_scan(n_last, lane) - n_last;  // channels of bucket `last` at lower indices
    unsigned sel  = 0;
    int      n    = 0;
#pragma unroll
    for (int e = 0; e < DEC_OP_LANE_CH; e++) {
        const bool t = b[e] < last || (b[e] == last && seen++ < take);
        sel |= (unsigned) t << e;
        n += t;
    }
    int pos = c * a.kk + warp_incl_scan(n, lane) - n;
#pragma unroll
    for (int e = 0; e < DEC_OP_LANE_CH; e++) {
        if (sel >> e & 1) {
            sidx[pos] = c * GGML_EXT_QDEC_CHUNK + j0 + e;
            sxs[pos]  = v[e];
            pos++;
        }
    }
    __syncwarp();  // hist is reused by this warp's next chunk
}

template <bool VEC> static __global__ void __launch_bounds__(DEC_THREADS) k_dec_onepass(const dec_args a) {
    __shared__ int32_t sidx[DEC_OP_MAX_SEL];
    __shared__ float   sxs[DEC_OP_MAX_SEL];
    __shared__ int     hist[DEC_OP_WARPS][32];
    __shared__ float   acc_s[DEC_OP_SLAB * (2 * DEC_PIECE + 1)];  // lane l's 32 outputs at l * 33: no bank conflicts

    const int64_t slabs = (a.pieces + DEC_OP_SLAB - 1) / DEC_OP_SLAB;
    const int64_t row   = blockIdx.x / slabs;
    const int64_t slab  = blockIdx.x % slabs;
    const int     lane  = threadIdx.x % WARP_SIZE;
    const int     w     = threadIdx.x / WARP_SIZE;

    const float * xr = row_ptr(a.x, row, a.ne1, a.ne2, a.x_nb1, a.x_nb2, a.x_nb3);
    for (int c = w; c < a.n_chunks; c += DEC_OP_WARPS) {
        warp_select_chunk(a, xr, c, lane, hist[w], sidx, sxs);
    }
    for (int i = threadIdx.x; i < DEC_OP_SLAB * (2 * DEC_PIECE + 1); i += DEC_THREADS) {
        acc_s[i] = 0.0f;
    }
    __syncthreads();

    const int64_t p = slab * DEC_OP_SLAB + lane;  // this lane's piece: outputs 32 p .. 32 p + 31
    if (p < a.pieces) {
        float acc[2 * DEC_PIECE];
#pragma unroll
        for (int i = 0; i < 2 * DEC_PIECE; i++) {
            acc[i] = 0.0f;
        }
        // a warp's 32 loads of one slot are one contiguous 512-byte run of the residual row
#pragma unroll 4
        for (int s = w; s < a.n_sel; s += DEC_OP_WARPS) {
            dec_piece_fma<VEC>(a, a.r + (size_t) sidx[s] * a.rs, p, sxs[s], acc);
        }
#pragma unroll
        for (int i = 0; i < 2 * DEC_PIECE; i++) {
            atomicAdd(&acc_s[lane * (2 * DEC_PIECE + 1) + i], acc[i]);
        }
    }
    __syncthreads();

    const int64_t m0 = slab * DEC_OP_SLAB * 2 * DEC_PIECE;
    const float * yr = row_ptr(a.y, row, a.ne1, a.ne2, a.y_nb1, a.y_nb2, a.y_nb3);
    float *       d  = (float *) row_ptr(a.dst, row, a.ne1, a.ne2, a.d_nb1, a.d_nb2, a.d_nb3);
    for (int i = threadIdx.x; i < DEC_OP_SLAB * 2 * DEC_PIECE; i += DEC_THREADS) {
        const int64_t m = m0 + i;
        if (m < a.M) {
            d[m] = yr[m] + a.sc[m] * acc_s[(i / (2 * DEC_PIECE)) * (2 * DEC_PIECE + 1) + i % (2 * DEC_PIECE)];
        }
    }
}

bool ggml_ext_cuda_qdec_host_buft(ggml_backend_buffer_type_t buft) {
    return buft != nullptr && std::strcmp(ggml_backend_buft_name(buft), GGML_EXT_QDEC_HOST_BUFT_NAME) == 0;
}

// A QDEC side file's buffer (src/llama/qdec.c maps the file into one): pinned and mapped whole at the first
// use of any tensor in it, once per process (registration is portable: every device sees it).
static void pin_side_file_once(ggml_backend_buffer_t buf) {
    static std::mutex                      lock;
    static std::vector<ggml_backend_buffer_t> pinned;
    std::lock_guard<std::mutex>            guard(lock);
    if (std::find(pinned.begin(), pinned.end(), buf) != pinned.end()) {
        return;
    }
    ggml_ext_cuda_qdec_pin(ggml_backend_buffer_get_base(buf), ggml_backend_buffer_get_size(buf));
    pinned.push_back(buf);
}

// t->data (r or scales) as a pointer the kernel can read: GPU memory as is, registered/pinned host memory
// through its mapping (zero-copy), a QDEC side file's buffer pinned first; anything else refused by name
static const uint8_t * residual_device_ptr(const ggml_tensor * t) {
    for (int attempt = 0; attempt < 2; attempt++) {
        cudaPointerAttributes at;
        const cudaError_t     e = cudaPointerGetAttributes(&at, t->data);
        if (e != cudaSuccess) {
            (void) cudaGetLastError();
            GGML_ABORT("dec_mul_mat: cannot tell where the residual '%s' lives (%s)", t->name, cudaGetErrorString(e));
        }
        if (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged) {
            return (const uint8_t *) t->data;
        }
        if (at.type == cudaMemoryTypeHost && at.devicePointer != nullptr) {
            return (const uint8_t *) at.devicePointer;
        }
        if (attempt == 0 && t->buffer != nullptr && ggml_ext_cuda_qdec_host_buft(ggml_backend_buffer_get_type(t->buffer))) {
            pin_side_file_once(t->buffer);
            continue;
        }
        break;
    }
    GGML_ABORT(
        "dec_mul_mat: the residual '%s' is in host memory CUDA cannot map: put it in a CUDA host buffer or "
        "register it with ggml_ext_cuda_qdec_pin",
        t->name);
}

void ggml_ext_cuda_qdec_pin(void * ptr, size_t size) {
    cudaError_t e = cudaHostRegister(ptr, size, cudaHostRegisterMapped | cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    if (e == cudaErrorNotSupported || e == cudaErrorInvalidValue) {
        (void) cudaGetLastError();  // a device without read-only registration
        e = cudaHostRegister(ptr, size, cudaHostRegisterMapped | cudaHostRegisterPortable);
    }
    if (e != cudaSuccess && e != cudaErrorHostMemoryAlreadyRegistered) {
        GGML_ABORT("dec_mul_mat: cudaHostRegister of %zu bytes of residuals: %s", size, cudaGetErrorString(e));
    }
    (void) cudaGetLastError();
}

void ggml_ext_cuda_qdec_unpin(void * ptr) {
    (void) cudaHostUnregister(ptr);
    (void) cudaGetLastError();
}

// resident blocks of the fused kernel on `device` (cooperative launch's limit), cached; 0: no cooperative launch
static int fused_capacity(int device, bool vec) {
    static int cache[GGML_CUDA_MAX_DEVICES][2];
    int &      c = cache[device][vec];
    if (c == 0) {
        int coop = 0, per_sm = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
        if (vec) {
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_dec_fused<true>, DEC_THREADS, 0));
        } else {
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_dec_fused<false>, DEC_THREADS, 0));
        }
        c = coop ? per_sm * ggml_cuda_info().devices[device].nsm : -1;
    }
    return c > 0 ? c : 0;
}

// GGML_EXT_DEC_LAUNCH: "coop" / "split" / "onepass" forces the launch; unset or anything else: automatic
// (one-pass where it applies). Read at each launch (the tests and the benchmark switch it between runs).
static int launch_mode() {
    return ggml_ext_settings_dec_launch();  // GGML_EXT_DEC_LAUNCH_*: 1 coop, 2 split, 3 onepass
}

static bool supports(int device, const ggml_tensor * op) {
    GGML_UNUSED(device);
    if (ggml_ext_dec_mul_mat_check(op) != nullptr) {
        return false;
    }
    // slots are int32 and idx values are channels
    const int64_t kk = std::min<int64_t>(((const int32_t *) op->op_params)[0], GGML_EXT_QDEC_CHUNK);
    return op->src[1]->ne[0] <= INT32_MAX && ggml_nrows(op) * op->src[1]->ne[0] <= INT32_MAX &&
           ggml_nrows(op) * kk * ((op->src[1]->ne[0] + GGML_EXT_QDEC_CHUNK - 1) / GGML_EXT_QDEC_CHUNK) <= INT32_MAX;
}

static void forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const char * err = ggml_ext_dec_mul_mat_check(dst);
    if (err) {
        GGML_ABORT("%s", err);
    }
    const ggml_tensor * y = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const ggml_tensor * r = dst->src[2];
    const ggml_tensor * s = dst->src[3];
    const int32_t *     p = (const int32_t *) dst->op_params;
    if (ggml_nelements(dst) == 0) {
        return;
    }

    dec_args a;
    a.y     = (const char *) y->data;
    a.x     = (const char *) x->data;
    a.sc    = (const float *) residual_device_ptr(s);  // in GPU memory, or read in place as r
    a.dst   = (char *) dst->data;
    a.M     = y->ne[0];
    a.K     = x->ne[0];
    a.rows  = ggml_nrows(y);
    a.ne1   = y->ne[1];
    a.ne2   = y->ne[2];
    a.y_nb1 = y->nb[1], a.y_nb2 = y->nb[2], a.y_nb3 = y->nb[3];
    a.x_nb1 = x->nb[1], a.x_nb2 = x->nb[2], a.x_nb3 = x->nb[3];
    a.d_nb1 = dst->nb[1], a.d_nb2 = dst->nb[2], a.d_nb3 = dst->nb[3];
    a.rs       = r->nb[1];
    a.pieces   = (int64_t) ((a.rs + DEC_PIECE - 1) / DEC_PIECE);
    a.n_chunks = (int) ((a.K + GGML_EXT_QDEC_CHUNK - 1) / GGML_EXT_QDEC_CHUNK);
    a.kk       = std::min(p[0], GGML_EXT_QDEC_CHUNK);
    const int64_t last = a.K - (int64_t) (a.n_chunks - 1) * GGML_EXT_QDEC_CHUNK;
    a.n_sel            = a.kk == 0 ? 0 : (a.n_chunks - 1) * a.kk + (int) std::min<int64_t>(a.kk, last);
    a.exact            = p[1] == GGML_EXT_QDEC_EXACT;
    memcpy(&a.b0, p + 2, sizeof(float));
    memcpy(&a.b15, p + 3, sizeof(float));

    cudaStream_t                  stream = ctx.stream();
    ggml_cuda_pool_alloc<int32_t> idx(ctx.pool(), std::max<int64_t>(1, a.rows * a.n_sel));
    ggml_cuda_pool_alloc<float>   xs(ctx.pool(), std::max<int64_t>(1, a.rows * a.n_sel));
    a.idx = idx.get();
    a.xs  = xs.get();
    a.r   = a.n_sel ? residual_device_ptr(r) : (const uint8_t *) r->data;

    const int n_sm = ggml_cuda_info().devices[ctx.device].nsm;
    if (a.n_sel == 0) {
        const int64_t blocks = std::min<int64_t>((a.M * a.rows + DEC_THREADS - 1) / DEC_THREADS, 4 * n_sm);
        k_dec_select<<<(unsigned) blocks, DEC_THREADS, 0, stream>>>(a);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    // the 16-byte loads need every residual row 16-byte aligned
    const bool vec  = a.rs % DEC_PIECE == 0 && (uintptr_t) a.r % DEC_PIECE == 0;
    const int  n_tb = ggml_ext_dec_mul_mat_n_tb(dst) > 0 ? ggml_ext_dec_mul_mat_n_tb(dst) : n_sm;

    const int  mode    = launch_mode();
    const bool onepass = !a.exact && a.n_sel <= DEC_OP_MAX_SEL;
    if (mode == 3 && !onepass) {
        GGML_ABORT("dec_mul_mat: GGML_EXT_DEC_LAUNCH=onepass takes the approximate selection of at most %d channels "
                   "per row (here %s, %d)", DEC_OP_MAX_SEL, a.exact ? "exact" : "approximate", a.n_sel);
    }
    if (onepass && (mode == 0 || mode == 3)) {
        const int64_t blocks = a.rows * ((a.pieces + DEC_OP_SLAB - 1) / DEC_OP_SLAB);
        GGML_ASSERT(blocks <= INT32_MAX);
        if (vec) {
            k_dec_onepass<true><<<(unsigned) blocks, DEC_THREADS, 0, stream>>>(a);
        } else {
            k_dec_onepass<false><<<(unsigned) blocks, DEC_THREADS, 0, stream>>>(a);
        }
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    const int  cap  = fused_capacity(ctx.device, vec);
    const bool coop = cap > 0 && n_tb <= cap && mode != 2;
    if (mode == 1 && !coop) {
        GGML_ABORT("dec_mul_mat: GGML_EXT_DEC_LAUNCH=coop, but %d blocks are not all resident (at most %d)", n_tb, cap);
    }
    if (coop) {
        cudaLaunchConfig_t   cfg = {};
        cudaLaunchAttribute  attr[1];
        attr[0].id              = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        cfg.gridDim             = dim3((unsigned) n_tb);
        cfg.blockDim            = dim3(DEC_THREADS);
        cfg.dynamicSmemBytes    = 0;
        cfg.stream              = stream;
        cfg.attrs               = attr;
        cfg.numAttrs            = 1;
        if (vec) {
            CUDA_CHECK(cudaLaunchKernelEx(&cfg, k_dec_fused<true>, a));
        } else {
            CUDA_CHECK(cudaLaunchKernelEx(&cfg, k_dec_fused<false>, a));
        }
        return;
    }
    const int64_t sel_blocks = std::max<int64_t>(a.rows * a.n_chunks, std::min<int64_t>((a.M * a.rows + DEC_THREADS - 1) / DEC_THREADS, n_sm));
    k_dec_select<<<(unsigned) std::min<int64_t>(sel_blocks, INT32_MAX), DEC_THREADS, 0, stream>>>(a);
    CUDA_CHECK(cudaGetLastError());
    if (vec) {
        k_dec_gemv<true><<<n_tb, DEC_THREADS, 0, stream>>>(a);
    } else {
        k_dec_gemv<false><<<n_tb, DEC_THREADS, 0, stream>>>(a);
    }
    CUDA_CHECK(cudaGetLastError());
}

extern const ggml_ext_cuda_op ggml_ext_cuda_op_dec_mul_mat = { supports, forward };
