// The codebook types CB2 / CB3 (docs/formats/codebooks.md, formats/codebooks/codebooks.h) on CUDA: the
// file's bytes as they are in GPU memory, two kernels, called from ggml-cuda.cu through patch 0410:
//   dequantize   blocks -> f32 / f16 / bf16 (ggml_get_to_fp*_cuda): ggml-cuda's own cuBLAS path
//                (ggml_cuda_mul_mat_cublas) then runs every batch of more than GGML_EXT_CODEBOOKS_MMV_MAX tokens;
//   mat-vec      y = W x for 1..GGML_EXT_CODEBOOKS_MMV_MAX tokens (decode, small batches) straight from the blocks:
//                by default the integer one (cb_mul_mat_vec_q8: q8_1 activations, weights decoded to int8 by byte
//                permutes of the codebooks held in registers, dp4a); with GGML_EXT_CB_MMV=f32 the f32 one below
//                (cb_mul_mat_vec), kept for comparison.
// The f32 mat-vec and the dequantizer:
// Every weight is w = d * (l_s + 1) * T[c_s][q]: the 16 or 32 table entries come in as a kernel parameter and
// are staged as floats in shared memory once per CUDA block (32 lanes looking up different codes read
// different banks of a 32-entry table: no conflicts, where __constant__ memory would serialise them).
//
// The f32 mat-vec takes the activations as f32 and looks each weight up in the shared-memory table: on an H100
// it reached 0.60x Q2_K's decode speed (docs/RESULTS.md "Codebooks (CB2/CB3)"), bound by those per-weight lookups and the bit
// unpacking around them, which is what the integer mat-vec replaces (4 weights per byte permute).
//
// Mat-vec work split: one warp per weight row; each CB block (256 weights) is read by the whole warp,
// lane t taking code bytes qs[2t], qs[2t+1] (one 16-bit load; the warp's 64 bytes coalesced): byte i holds
// weight i & 15 of the four sub-groups 4 (i >> 4) .. 4 (i >> 4) + 3, so a lane decodes 8 weights of 4
// sub-groups with one more 16-bit load of their scales, one byte of codebook indices, the fp16 d (and for
// CB3 a 16-bit load of hmask). Decode at 1-2 tokens is bound by how many of these reads are in flight: a
// lane issues the loads of 8 blocks (CB3 6; 4 at 3-8 tokens) before decoding the first, and the kernel is
// held to 64 registers at 2 tokens so that 4 CUDA blocks of 8 warps share an SM (on an H100 the 4096 rows
// of a 7B model's matrices then run in one wave; 3 CUDA blocks, 80 registers, at 3-8 tokens). At one token
// the multiplier comes after the two products (3 float operations per weight pair, not 5), and a warp takes
// two rows sharing the activation loads (up to 128 registers, 2 CUDA blocks per SM; not measured yet:
// rows past the end are read again, not written; 0.60x Q2_K before it). The first version (one block per step, byte loads,
// 3 CUDA blocks per SM) reached 0.52x Q2_K's decode speed on an H100 (docs/RESULTS.md "Codebooks (CB2/CB3)"). How both
// kernels read the bits is in codebooks_decode.cuh (host-checked by tests/cuda/codebooks_decode_check.cu).
#include "ggml-ext-cuda.cuh"

#include "ggml-cuda/common.cuh"
#include "ggml-cuda/convert.cuh"
#include "ggml-cuda/quantize.cuh"
#include "codebooks_decode.cuh"
#include "common/settings.h"
#include "formats/codebooks/codebooks.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

static_assert(sizeof(ggml_ext_block_cb2) == 78 && sizeof(ggml_ext_block_cb3) == 110, "codebooks.h's blocks");

