// The KVQuant decode op (ggml-ext-kvquant.h; docs/KVQUANT.md "The decode op", "The CUDA path") on ggml-cuda, for a
// cache in VRAM: the op's three GGML_OP_CUSTOM nodes (recognised by ggml_ext_kvquant_attn_node_kind, through patch
// 0421's hook in kvquant_cuda.cu) with kernels of their own, the same contract as the CPU functions of
// backend/kvquant_attn_cpu.c:
//   table    F32 [n_dims, n_cells]: cos / sin of every cell's position, a thread per (cell, pair) (kva::table_pair:
//            the angle stepped as the CPU steps it, in IEEE round-to-nearest intrinsics; cos / sin in double, rounded
//            to float: the CPU's cosf / sinf to the last bit or one ulp; -use_fast_math would make them __cosf);
//   partial  F32 [hd_v + 2, n_chunks, n_head, n_tokens]: one CUDA block of KVA_WARPS warps per (cell range, KV head,
//            stream, slice of at most KVA_QMAX of the KV head's query (head, token) pairs). Per block, the KV head's
//            rows are located once (kvq::row_geo_of: the key channels, the place in a sink row; views it refuses
//            are read value by value through kvq::dequantize_value). Sub-ranges of KVA_SUB cells: the mask of the
//            sub-range into shared memory, then a warp per visible cell decodes its V row into shared memory and its
//            key row into the warp's buffer a 64-value block at a time (the trailer once per block, each lane two
//            values: kvq::block_value; a sink row's floats from the marks loaded beside the blocks: the CPU's
//            to_float bit for bit; or F16 / F32), applies the K norm, ropes the key from the table and scores it
//            against the slice's queries (warp sums); the scores become weights exp(s - m) with the running max m
//            rescaled per sub-range (online softmax); then a thread per value dimension accumulates the decoded
//            V rows from shared memory. F32 throughout; exp in double.
//            The fast path for NUQ K and V of one head dim (64 / 128 / 256) roped over the whole head: k_lanes
//            (FlashDecoding-style, keys read as upstream's flash-attention vector kernel reads them: a lane scores
//            one cell's whole key alone, 32 cells a warp at a time, one exp per lane and query; then lane l
//            accumulates dimensions l + 32 k of those cells' values; the warps merged at the end; the same output),
//            GGML_EXT_KV_ATTN_SPLIT=0 turns it off.
//   combine  F32 [hd_v, n_head, n_tokens]: sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c, a block per (row, 64
//            dimensions): each chunk's weight computed once into shared memory, sixteen chunk groups summed apart and
//            added in order.
// tests/c/test_kvattn_cuda.cpp checks the GPU op against the CPU op on the same bound caches.
#include "ggml-ext-cuda.cuh"

#include "ggml-cuda/common.cuh"
#include "ggml-ext-kvquant.h"
#include "backend/kvquant_attn_params.h"
#include "kvquant_attn_decode.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

// the kernel arguments of the NUQ memory at p (kvquant_cuda.cu: its binding's device tables)
kvq::kvq_args ggml_ext_cuda_kvquant_args(const void * p, ggml_type type, int device);
extern "C" bool ggml_ext_kvquant_attn_cells(int64_t hd);  // ggml-base (backend/kvquant_attn_base.c)

namespace {

constexpr int KVA_WARPS   = 8;   // warps per block of the partial kernel
constexpr int KVA_THREADS = 32 * KVA_WARPS;
constexpr int KVA_QMAX    = 16;  // queries (head, token) per block
constexpr int KVA_SUB     = 32;  // cells scored and decoded before their weights and values (the online-softmax step)
constexpr int KVA_CTILE   = 2048;  // chunks whose weights the combine holds in shared memory at a time
constexpr int KVA_CDIMS   = 64;    // value dimensions per block of the combine
constexpr int KVA_CGROUPS = 16;    // chunk groups per block of the combine (a thread per dimension and group)

using kva::row_kind;
using kva::row_value;

static row_kind kind_of(ggml_type t) {
    return t == GGML_TYPE_F16 ? kva::ROW_F16 : t == GGML_TYPE_F32 ? kva::ROW_F32 : kva::ROW_NUQ;
}

// (float sums and maxima: ggml-cuda's warp_reduce_sum / warp_reduce_max, common.cuh)
__device__ __forceinline__ double warp_sum_d(double x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
    }
    return x;
}

__device__ __forceinline__ float exp_rn(float x) {
    return (float) exp((double) x);  // not __expf (-use_fast_math): the CPU's exp to an ulp
}

// ---- the table ----

// a thread per (cell, pair): kva::table_pair
__global__ void k_table(const int32_t * pos, const float * ff, float * out, int64_t n, kva::table_args r) {
    const int     h2 = r.n_dims / 2;
    const int64_t t  = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n * h2) {
        const int64_t c = t / h2;
        const int     j = (int) (t % h2);
        kva::table_pair(r, pos[c], ff, j, out + c * r.n_dims + 2 * j);
    }
}

// ---- the partial sums ----

struct partial_args {
    const char * q;
    int64_t      q_nb1, q_nb2, q_nb0;
    const char * k;
    int64_t      k_nb1, k_nb2, k_nb3;
    const char * v;
    int64_t      v_nb1, v_nb2, v_nb3;
    const char * mask;
    int64_t      m_nb0, m_nb1, m_nb3;
    int          mask_f16, mask_streams;
    const float * tab;
    const float * norm_w;
    float *      out;
    int          hd, hdv, n_hkv, n_kv, n_head, n_ts, n_q, n_chunks, n_slices, nqa;
    int          chunk, mode, n_dims;
    float        scale, norm_eps;
    row_kind     k_kind, v_kind;
};