namespace {

constexpr int QK      = GGML_EXT_QK_CB;  // 256
constexpr int MMV_ROWS = 8;              // rows (warps) per CUDA block of the mat-vec

// The tables go in as a kernel parameter (kernel parameters sit in constant memory: nothing to upload per
// device) and are staged into shared memory as floats.
template <int BITS> const cb_tables & host_tables() {
    static const cb_tables t = cb_make_tables<BITS>();
    return t;
}

template <int BITS> __device__ __forceinline__ void stage_table(const cb_tables & src, float * tab) {
    for (int i = threadIdx.x; i < cb_traits<BITS>::n_tab; i += blockDim.x) {
        tab[i] = (float) src.t[i];
    }
    __syncthreads();
}

// ---- dequantize: 32 threads per block of 256 weights, thread t writes weights 8t .. 8t + 7 (sub-group
// t / 2, its half t & 1); 8 blocks per CUDA block of 256 threads ----
template <int BITS, typename dst_t>
__global__ void cb_dequantize(const cb_tables tables, const void * __restrict__ vx, dst_t * __restrict__ y, int64_t n_blocks) {
    __shared__ float tab[cb_traits<BITS>::n_tab];
    stage_table<BITS>(tables, tab);
    const int64_t ib = (int64_t) blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (ib >= n_blocks) {
        return;
    }
    const int   t  = threadIdx.x % 32;
    const int   s  = t / 2;
    const auto * b = (const typename cb_traits<BITS>::block *) vx + ib;
    const float dm = __half2float(*(const __half *) &b->d) * (float) cb_mult<BITS>(b, s);
    dst_t *     out = y + ib * QK + 16 * s + 8 * (t & 1);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        out[j] = ggml_cuda_cast<dst_t>(dm * tab[cb_code_index<BITS>(b, s, 8 * (t & 1) + j)]);
    }
}

template <int BITS, typename dst_t>
void dequantize_cuda(const void * vx, dst_t * y, int64_t k, cudaStream_t stream) {
    const int64_t n_blocks = k / QK;
    if (n_blocks == 0) {
        return;
    }
    cb_dequantize<BITS, dst_t><<<(unsigned) ((n_blocks + 7) / 8), 256, 0, stream>>>(host_tables<BITS>(), vx, y, n_blocks);
    CUDA_CHECK(cudaGetLastError());
}

// ---- mat-vec: dst[c, r] = sum_k W[r, k] x[c, k] for NCOLS columns of x ----
struct mmv_args {
    const char *  w;       // src0 bytes
    const float * x;       // src1
    float *       y;       // dst
    int64_t       n_rows, n_blocks;        // rows of W, blocks per row
    int64_t       nb01, nb02, nb03;        // W strides (bytes)
    int64_t       s11, s12, s13;           // x strides (floats)
    int64_t       s1, s2, s3;              // dst strides (floats)
    int64_t       ne12;                    // x channels (dim 2)
    int64_t       r2, r3;                  // broadcast ratios ne12 / ne02, ne13 / ne03
};

// At one token a warp takes two rows (RPW): the lane's 8 activations per block are loaded once for both,
// halving the activation reads (1 KB per block and warp from L1, against the block's 78 / 110 bytes); each
// row keeps NB blocks in flight, so the kernel may use up to 128 registers (2 CUDA blocks per SM: the same
// loads in flight per SM as 4 CUDA blocks of one row per warp).
template <int NCOLS> constexpr int MMV_RPW = NCOLS == 1 ? 2 : 1;

template <int BITS, int NCOLS>
__global__ void __launch_bounds__(32 * MMV_ROWS, NCOLS == 1 ? 2 : NCOLS <= 2 ? 4 : 3)
cb_mul_mat_vec(const cb_tables tables, const mmv_args a) {
    using block = typename cb_traits<BITS>::block;
    constexpr int RPW = MMV_RPW<NCOLS>;
    __shared__ float tab[cb_traits<BITS>::n_tab];
    stage_table<BITS>(tables, tab);
    const int64_t row0 = ((int64_t) blockIdx.x * MMV_ROWS + threadIdx.x / 32) * RPW;
    if (row0 >= a.n_rows) {
        return;
    }
    const int64_t i12 = blockIdx.y % a.ne12, i13 = blockIdx.y / a.ne12;
    const block * wr[RPW];
#pragma unroll
    for (int rw = 0; rw < RPW; rw++) {  // past the last row (odd row counts) the last row is read again, not written
        const int64_t row = row0 + rw < a.n_rows ? row0 + rw : a.n_rows - 1;
        wr[rw] = (const block *) (a.w + row * a.nb01 + (i12 / a.r2) * a.nb02 + (i13 / a.r3) * a.nb03);
    }
    const float * x   = a.x + i12 * a.s12 + i13 * a.s13;
    const int     lane = threadIdx.x % 32;
    const int     jj0  = (2 * lane) & 15;      // the lane's weights: 16 s + jj0 + {0, 1}, s = 4 (lane >> 3) + p

    float acc[RPW][NCOLS] = {};
    // One block's contribution (for each of the warp's rows) from what cb_lane_load loaded: per sub-group the
    // multiplier times the table entries, then the super-scale d once per block and column. The multiplier
    // l + 1 (1..16) becomes a float through the exponent trick (2^23 + m - 2^23, exact) rather than an
    // int-to-float conversion, which runs at a quarter of the FMA rate and would cost a quarter of the time
    // budget of a block at full bandwidth.
    auto block_dot = [&](const cb_lane_raw (&r)[RPW], int64_t ib) {
        const float * xb = x + ib * QK + 16 * 4 * (lane >> 3) + jj0;
        float2        x1[4];  // one column: the lane's activations, loaded once for the warp's rows
        if constexpr (NCOLS == 1) {
#pragma unroll
            for (int p = 0; p < 4; p++) {
                x1[p] = *(const float2 *) (xb + 16 * p);
            }
        }
#pragma unroll
        for (int rw = 0; rw < RPW; rw++) {
            const float d = __half2float(__ushort_as_half((unsigned short) r[rw].d));
            int         idx[4][2], mult[4];
            cb_lane_unpack<BITS>(r[rw], lane, idx, mult);
            float blk[NCOLS] = {};
#pragma unroll
            for (int p = 0; p < 4; p++) {
                const float m  = __int_as_float(0x4B000000 | mult[p]) - 8388608.0f;
                const float t0 = tab[idx[p][0]], t1 = tab[idx[p][1]];
                if constexpr (NCOLS == 1) {  // the multiplier after the two products: 3 operations, not 5
                    blk[0] += m * (t0 * x1[p].x + t1 * x1[p].y);
                } else {  // the multiplier into the weights once, shared by the columns
                    const float w0 = m * t0, w1 = m * t1;
#pragma unroll
                    for (int col = 0; col < NCOLS; col++) {
                        const float2 xv = *(const float2 *) (xb + col * a.s11 + 16 * p);
                        blk[col] += w0 * xv.x + w1 * xv.y;
                    }
                }
            }
#pragma unroll
            for (int col = 0; col < NCOLS; col++) {
                acc[rw][col] += d * blk[col];
            }
        }
    };
    // NB blocks of each row at a time: all their loads issued before the first is used, so a warp keeps
    // RPW x NB x 78 (110) bytes in flight instead of one block's (decode is bound by the latency of these
    // reads: one block per step left the first version at ~10% of an H100's bandwidth). The last step may be
    // partial (rows of 11008 = 43 blocks): its loads stay together, predicated.
    // fewer with more columns (their accumulators need the registers) and for CB3 (a fifth load, hmask)
    constexpr int NB = NCOLS > 2 ? 4 : BITS == 2 ? 8 : 6;
    for (int64_t ib0 = 0; ib0 < a.n_blocks; ib0 += NB) {
        const int64_t n = a.n_blocks - ib0;
        cb_lane_raw   r[NB][RPW] = {};
#pragma unroll
        for (int u = 0; u < NB; u++) {
            if (u < n) {
#pragma unroll
                for (int rw = 0; rw < RPW; rw++) {
                    r[u][rw] = cb_lane_load<BITS>(wr[rw] + ib0 + u, lane);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < NB; u++) {
            if (u < n) {
                block_dot(r[u], ib0 + u);
            }
        }
    }
#pragma unroll
    for (int rw = 0; rw < RPW; rw++) {
        if (row0 + rw < a.n_rows) {  // the same for the whole warp
#pragma unroll
            for (int col = 0; col < NCOLS; col++) {
                const float v = warp_reduce_sum(acc[rw][col]);
                if (lane == 0) {
                    a.y[i12 * a.s2 + i13 * a.s3 + col * a.s1 + row0 + rw] = v;
                }
            }
        }
    }
}

template <int BITS, int NCOLS>
void launch_mmv(const mmv_args & a, int64_t n_channels, cudaStream_t stream) {
    constexpr int64_t rows = MMV_ROWS * MMV_RPW<NCOLS>;  // rows per CUDA block
    const dim3 grid((unsigned) ((a.n_rows + rows - 1) / rows), (unsigned) n_channels, 1);
    cb_mul_mat_vec<BITS, NCOLS><<<grid, 32 * MMV_ROWS, 0, stream>>>(host_tables<BITS>(), a);
}

template <int BITS>
void launch_mmv_cols(const mmv_args & a, int ncols, int64_t n_channels, cudaStream_t stream) {
    switch (ncols) {
        case 1: launch_mmv<BITS, 1>(a, n_channels, stream); break;
        case 2: launch_mmv<BITS, 2>(a, n_channels, stream); break;
        case 3: launch_mmv<BITS, 3>(a, n_channels, stream); break;
        case 4: launch_mmv<BITS, 4>(a, n_channels, stream); break;
        case 5: launch_mmv<BITS, 5>(a, n_channels, stream); break;
        case 6: launch_mmv<BITS, 6>(a, n_channels, stream); break;
        case 7: launch_mmv<BITS, 7>(a, n_channels, stream); break;
        default: launch_mmv<BITS, 8>(a, n_channels, stream); break;
    }
}


// ---- integer mat-vec (the default): activations quantized to q8_1 by ggml-cuda's quantize_row_q8_1_cuda, weights
// decoded to int8 in registers by byte permutes of the packed codebooks (codebooks_decode.cuh: cb_q8_unpack), dp4a ----
// Four lanes per CB block (lane quarter t = lane & 3: sub-groups 4t .. 4t + 3, 64 weights), so a warp takes 8
// blocks of its row per step and NB steps' loads are issued before the first is decoded. Per block and column
// the lane's sum is d_w * (d_a[2t] (m0 s0 + m1 s1) + d_a[2t + 1] (m2 s2 + m3 s3)), s_p the int32 dp4a sum of
// sub-group 4t + p and d_a[k] the scale of q8_1 block k of the CB block (32 activations: sub-groups 2k, 2k + 1).
// One row per warp: a 7B model's 4096-row matrices are 4096 warps, one wave of an H100 at 8 warps per CUDA block.
struct mmv_q8_args {
    const char *       w;                 // src0 bytes
    const block_q8_1 * x;                 // src1 quantized: rows of s_row q8_1 blocks, (i13 ne12 + i12) ne11 + col
    float *            y;                 // dst
    int64_t            n_rows, n_blocks;  // rows of W, CB blocks per row
    int64_t            nb01, nb02, nb03;  // W strides (bytes)
    int64_t            s_row;             // q8_1 blocks per activation row (the row padded to MATRIX_ROW_PADDING)
    int64_t            ne11;              // columns (tokens)
    int64_t            s1, s2, s3;        // dst strides (floats)
    int64_t            ne12;              // x channels (dim 2)
    int64_t            r2, r3;            // broadcast ratios ne12 / ne02, ne13 / ne03
};

template <int BITS, int NCOLS>
__global__ void __launch_bounds__(32 * MMV_ROWS, NCOLS <= 2 ? 4 : 2)
cb_mul_mat_vec_q8(const cb_qtables tables, const mmv_q8_args a) {
    using block = typename cb_traits<BITS>::block;
    const int64_t row = (int64_t) blockIdx.x * MMV_ROWS + threadIdx.x / 32;
    if (row >= a.n_rows) {
        return;
    }
    const int64_t i12 = blockIdx.y % a.ne12, i13 = blockIdx.y / a.ne12;
    const block * wr  = (const block *) (a.w + row * a.nb01 + (i12 / a.r2) * a.nb02 + (i13 / a.r3) * a.nb03);
    const block_q8_1 * x = a.x + ((i13 * a.ne12 + i12) * a.ne11) * a.s_row;
    const int lane = threadIdx.x % 32;
    const int t    = lane & 3;   // the lane's quarter of each block
    const int bl   = lane >> 2;  // the lane's block of the warp's 8

    float acc[NCOLS] = {};
    constexpr int NB = NCOLS <= 2 ? 2 : 1;  // steps of 8 blocks whose loads are in flight together
    for (int64_t ib0 = 0; ib0 < a.n_blocks; ib0 += 8 * NB) {
        cb_q8_raw r[NB];
#pragma unroll
        for (int u = 0; u < NB; u++) {
            const int64_t ib = ib0 + 8 * u + bl;
            if (ib < a.n_blocks) {
                r[u] = cb_q8_load<BITS>(wr + ib, t);
            }
        }
#pragma unroll
        for (int u = 0; u < NB; u++) {
            const int64_t ib = ib0 + 8 * u + bl;
            if (ib >= a.n_blocks) {
                continue;
            }
            uint32_t w[4][4];
            int      m[4];
            cb_q8_unpack<BITS>(r[u], t, tables, w, m);
            const float d = __half2float(__ushort_as_half((unsigned short) r[u].d));
#pragma unroll
            for (int col = 0; col < NCOLS; col++) {
                const block_q8_1 * xb = x + col * a.s_row + ib * (QK / QK8_1) + 2 * t;  // q8_1 blocks 2t, 2t + 1
                int                sp[4];
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    const int * xq = (const int *) xb[p >> 1].qs + 4 * (p & 1);  // sub-group 4t + p: 16 bytes
                    int         sum = 0;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        sum = ggml_cuda_dp4a((int) w[p][i], xq[i], sum);
                    }
                    sp[p] = sum;
                }
                const float d0 = __low2float(xb[0].ds), d1 = __low2float(xb[1].ds);
                acc[col] += d * (d0 * (float) (m[0] * sp[0] + m[1] * sp[1]) + d1 * (float) (m[2] * sp[2] + m[3] * sp[3]));
            }
        }
    }
#pragma unroll
    for (int col = 0; col < NCOLS; col++) {
        const float v = warp_reduce_sum(acc[col]);
        if (lane == 0) {
            a.y[i12 * a.s2 + i13 * a.s3 + col * a.s1 + row] = v;
        }
    }
}