// shared memory of a block (nqa = min(QMAX, the KV head's queries)): q [nqa][hd], key rows [WARPS][hd], value rows
// [SUB][hdv], weights [nqa][SUB], acc [nqa][hdv], m / l / factor [nqa], visible [SUB]
static size_t partial_smem(int hd, int hdv, int nqa) {
    return sizeof(float) * ((size_t) nqa * hd + (size_t) KVA_WARPS * hd + (size_t) KVA_SUB * hdv +
                            (size_t) nqa * KVA_SUB + (size_t) nqa * hdv + 3 * nqa + KVA_SUB);
}

// the n values of the head row of cell i, stream s at p into dst, by a warp (lane: d = lane + 32 k). A NUQ row whose
// view kvq::row_geo_of took (geo): per block the trailer read once and each lane's two values (kvq::block_value),
// then, for a sink row (kvq::row_sink with a lane per slot, hw slots in use; the first slot that holds the row, as
// kvq::sink_slot), its floats over them (the marks are loaded before the blocks: one round of memory latency);
// otherwise value by value (kva::row_value).
__device__ __forceinline__ void warp_row(row_kind kind, const kvq::kvq_args & a, const float * vals, bool geo,
                                         const kvq::row_geo & g, int64_t hw, const char * p, int64_t i, int64_t s,
                                         int n, float * dst, int lane) {
    if (kind != kva::ROW_NUQ || !geo) {
        for (int d = lane; d < n; d += 32) {
            dst[d] = row_value(kind, a, p, d);
        }
        return;
    }
    const int64_t row  = g.row0 < 0 ? -1 : g.row0 + i * g.d_cell + s * g.d_stream;
    const int64_t mark = row >= 0 && lane < hw ? a.sink[1 + lane] : -2;
    for (int j = 0; j < n / kvq::QK; j++) {
        const char *     blk  = p + j * a.block_bytes;
        const uint16_t * wp   = (const uint16_t *) (blk + a.dense_bytes);  // 2-byte aligned (kvq::row_geo_of)
        const uint16_t   w[4] = { wp[0], wp[1], wp[2], wp[3] };
        const int64_t    ch   = g.ch0 + j * kvq::QK;
        dst[j * kvq::QK + lane]      = kvq::block_value(a, vals, ch, blk, w, lane);
        dst[j * kvq::QK + 32 + lane] = kvq::block_value(a, vals, ch, blk, w, lane + 32);
    }
    if (row < 0) {
        return;
    }
    unsigned hit = __ballot_sync(0xffffffffu, mark == row);
    int64_t  k0  = 0;
    while (!hit && k0 + 32 < hw) {  // more than 32 slots in use: the next ones
        k0 += 32;
        hit = __ballot_sync(0xffffffffu, k0 + lane < hw && a.sink[1 + k0 + lane] == row);
    }
    if (hit) {
        const float * sk = a.sink_data + (k0 + __ffs(hit) - 1) * a.row_values + g.off;
        for (int d = lane; d < n; d += 32) {
            dst[d] = sk[d];
        }
    }
}