template <int BITS> const cb_qtables & host_qtables() {
    static const cb_qtables t = cb_make_qtables<BITS>();
    return t;
}

template <int BITS, int NCOLS>
void launch_mmv_q8(const mmv_q8_args & a, int64_t n_channels, cudaStream_t stream) {
    const dim3 grid((unsigned) ((a.n_rows + MMV_ROWS - 1) / MMV_ROWS), (unsigned) n_channels, 1);
    cb_mul_mat_vec_q8<BITS, NCOLS><<<grid, 32 * MMV_ROWS, 0, stream>>>(host_qtables<BITS>(), a);
}

template <int BITS>
void launch_mmv_q8_cols(const mmv_q8_args & a, int ncols, int64_t n_channels, cudaStream_t stream) {
    switch (ncols) {
        case 1: launch_mmv_q8<BITS, 1>(a, n_channels, stream); break;
        case 2: launch_mmv_q8<BITS, 2>(a, n_channels, stream); break;
        case 3: launch_mmv_q8<BITS, 3>(a, n_channels, stream); break;
        case 4: launch_mmv_q8<BITS, 4>(a, n_channels, stream); break;
        case 5: launch_mmv_q8<BITS, 5>(a, n_channels, stream); break;
        case 6: launch_mmv_q8<BITS, 6>(a, n_channels, stream); break;
        case 7: launch_mmv_q8<BITS, 7>(a, n_channels, stream); break;
        default: launch_mmv_q8<BITS, 8>(a, n_channels, stream); break;
    }
}

// Which mat-vec runs: the integer one, unless GGML_EXT_CB_MMV=f32 asks for the f32 one (kept for comparison:
// tests/c/test_types_backends.cpp checks both against the CPU).
bool use_f32_mmv() {
    return ggml_ext_settings_codebooks_f32_mmv();
}

template <typename T, int BITS>
void dequantize_entry(const void * vx, T * y, int64_t k, cudaStream_t stream) {
    dequantize_cuda<BITS, T>(vx, y, k, stream);
}

}  // namespace

bool ggml_ext_cuda_own_type(ggml_type type) {
    return type == GGML_TYPE_CB2 || type == GGML_TYPE_CB3 || type == GGML_TYPE_APQ;
}

bool ggml_ext_cuda_supports_own_mul_mat(int device, const ggml_tensor * op) {
    const ggml_tensor * w = op->src[0];
    const ggml_tensor * x = op->src[1];
    if (w->type == GGML_TYPE_APQ) {  // the loader's question about an any-precision weight (apq_mul_mat.cu)
        return ggml_ext_cuda_anyprec_supports_mul_mat(device, op);
    }
    // MUL_MAT only (MUL_MAT_ID's expert weights would need an ids-aware kernel), weights whole rows in a
    // contiguous tensor (the dequantizer reads them as one run of blocks), f32 or f16 activations and dst
    return op->op == GGML_OP_MUL_MAT && ggml_ext_cuda_own_type(w->type) && ggml_is_contiguous(w) &&
           w->ne[0] % QK == 0 && (x->type == GGML_TYPE_F32 || x->type == GGML_TYPE_F16) &&
           x->nb[0] == ggml_type_size(x->type) && op->type == GGML_TYPE_F32 && ggml_is_contiguous(op);
}