// QM: the registers' queries (4, 8 or KVA_QMAX: the fewest that hold the slice's; fewer registers, more blocks per SM)
template <int QM>
__global__ void __launch_bounds__(KVA_THREADS) k_partial(partial_args p, kvq::kvq_args ka, kvq::kvq_args va) {
    extern __shared__ float smem[];
    const int c = blockIdx.x, h = blockIdx.y, s = blockIdx.z / p.n_slices, slice = blockIdx.z % p.n_slices;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int n_group = p.n_q * p.n_ts;  // the KV head's queries: gq = g * n_ts + ti
    const int q0 = slice * KVA_QMAX, nqb = min(KVA_QMAX, n_group - q0), nqa = p.nqa;
    const int c0 = c * p.chunk, c1 = min(c0 + p.chunk, p.n_kv);

    float * qs   = smem;
    float * kb   = qs + nqa * p.hd;
    float * vb   = kb + KVA_WARPS * p.hd;
    float * wt   = vb + KVA_SUB * p.hdv;
    float * acc  = wt + nqa * KVA_SUB;
    float * mx   = acc + nqa * p.hdv;
    float * sum  = mx + nqa;
    float * fac  = sum + nqa;
    float * seen = fac + nqa;

    // the KV head's rows: channels and sink rows found once (kvq::row_geo_of), for every cell of the block
    kvq::row_geo kg = {}, vg = {};
    const bool   k_geo = p.k_kind == kva::ROW_NUQ &&
                       kvq::row_geo_of(ka, p.k + h * p.k_nb1, p.k_nb2, p.k_nb3, p.hd / kvq::QK, &kg);
    const bool v_geo = p.v_kind == kva::ROW_NUQ &&
                       kvq::row_geo_of(va, p.v + h * p.v_nb1, p.v_nb2, p.v_nb3, p.hdv / kvq::QK, &vg);
    // the sink slots in use (row0 >= 0: the binding has sink rows)
    const int64_t k_hw = k_geo && kg.row0 >= 0 ? ka.sink[0] : 0, v_hw = v_geo && vg.row0 >= 0 ? va.sink[0] : 0;

    // the 2^B values of K's and V's tables in shared memory (a lane's index picks its own: no serialised constant reads)
    __shared__ float ktab[16], vtab[16];
    if (tid < 16) {
        ktab[tid] = ka.values[tid];
        vtab[tid] = va.values[tid];
    }

    // the slice's queries: query i = KV head h's gq = q0 + i, head h * n_q + gq / n_ts, token s * n_ts + gq % n_ts
    for (int e = tid; e < nqb * p.hd; e += KVA_THREADS) {
        const int i = e / p.hd, d = e % p.hd, gq = q0 + i;
        const int hq = h * p.n_q + gq / p.n_ts, tok = s * p.n_ts + gq % p.n_ts;
        qs[e]        = *(const float *) (p.q + hq * p.q_nb1 + (int64_t) tok * p.q_nb2 + d * p.q_nb0);
    }
    for (int e = tid; e < nqb * p.hdv; e += KVA_THREADS) {
        acc[e] = 0.0f;
    }
    if (tid < nqb) {
        mx[tid]  = -INFINITY;
        sum[tid] = 0.0f;
    }
    __syncthreads();

    const char * mask_s = p.mask + (p.mask_streams > 1 ? s * p.m_nb3 : 0);
    float *      kr     = kb + warp * p.hd;

    for (int b0 = c0; b0 < c1; b0 += KVA_SUB) {
        const int nb = min(KVA_SUB, c1 - b0);
        // the mask of the slice's queries over the sub-range into wt (each entry later replaced by its score by the
        // warp that reads it)
        for (int e = tid; e < nqb * nb; e += KVA_THREADS) {
            const int    i  = e / nb, cc = e % nb;
            const char * mp = mask_s + (int64_t) (b0 + cc) * p.m_nb0 + (int64_t) ((q0 + i) % p.n_ts) * p.m_nb1;
            wt[i * KVA_SUB + cc] = p.mask_f16 ? __half2float(*(const half *) mp) : *(const float *) mp;
        }
        __syncthreads();
        // a warp per cell: its V row decoded into vb, its key decoded, normed, roped and scored
        for (int cc = warp; cc < nb; cc += KVA_WARPS) {
            const int64_t cell = b0 + cc;
            const float   mv   = lane < nqb ? wt[lane * KVA_SUB + cc] : -INFINITY;
            const bool any = __any_sync(0xffffffffu, mv != -INFINITY);
            if (lane == 0) {
                seen[cc] = any ? 1.0f : 0.0f;
            }
            if (!any) {
                if (lane < nqb) {
                    wt[lane * KVA_SUB + cc] = -INFINITY;
                }
                continue;
            }
            warp_row(p.v_kind, va, vtab, v_geo, vg, v_hw, p.v + cell * p.v_nb2 + s * p.v_nb3 + h * p.v_nb1, cell, s, p.hdv,
                     vb + cc * p.hdv, lane);
            warp_row(p.k_kind, ka, ktab, k_geo, kg, k_hw, p.k + cell * p.k_nb2 + s * p.k_nb3 + h * p.k_nb1, cell, s, p.hd,
                     kr, lane);
            if (p.norm_w) {  // the model's K norm, as ggml's rms_norm and mul compute it
                double ss = 0.0;
                for (int d = lane; d < p.hd; d += 32) {
                    ss += (double) __fmul_rn(kr[d], kr[d]);
                }
                ss              = warp_sum_d(ss);
                const float sc1 = kva::norm_scale(ss, p.hd, p.norm_eps);
                for (int d = lane; d < p.hd; d += 32) {
                    kr[d] = kva::norm_apply(kr[d], sc1, p.norm_w[d]);
                }
            }
            __syncwarp();
            // RoPE from the table: lane's dims into registers (d = lane + 32 i), then the dots
            const float * cs = p.tab + ((int64_t) s * p.n_kv + cell) * p.n_dims;
            float         dots[QM];
#pragma unroll
            for (int i = 0; i < QM; i++) {
                dots[i] = 0.0f;
            }
            for (int d = lane; d < p.hd; d += 32) {
                const float y = kva::rope_at(p.mode, p.n_dims, kr, cs, d);
#pragma unroll
                for (int i = 0; i < QM; i++) {
                    if (i < nqb) {
                        dots[i] += qs[i * p.hd + d] * y;
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < QM; i++) {
                if (i < nqb) {
                    const float dt = warp_reduce_sum(dots[i]);
                    const float m  = __shfl_sync(0xffffffffu, mv, i);
                    if (lane == 0) {
                        wt[i * KVA_SUB + cc] = m == -INFINITY ? -INFINITY : p.scale * dt + m;
                    }
                }
            }
            __syncwarp();  // kr is rewritten by the warp's next cell
        }
        __syncthreads();

        // weights: a warp per query, the running max, exp(s - m), the sum
        for (int i = warp; i < nqb; i += KVA_WARPS) {
            float * w  = wt + i * KVA_SUB;
            float   lm = -INFINITY;
            for (int cc = lane; cc < nb; cc += 32) {
                lm = fmaxf(lm, w[cc]);
            }
            const float m_old = mx[i], m_new = fmaxf(m_old, warp_reduce_max(lm));
            float       ls    = 0.0f;
            for (int cc = lane; cc < nb; cc += 32) {
                const float e = w[cc] == -INFINITY ? 0.0f : exp_rn(w[cc] - m_new);
                w[cc]         = e;
                ls += e;
            }
            ls = warp_reduce_sum(ls);
            __syncwarp();
            if (lane == 0) {
                const float f = m_old == -INFINITY ? 0.0f : exp_rn(m_old - m_new);
                fac[i]        = m_new == -INFINITY ? 1.0f : f;
                sum[i]        = m_new == -INFINITY ? 0.0f : sum[i] * f + ls;
                mx[i]         = m_new;
            }
        }
        __syncthreads();

        // values: a thread per value dimension, the decoded rows from shared memory, every query of the slice
        for (int d = tid; d < p.hdv; d += KVA_THREADS) {
            float a[QM];
#pragma unroll
            for (int i = 0; i < QM; i++) {
                a[i] = i < nqb ? acc[i * p.hdv + d] * fac[i] : 0.0f;
            }
            for (int cc = 0; cc < nb; cc++) {
                if (seen[cc] == 0.0f) {
                    continue;
                }
                const float vv = vb[cc * p.hdv + d];
#pragma unroll
                for (int i = 0; i < QM; i++) {
                    if (i < nqb) {
                        const float w = wt[i * KVA_SUB + cc];
                        if (w != 0.0f) {  // a masked cell's NaN-free zero weight adds nothing (as on the CPU)
                            a[i] += w * vv;
                        }
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < QM; i++) {
                if (i < nqb) {
                    acc[i * p.hdv + d] = a[i];
                }
            }
        }
        __syncthreads();
    }

    const int ew = p.hdv + 2;
    for (int e = tid; e < nqb * ew; e += KVA_THREADS) {
        const int i = e / ew, d = e % ew, gq = q0 + i;
        const int hq = h * p.n_q + gq / p.n_ts, tok = s * p.n_ts + gq % p.n_ts;
        float *   o  = p.out + (((int64_t) tok * p.n_head + hq) * p.n_chunks + c) * ew;
        o[d]         = d < p.hdv ? acc[i * p.hdv + d] : d == p.hdv ? mx[i] : sum[i];
    }
}

// ---- the fast path: a lane per cell (FlashDecoding split-K) ----

constexpr int KVL_WARPS   = 4;  // warps per block of k_lanes
constexpr int KVL_THREADS = 32 * KVL_WARPS;

// queries per block of k_lanes: with the key's words, its dots and the accumulators (queries x hd / 32 per lane) the
// registers stay under 128 (more queries: more blocks, each decoding the keys again)
constexpr int KVL_QM = 4;

// cells whose V blocks a lane has in flight at a time (a lane's bytes and the trailer: 3 registers a block)
template <int HD> __host__ __device__ constexpr int v_in_flight() {
    return HD == 64 ? 8 : HD == 128 ? 4 : 2;
}

// lane's sink floats of the head row of cell i, stream s, where the warp reads one cell (hw slots in use, mark:
// lane's slot mark, the first 32), or NULL (warp-uniform); kvq::row_sink's first slot
__device__ __forceinline__ const float * warp_sink(const kvq::kvq_args & a, const kvq::row_geo & g, int64_t hw,
                                                   int64_t mark, int64_t i, int64_t s, int lane) {
    if (hw == 0) {
        return nullptr;
    }
    const int64_t row = g.row0 + i * g.d_cell + s * g.d_stream;
    unsigned      hit = __ballot_sync(0xffffffffu, mark == row);
    int64_t       k0  = 0;
    while (!hit && k0 + 32 < hw) {  // more than 32 slots in use: the next ones
        k0 += 32;
        hit = __ballot_sync(0xffffffffu, k0 + lane < hw && a.sink[1 + k0 + lane] == row);
    }
    return hit ? a.sink_data + (k0 + __ffs(hit) - 1) * a.row_values + g.off : nullptr;
}

// lane's HD / 32 values of a head row from its loaded blocks (kvq::lane_values per block: out[2 j + hh] is channel
// lane + 32 hh of block j, dimension lane + 32 (2 j + hh); mid / half zeros: values)
template <int HD>
__device__ __forceinline__ void lane_decode(const kvq::kvq_args & a, const float * tab,
                                            const kvq::lane_blk (&bl)[HD / kvq::QK], int lane, const float * zeros,
                                            float * out) {
#pragma unroll
    for (int j = 0; j < HD / kvq::QK; j++) {
        kvq::lane_values(a, tab, bl[j], lane, zeros, zeros, out + 2 * j);
    }
}

// A block per (cell range, KV head, stream, slice of at most KVL_QM queries): NUQ K (BITS) and V rows that kvq::row_geo_of
// takes, hd == hd_v == n_dims == HD. Warp w takes the range's cells 32 at a time (cells w 32 .. w 32 + 31, then
// KVL_WARPS 32 further), as upstream's flash-attention vector kernel takes its keys:
//   keys    lane l scores cell l of the tile alone (kva::lane_key_dots: its K head row loaded into registers with
//           8-byte loads, decoded, K-normed, roped from its table row and dotted with the queries in shared memory;
//           a sink row from its floats, kva::float_key_dots);
//   softmax per query a warp max over the tile, one exp per lane (running max m the same in every lane, the lane's
//           part of the sum l; one rescale of the accumulators per tile), the weights into shared memory;
//   values  lane l holds dimensions d = l + 32 k: the tile's cells a few at a time, their V blocks requested together
//           (kvq::lane_load), each decoded (kvq::lane_values; a sink row's floats) and accumulated with its weights.
// No block barrier in the cell loop. At the end the warps' (m, l, acc) are merged per query in shared memory and
// written as k_partial writes them.
template <int HD, int BITS>
__global__ void __launch_bounds__(KVL_THREADS, HD == 256 ? 3 : 4) k_lanes(partial_args p, kvq::kvq_args ka, kvq::kvq_args va, kva::head_geo khg, kva::head_geo vhg, int n_slices) {
    constexpr int QM = KVL_QM, NB = HD / kvq::QK, BW = kva::key_words<BITS>(), KS = HD / 32, VU = v_in_flight<HD>();
    __shared__ __align__(16) float qs[QM * HD];
    __shared__ __align__(16) float pw[KVL_WARPS][32][QM];
    __shared__ float   sm[KVL_WARPS][QM], sl[KVL_WARPS][QM], sacc[KVL_WARPS][QM][HD], fac[KVL_WARPS][QM];
    __shared__ float ktab[16], vtab[16], nws[HD], khs[HD], kms[HD], zs[HD];
    const int c = blockIdx.x, h = blockIdx.y, s = blockIdx.z / n_slices, slice = blockIdx.z % n_slices;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int n_group = p.n_q * p.n_ts;
    const int q0 = slice * QM, nqb = min(QM, n_group - q0);
    const int c0 = c * p.chunk, c1 = min(c0 + p.chunk, p.n_kv);

    const kvq::row_geo kg = khg.at(h), vg = vhg.at(h);  // kva::head_geo_of: the launch found and checked both
    const int64_t v_hw = vg.row0 >= 0 ? va.sink[0] : 0, v_mark = lane < v_hw ? va.sink[1 + lane] : -2;

    if (tid < 16) {
        ktab[tid] = ka.values[tid];
        vtab[tid] = va.values[tid];
    }
    if (tid < KVL_WARPS * QM) {  // each warp's running max m and sum l per query
        sm[tid / QM][tid % QM] = -INFINITY;
        sl[tid / QM][tid % QM] = 0.0f;
    }
    for (int e = tid; e < QM * HD; e += KVL_THREADS) {
        const int i = e / HD, d = e % HD, gq = q0 + i;
        float     x = 0.0f;
        if (i < nqb) {
            const int hq = h * p.n_q + gq / p.n_ts, tok = s * p.n_ts + gq % p.n_ts;
            x = *(const float *) (p.q + hq * p.q_nb1 + (int64_t) tok * p.q_nb2 + d * p.q_nb0);
        }
        qs[e] = x;
    }
    // the K norm's weights and the keys' channel scales (1 / 0 for keys without: kva::key_block_of); zeros for values
    const bool key = ka.row_blocks > 0;
    for (int d = tid; d < HD; d += KVL_THREADS) {
        nws[d] = p.norm_w ? p.norm_w[d] : 1.0f;
        khs[d] = key ? ka.k_half[kg.ch0 + d] : 1.0f;
        kms[d] = key ? ka.k_mid[kg.ch0 + d] : 0.0f;
        zs[d]  = 0.0f;
    }
    const bool neox = p.mode == GGML_ROPE_TYPE_NEOX, norm = p.norm_w != nullptr;
    __syncthreads();

    float acc[QM][KS];
#pragma unroll
    for (int i = 0; i < QM; i++) {
#pragma unroll
        for (int k = 0; k < KS; k++) {
            acc[i][k] = 0.0f;
        }
    }
    const char *   k_h    = p.k + s * p.k_nb3 + h * p.k_nb1;
    const char *   v_h    = p.v + s * p.v_nb3 + h * p.v_nb1;
    const char *   mask_s = p.mask + (p.mask_streams > 1 ? s * p.m_nb3 : 0);
    const float4 * tab_s  = (const float4 *) (p.tab + (int64_t) s * p.n_kv * HD);  // rows of HD floats (the launch: aligned)

    for (int t0 = c0 + 32 * warp; t0 < c1; t0 += 32 * KVL_WARPS) {
        // the keys: lane l scores cell t0 + l against every query (its masks wait in its weights' places)
        const int cell = t0 + lane;
        bool      live = false;
#pragma unroll
        for (int i = 0; i < QM; i++) {
            float mk = -INFINITY;
            if (cell < c1 && i < nqb) {
                const char * mp = mask_s + (int64_t) ((q0 + i) % p.n_ts) * p.m_nb1 + (int64_t) cell * p.m_nb0;
                mk = p.mask_f16 ? __half2float(*(const half *) mp) : *(const float *) mp;
            }
            pw[warp][lane][i] = mk;
            live              = live || mk != -INFINITY;
        }
        float dot[QM], ss = 0.0f;
#pragma unroll
        for (int i = 0; i < QM; i++) {
            dot[i] = 0.0f;
        }
        if (live) {
            const char *   kr = k_h + (int64_t) cell * p.k_nb2;
            const float4 * cs = tab_s + (int64_t) cell * (HD / 4);
            const float *  sk = kvq::row_sink(ka, kg, cell, s);  // a sink row: its floats
            if (sk) {
                kva::float_key_dots<HD, QM>(sk, nws, neox, (const float *) cs, qs, dot, &ss);
            } else {
                uint32_t        w[NB][BW];
                kva::key_block kb[NB];
#pragma unroll
                for (int j = 0; j < NB; j++) {
#pragma unroll
                    for (int u = 0; u < BW / 2; u++) {
                        const uint2 t = ((const uint2 *) (kr + j * ka.block_bytes))[u];
                        w[j][2 * u] = t.x, w[j][2 * u + 1] = t.y;
                    }
                }
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    kb[j] = kva::key_block_of(ka, w[j][BW - 2], w[j][BW - 1]);
                }
                if (neox) {
                    kva::lane_key_dots<HD, BITS, QM, true>(w, kb, ktab, khs, kms, nws, cs, qs, dot, &ss);
                } else {
                    kva::lane_key_dots<HD, BITS, QM, false>(w, kb, ktab, khs, kms, nws, cs, qs, dot, &ss);
                }
            }
        }
        const float nsc = norm ? kva::norm_scale((double) ss, HD, p.norm_eps) : 1.0f;
        // the softmax: per query the tile's max, one exp per lane, the weights into shared memory (the warp's m and
        // l there too: the same in every lane)
        bool  rescale = false;
        float f[QM];
#pragma unroll
        for (int i = 0; i < QM; i++) {
            f[i]     = 1.0f;
            float pv = 0.0f;
            if (i < nqb) {
                const float mk    = pw[warp][lane][i], m_old = sm[warp][i];
                const float sc    = live && mk != -INFINITY ? p.scale * (dot[i] * nsc) + mk : -INFINITY;
                const float m_new = fmaxf(m_old, warp_reduce_max(sc));
                f[i]              = m_new == m_old ? 1.0f : m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
                pv                = sc == -INFINITY ? 0.0f : __expf(sc - m_new);
                const float ls    = warp_reduce_sum(pv);
                __syncwarp();  // every lane has read m_old before lane 0 writes the new m and l
                if (lane == 0) {
                    sm[warp][i] = m_new;
                    sl[warp][i] = sl[warp][i] * f[i] + ls;
                }
                rescale = rescale || f[i] != 1.0f;
            }
            pw[warp][lane][i] = pv;
        }
        if (rescale) {
#pragma unroll
            for (int i = 0; i < QM; i++) {
#pragma unroll
                for (int k = 0; k < KS; k++) {
                    acc[i][k] *= f[i];
                }
            }
        }
        __syncwarp();
        // the values: VU cells' blocks requested at a time, then each decoded and accumulated
        const int nc = min(32, c1 - t0);
        for (int j0 = 0; j0 < nc; j0 += VU) {
            kvq::lane_blk vb[VU][NB];
#pragma unroll
            for (int u = 0; u < VU; u++) {
                if (j0 + u < nc) {
#pragma unroll
                    for (int j = 0; j < NB; j++) {
                        vb[u][j] = kvq::lane_load(va, v_h + (int64_t) (t0 + j0 + u) * p.v_nb2 + j * va.block_bytes, lane);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < VU; u++) {
                if (j0 + u >= nc) {
                    break;
                }
                float pi[QM];
                bool  any = false, all = true;
#pragma unroll
                for (int i = 0; i < QM; i++) {
                    pi[i] = pw[warp][j0 + u][i];
                    any   = any || pi[i] != 0.0f;
                    all   = all && (pi[i] != 0.0f || i >= nqb);
                }
                if (!any) {
                    continue;
                }
                float         vv[KS];
                const float * sv = warp_sink(va, vg, v_hw, v_mark, t0 + j0 + u, s, lane);
                if (sv) {
#pragma unroll
                    for (int k = 0; k < KS; k++) {
                        vv[k] = sv[lane + 32 * k];
                    }
                } else {
                    lane_decode<HD>(va, vtab, vb[u], lane, zs, vv);
                }
#pragma unroll
                for (int i = 0; i < QM; i++) {
#pragma unroll
                    for (int k = 0; k < KS; k++) {
                        // a cell masked for query i adds nothing to it (NaN-free)
                        acc[i][k] = all || pi[i] != 0.0f ? acc[i][k] + pi[i] * vv[k] : acc[i][k];
                    }
                }
            }
        }
        __syncwarp();  // the next tile rewrites the warp's weights
    }

    // the warps' (m, l, acc) merged per query
#pragma unroll
    for (int i = 0; i < QM; i++) {
#pragma unroll
        for (int k = 0; k < KS; k++) {
            sacc[warp][i][lane + 32 * k] = acc[i][k];
        }
    }
    __syncthreads();
    if (tid < KVL_WARPS * QM) {
        const int w = tid / QM, i = tid % QM;
        float     M = -INFINITY;
        for (int u = 0; u < KVL_WARPS; u++) {
            M = fmaxf(M, sm[u][i]);
        }
        fac[w][i] = sm[w][i] == -INFINITY ? 0.0f : __expf(sm[w][i] - M);
    }
    __syncthreads();
    const int ew = HD + 2;
    for (int e = tid; e < nqb * ew; e += KVL_THREADS) {
        const int i = e / ew, d = e % ew, gq = q0 + i;
        const int hq = h * p.n_q + gq / p.n_ts, tok = s * p.n_ts + gq % p.n_ts;
        float     M = -INFINITY, o = 0.0f;
        for (int u = 0; u < KVL_WARPS; u++) {
            M = fmaxf(M, sm[u][i]);
            o += d < HD ? fac[u][i] * sacc[u][i][d] : d == HD ? 0.0f : fac[u][i] * sl[u][i];
        }
        float * out = p.out + (((int64_t) tok * p.n_head + hq) * p.n_chunks + c) * ew;
        out[d]      = d == HD ? M : o;
    }
}

template <int HD, int BITS>
static void launch_lanes_q(const partial_args & p, const kvq::kvq_args & ka, const kvq::kvq_args & va,
                           const kva::head_geo & kg, const kva::head_geo & vg, int n_streams, cudaStream_t stream) {
    const int  n_slices = (p.n_q * p.n_ts + KVL_QM - 1) / KVL_QM;
    const dim3 grid((unsigned) p.n_chunks, (unsigned) p.n_hkv, (unsigned) (n_streams * n_slices));
    k_lanes<HD, BITS><<<grid, KVL_THREADS, 0, stream>>>(p, ka, va, kg, vg, n_slices);
}

template <int HD>
static void launch_lanes_bits(const partial_args & p, const kvq::kvq_args & ka, const kvq::kvq_args & va,
                              const kva::head_geo & kg, const kva::head_geo & vg, int n_streams, cudaStream_t stream) {
    switch (ka.bits) {
        case 2:
            launch_lanes_q<HD, 2>(p, ka, va, kg, vg, n_streams, stream);
            break;
        case 3:
            launch_lanes_q<HD, 3>(p, ka, va, kg, vg, n_streams, stream);
            break;
        default:
            launch_lanes_q<HD, 4>(p, ka, va, kg, vg, n_streams, stream);
            break;
    }
}

static bool nuq_rows_ok(const kvq::kvq_args & a, const char * base, int64_t nb1, int64_t nb2, int64_t nb3) {
    // kvq::lane_load and the key rows' 8-byte loads: 2..4 bits, blocks of the index bytes and the trailer, 8-byte
    // aligned
    return a.bits >= 2 && a.bits <= 4 && a.dense_bytes == 8 * a.bits && a.block_bytes == a.dense_bytes + 8 &&
           (uintptr_t) base % 8 == 0 && nb1 % 8 == 0 && nb2 % 8 == 0 && nb3 % 8 == 0;
}

// the fast path if it takes the op (NUQ K and V rows kvq::row_geo_of takes for every KV head, stepping evenly from
// head to head: kva::head_geo_of; hd == hd_v == n_dims of 64, 128 or 256, normal / NEOX RoPE, V without channel scales)
// and ggml_ext_kvquant_attn_cells allows it
// (GGML_EXT_KV_ATTN_SPLIT=0, read at every launch, turns it off: tests/c/test_kvattn_cuda.cpp runs both kernels)
static bool launch_lanes(const partial_args & p, const kvq::kvq_args & ka, const kvq::kvq_args & va, int n_streams,
                         cudaStream_t stream) {
    if (p.hd != p.hdv || !ggml_ext_kvquant_attn_cells(p.hd) || p.k_kind != kva::ROW_NUQ || p.v_kind != kva::ROW_NUQ ||
        p.n_dims != p.hd || va.row_blocks > 0 || (uintptr_t) p.tab % 16 ||
        !nuq_rows_ok(ka, p.k, p.k_nb1, p.k_nb2, p.k_nb3) || !nuq_rows_ok(va, p.v, p.v_nb1, p.v_nb2, p.v_nb3)) {
        return false;
    }
    kva::head_geo kg, vg;
    if (!kva::head_geo_of(ka, p.k, p.k_nb1, p.k_nb2, p.k_nb3, p.hd / kvq::QK, p.n_hkv, &kg) ||
        !kva::head_geo_of(va, p.v, p.v_nb1, p.v_nb2, p.v_nb3, p.hd / kvq::QK, p.n_hkv, &vg)) {
        return false;
    }
    switch (p.hd) {
        case 64:
            launch_lanes_bits<64>(p, ka, va, kg, vg, n_streams, stream);
            break;
        case 128:
            launch_lanes_bits<128>(p, ka, va, kg, vg, n_streams, stream);
            break;
        default:
            launch_lanes_bits<256>(p, ka, va, kg, vg, n_streams, stream);
            break;
    }
    return true;
}

// ---- the combine ----

// a block per (row, KVA_CDIMS dimensions): M the chunks' largest m (a block max), then per tile of KVA_CTILE chunks
// their weights exp(m_c - M) (0 where nothing was visible: such a chunk's acc and l are zeros) in shared memory, and
// thread (group g, dimension d) sums weight * acc over the tile's chunks c = g mod KVA_CGROUPS (and weight * l);
// the groups' sums added in group order: out = o / L (zeros where M = -inf)
__global__ void __launch_bounds__(KVA_CDIMS * KVA_CGROUPS) k_combine(const float * part, float * out, int hdv,
                                                                   int n_chunks) {
    __shared__ float e[KVA_CTILE];
    __shared__ float red[KVA_CDIMS * KVA_CGROUPS / 32];
    __shared__ float po[KVA_CGROUPS][KVA_CDIMS], pl[KVA_CGROUPS];
    const int64_t r   = blockIdx.x;
    const int     ew  = hdv + 2, tid = threadIdx.x, nt = blockDim.x;
    const int     g   = tid / KVA_CDIMS, dl = tid % KVA_CDIMS, d = blockIdx.y * KVA_CDIMS + dl;
    const float * P   = part + r * n_chunks * ew;
    float         lm  = -INFINITY;
    for (int c = tid; c < n_chunks; c += nt) {
        lm = fmaxf(lm, P[c * ew + hdv]);
    }
    lm = warp_reduce_max(lm);
    if (tid % 32 == 0) {
        red[tid / 32] = lm;
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < nt / 32; w++) {
        M = fmaxf(M, red[w]);
    }
    float o = 0.0f, L = 0.0f;
    for (int t0 = 0; t0 < n_chunks; t0 += KVA_CTILE) {
        const int nc = min(KVA_CTILE, n_chunks - t0);
        __syncthreads();
        for (int c = tid; c < nc; c += nt) {
            const float m = P[(t0 + c) * ew + hdv];
            e[c]          = m == -INFINITY ? 0.0f : exp_rn(m - M);
        }
        __syncthreads();
        if (M != -INFINITY) {
            for (int c = g; c < nc; c += KVA_CGROUPS) {
                const float * Pc = P + (int64_t) (t0 + c) * ew;
                L += e[c] * Pc[hdv + 1];
                if (d < hdv) {
                    o += e[c] * Pc[d];
                }
            }
        }
    }
    po[g][dl] = o;
    if (dl == 0) {
        pl[g] = L;
    }
    __syncthreads();
    if (g == 0 && d < hdv) {
        float os = 0.0f, ls = 0.0f;
        for (int k = 0; k < KVA_CGROUPS; k++) {
            os += po[k][dl];
            ls += pl[k];
        }
        out[r * hdv + d] = M == -INFINITY ? 0.0f : __fdiv_rn(os, ls);  // no cell visible to this query: zeros
    }
}

static bool row_ok(const ggml_tensor * t, int64_t n) {
    if (!t || t->nb[0] != ggml_type_size(t->type)) {
        return false;
    }
    if (t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_F32) {
        return true;
    }
    return ggml_ext_kvquant_is_cache_type((int) t->type) && n % kvq::QK == 0;
}

static void launch_table(ggml_tensor * dst, cudaStream_t stream) {
    ggml_ext_kvquant_rope r;
    memcpy(&r, (const char *) dst->op_params + GGML_EXT_KVQUANT_ATTN_OFF, sizeof(r));
    const kva::table_args a = kva::table_args_of(r);
    const int64_t n = dst->ne[1], n_pairs = n * (a.n_dims / 2);
    if (n_pairs > 0) {
        k_table<<<(unsigned) ((n_pairs + 255) / 256), 256, 0, stream>>>(
            (const int32_t *) dst->src[0]->data, dst->src[1] ? (const float *) dst->src[1]->data : nullptr,
            (float *) dst->data, n, a);
    }
}

template <int QM>
static void launch_partial_q(dim3 grid, size_t smem, int device, cudaStream_t stream, const partial_args & p,
                             const kvq::kvq_args & ka, const kvq::kvq_args & va) {
    static size_t smem_set[GGML_CUDA_MAX_DEVICES] = {};  // the largest size allowed so far, per device
    if (smem > 48 * 1024 && smem > smem_set[device]) {
        CUDA_CHECK(cudaFuncSetAttribute(k_partial<QM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
        smem_set[device] = smem;
    }
    k_partial<QM><<<grid, KVA_THREADS, smem, stream>>>(p, ka, va);
}

static void launch_partial(ggml_tensor * dst, int device, cudaStream_t stream) {
    const ggml_tensor * q = dst->src[0], * k = dst->src[1], * v = dst->src[2], * mask = dst->src[3];
    ggml_ext_kvquant_attn_params pp;
    memcpy(&pp, (const char *) dst->op_params + GGML_EXT_KVQUANT_ATTN_OFF, sizeof(pp));
    partial_args p;
    p.q            = (const char *) q->data;
    p.q_nb0        = q->nb[0];
    p.q_nb1        = q->nb[1];
    p.q_nb2        = q->nb[2];
    p.k            = (const char *) k->data;
    p.k_nb1        = k->nb[1];
    p.k_nb2        = k->nb[2];
    p.k_nb3        = k->nb[3];
    p.v            = (const char *) v->data;
    p.v_nb1        = v->nb[1];
    p.v_nb2        = v->nb[2];
    p.v_nb3        = v->nb[3];
    p.mask         = (const char *) mask->data;
    p.m_nb0        = mask->nb[0];
    p.m_nb1        = mask->nb[1];
    p.m_nb3        = mask->nb[3];
    p.mask_f16     = mask->type == GGML_TYPE_F16;
    p.mask_streams = (int) mask->ne[3];
    p.tab          = (const float *) dst->src[4]->data;
    p.norm_w       = dst->src[5] ? (const float *) dst->src[5]->data : nullptr;
    p.out          = (float *) dst->data;
    p.hd           = (int) k->ne[0];
    p.hdv          = (int) v->ne[0];
    p.n_hkv        = (int) k->ne[1];
    p.n_kv         = (int) k->ne[2];
    p.n_head       = (int) q->ne[1];
    p.n_ts         = (int) (q->ne[2] / k->ne[3]);
    p.n_q          = p.n_head / p.n_hkv;
    p.n_chunks     = (int) dst->ne[1];
    p.n_slices     = (p.n_q * p.n_ts + KVA_QMAX - 1) / KVA_QMAX;
    p.nqa          = std::min(KVA_QMAX, p.n_q * p.n_ts);
    p.chunk        = pp.chunk;
    p.mode         = pp.mode;
    p.n_dims       = pp.n_dims;
    p.scale        = pp.scale;
    p.norm_eps     = pp.norm_eps;
    p.k_kind       = kind_of(k->type);
    p.v_kind       = kind_of(v->type);
    kvq::kvq_args ka = {}, va = {};
    if (p.k_kind == kva::ROW_NUQ) {
        ka = ggml_ext_cuda_kvquant_args(k->data, k->type, device);
    }
    if (p.v_kind == kva::ROW_NUQ) {
        va = ggml_ext_cuda_kvquant_args(v->data, v->type, device);
    }
    if (p.n_kv == 0 || p.n_ts == 0) {
        return;
    }
    if (launch_lanes(p, ka, va, (int) k->ne[3], stream)) {
        return;
    }
    const size_t smem = partial_smem(p.hd, p.hdv, p.nqa);
    const dim3 grid((unsigned) p.n_chunks, (unsigned) p.n_hkv, (unsigned) (k->ne[3] * p.n_slices));
    if (p.nqa <= 4) {
        launch_partial_q<4>(grid, smem, device, stream, p, ka, va);
    } else if (p.nqa <= 8) {
        launch_partial_q<8>(grid, smem, device, stream, p, ka, va);
    } else {
        launch_partial_q<KVA_QMAX>(grid, smem, device, stream, p, ka, va);
    }
}

}  // namespace

bool ggml_ext_cuda_kvquant_attn_supports(int device, const ggml_tensor * op) {
    switch (ggml_ext_kvquant_attn_node_kind(op)) {
        case GGML_EXT_KVQUANT_ATTN_TABLE:
            return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && op->src[0]->type == GGML_TYPE_I32 &&
                   ggml_is_contiguous(op->src[0]) && (!op->src[1] || op->src[1]->type == GGML_TYPE_F32);
        case GGML_EXT_KVQUANT_ATTN_COMBINE:
            return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && op->src[0]->type == GGML_TYPE_F32 &&
                   ggml_is_contiguous(op->src[0]);
        case GGML_EXT_KVQUANT_ATTN_PARTIAL:
            {
                const ggml_tensor * q = op->src[0], * k = op->src[1], * v = op->src[2], * mask = op->src[3];
                const ggml_tensor * tab = op->src[4], * w = op->src[5];
                if (!q || q->type != GGML_TYPE_F32 || !row_ok(k, k->ne[0]) || !row_ok(v, v->ne[0]) || !mask ||
                    (mask->type != GGML_TYPE_F16 && mask->type != GGML_TYPE_F32) || !tab ||
                    tab->type != GGML_TYPE_F32 || !ggml_is_contiguous(tab) ||
                    (w && (w->type != GGML_TYPE_F32 || !ggml_is_contiguous(w))) ||
                    op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) {
                    return false;
                }
                ggml_ext_kvquant_attn_params pp;
                memcpy(&pp, (const char *) op->op_params + GGML_EXT_KVQUANT_ATTN_OFF, sizeof(pp));
                if (pp.mode != GGML_ROPE_TYPE_NORMAL && pp.mode != GGML_ROPE_TYPE_NEOX) {
                    return false;
                }
                const int64_t n_group = q->ne[1] / k->ne[1] * (q->ne[2] / k->ne[3]);
                const int     nqa     = (int) std::min<int64_t>(KVA_QMAX, n_group);
                return partial_smem((int) k->ne[0], (int) v->ne[0], nqa) + 32 * sizeof(float) <=  // + ktab, vtab
                       ggml_cuda_info().devices[device].smpbo;
            }
        default:
            return false;
    }
}

void ggml_ext_cuda_kvquant_attn_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    cudaStream_t stream = ctx.stream();
    switch (ggml_ext_kvquant_attn_node_kind(dst)) {
        case GGML_EXT_KVQUANT_ATTN_TABLE:
            launch_table(dst, stream);
            break;
        case GGML_EXT_KVQUANT_ATTN_PARTIAL:
            launch_partial(dst, ctx.device, stream);
            break;
        case GGML_EXT_KVQUANT_ATTN_COMBINE:
            {
                const ggml_tensor * part = dst->src[0];
                const int64_t       rows = dst->ne[1] * dst->ne[2];
                if (rows > 0 && dst->ne[0] > 0) {
                    const dim3 grid((unsigned) rows, (unsigned) ((dst->ne[0] + KVA_CDIMS - 1) / KVA_CDIMS));
                    k_combine<<<grid, KVA_CDIMS * KVA_CGROUPS, 0, stream>>>(
                        (const float *) part->data, (float *) dst->data, (int) dst->ne[0], (int) part->ne[1]);
                }
            }
            break;
        default:
            GGML_ABORT("ggml-ext: %s is not a node of the KVQuant decode op", dst->name);
    }
}