bool ggml_ext_cuda_mul_mat_vec_own(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                                   ggml_tensor * dst) {
    if (src0->type == GGML_TYPE_APQ) {
        ggml_ext_cuda_anyprec_refuse_mul_mat(src0);  // runs only as APQ_MUL_MAT, with its tables and a precision
    }
    GGML_TENSOR_BINARY_OP_LOCALS
    if (src1->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32 || ne11 < 1 || ne11 > GGML_EXT_CODEBOOKS_MMV_MAX ||
        ne00 % QK != 0 || ne12 % ne02 != 0 || ne13 % ne03 != 0 || nb10 != sizeof(float) ||
        nb11 % (2 * sizeof(float)) != 0 || nb12 % (2 * sizeof(float)) != 0 || nb13 % (2 * sizeof(float)) != 0 ||
        ((uintptr_t) src1->data) % (2 * sizeof(float)) != 0 || ((uintptr_t) src0->data) % 2 != 0 ||
        ne12 * ne13 > 65535) {  // (the mat-vec reads the blocks' bytes in 16-bit pairs)
        return false;  // ggml-cuda's cuBLAS path on the dequantized weights
    }
    if (!use_f32_mmv()) {
        const int64_t ne10_padded = GGML_PAD(ne10, MATRIX_ROW_PADDING);
        ggml_cuda_pool_alloc<char> q8(ctx.pool(), ne13 * ne12 * ne11 * ne10_padded * sizeof(block_q8_1) / QK8_1);
        quantize_row_q8_1_cuda((const float *) src1->data, nullptr, q8.get(), src0->type, ne10, nb11 / sizeof(float),
                               nb12 / sizeof(float), nb13 / sizeof(float), ne10_padded, ne11, ne12, ne13, ctx.stream());
        mmv_q8_args q;
        q.w        = (const char *) src0->data;
        q.x        = (const block_q8_1 *) q8.get();
        q.y        = (float *) dst->data;
        q.n_rows   = ne01;
        q.n_blocks = ne00 / QK;
        q.nb01 = nb01; q.nb02 = nb02; q.nb03 = nb03;
        q.s_row = ne10_padded / QK8_1;
        q.ne11  = ne11;
        q.s1 = nb1 / sizeof(float); q.s2 = nb2 / sizeof(float); q.s3 = nb3 / sizeof(float);
        q.ne12 = ne12;
        q.r2   = ne12 / ne02;
        q.r3   = ne13 / ne03;
        if (src0->type == GGML_TYPE_CB2) {
            launch_mmv_q8_cols<2>(q, (int) ne11, ne12 * ne13, ctx.stream());
        } else {
            launch_mmv_q8_cols<3>(q, (int) ne11, ne12 * ne13, ctx.stream());
        }
        CUDA_CHECK(cudaGetLastError());
        return true;
    }
    mmv_args a;
    a.w        = (const char *) src0->data;
    a.x        = (const float *) src1->data;
    a.y        = (float *) dst->data;
    a.n_rows   = ne01;
    a.n_blocks = ne00 / QK;
    a.nb01 = nb01; a.nb02 = nb02; a.nb03 = nb03;
    a.s11 = nb11 / sizeof(float); a.s12 = nb12 / sizeof(float); a.s13 = nb13 / sizeof(float);
    a.s1 = nb1 / sizeof(float); a.s2 = nb2 / sizeof(float); a.s3 = nb3 / sizeof(float);
    a.ne12 = ne12;
    a.r2 = ne12 / ne02;
    a.r3 = ne13 / ne03;
    if (src0->type == GGML_TYPE_CB2) {
        launch_mmv_cols<2>(a, (int) ne11, ne12 * ne13, ctx.stream());
    } else {
        launch_mmv_cols<3>(a, (int) ne11, ne12 * ne13, ctx.stream());
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}

ggml_ext_to_cuda_t<float> ggml_ext_cuda_get_to_fp32(ggml_type type) {
    return type == GGML_TYPE_CB2 ? dequantize_entry<float, 2> : type == GGML_TYPE_CB3 ? dequantize_entry<float, 3> : nullptr;
}

ggml_ext_to_cuda_t<half> ggml_ext_cuda_get_to_fp16(ggml_type type) {
    return type == GGML_TYPE_CB2 ? dequantize_entry<half, 2> : type == GGML_TYPE_CB3 ? dequantize_entry<half, 3> : nullptr;
}

ggml_ext_to_cuda_t<nv_bfloat16> ggml_ext_cuda_get_to_bf16(ggml_type type) {
    return type == GGML_TYPE_CB2   ? dequantize_entry<nv_bfloat16, 2>
           : type == GGML_TYPE_CB3 ? dequantize_entry<nv_bfloat16, 3>
                                   : nullptr;
}
