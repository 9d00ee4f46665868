// The KVQuant cache types NUQ4 / NUQ3 / NUQ2 (docs/KVQUANT.md "The CUDA path", docs/formats/kvquant.md) with the
// cache in VRAM: what llama.cpp's graph sends to ggml-cuda for them, called through patch 0421:
//   SET_ROWS  f32 -> NUQ   append and quantize (a warp per 64-value block; values with the block's own
//                          mid / half and, with --kv-outliers, one outlier slot; pre-RoPE keys per channel with
//                          two slots, or with GGML_EXT_KV_KBLOCK per channel and then as such a value block with
//                          its one slot), and the sink rows' floats;
//   CPY       NUQ -> f32 / f16, f32 -> NUQ (same shapes): the K path's ggml_cast before RoPE (patch 0322);
//   GET_ROWS  NUQ -> f32;
//   FLASH_ATTN_EXT with a NUQ V: V dequantized to f16 in ggml-cuda's pool, then upstream's flash attention on it.
// The bytes and the values are the CPU row functions' (backend/kvquant_base.c: from_float, to_float, the block
// decoder of formats/kvquant/kvquant_decode.h): the same comparisons, the quantizer's arithmetic in IEEE round-to-
// nearest intrinsics (ggml-cuda builds with -use_fast_math, which would change divisions) and the decode's product
// rounded before the sum, so a block and a decoded f32 value are bit for bit the CPU's (tests/c/test_kvquant_cuda.cpp);
// f16 output is the f32 value rounded to nearest.
//
// Tables: a cache tensor is bound to its layer's table by ADDRESS in ggml-base (ggml_ext_kvquant_bind*, from
// src/llama; a device cache with its device address). The 2^B values and midpoints travel as kernel parameters; what is
// per binding and larger lives in device memory made when the binding is made (the hooks of backend/kvquant_device.h,
// registered when ggml-cuda loads): the per-channel key scales, the sink marks (slot -> cache row, count first:
// updated before the graph that writes the rows, so a CUDA graph replays with the current marks) and the sink rows'
// floats (written by SET_ROWS, read instead of the blocks; the state's side blob copies them out / in).
// Memory outside every binding uses the uniform levels, as on the CPU.
#include "ggml-ext-cuda.cuh"

#include "ggml-cuda/common.cuh"
#include "ggml-cuda/convert.cuh"
#include "ggml-cuda/fattn.cuh"
#include "ggml-ext-kvquant.h"
#include "kvquant_decode.cuh"
#include "backend/kvquant_device.h"

#include <cuda_fp16.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

namespace {

using kvq::QK;
using kvq::kvq_args;
static_assert(QK == GGML_EXT_KVQUANT_DEV_BLOCK, "kvquant_device.h's block");

using kvq::shape4;

static shape4 shape_of(const ggml_tensor * t) {
    shape4 s;
    for (int i = 0; i < 4; i++) {
        s.ne[i] = t->ne[i];
        s.nb[i] = t->nb[i];
    }
    return s;
}

constexpr int QW_THREADS = 128;  // threads per block of k_quantize: 4 warps, a warp per 64-value block

// ---- the quantizer, a warp per block: kvq::quantize_block's bytes (tests/c/test_kvquant_cuda.cpp holds them to the
// CPU's), its serial scans turned into warp reductions with the same tie rules ----

// the (value, channel) pair that wins under "better" over the warp, the lowest channel among equals; every lane gets it
template <typename Better> __device__ __forceinline__ void warp_arg(float & v, int & c, Better better) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int   c2 = __shfl_xor_sync(0xffffffffu, c, o);
        if (better(v2, v) || (v2 == v && c2 < c)) {
            v = v2, c = c2;
        }
    }
}

__device__ __forceinline__ float warp_min(float x) {
    return -warp_reduce_max(-x);  // ggml-cuda's reductions (common.cuh)
}

// value c (0..63) of the block, held by lane c % 32 as v0 (c < 32) or v1
__device__ __forceinline__ float warp_value(float v0, float v1, int c) {
    const float a = __shfl_sync(0xffffffffu, v0, c & 31), b = __shfl_sync(0xffffffffu, v1, c & 31);
    return c < 32 ? a : b;
}

// kvq::pack_block by the warp: lane l holds indices l (i0) and l + 32 (i1); the trailer's words w by lane 0
__device__ __forceinline__ void warp_pack(const kvq_args & a, int i0, int i1, const uint16_t (&w)[4], uint8_t * blk,
                                          int lane) {
    if (a.bits == 4) {
        blk[lane] = (uint8_t) (i0 | i1 << 4);
    } else {
        const int j0 = __shfl_down_sync(0xffffffffu, i0, 16), j1 = __shfl_down_sync(0xffffffffu, i1, 16);
        if (lane < 16) {  // byte j: indices j, j + 16, j + 32, j + 48
            blk[lane] = (uint8_t) ((i0 & 3) | (j0 & 3) << 2 | (i1 & 3) << 4 | (j1 & 3) << 6);
        }
        if (a.bits == 3) {  // byte 16 + j: bit k is the high bit of index j + 8 k
            const uint64_t hb = (uint64_t) __ballot_sync(0xffffffffu, (i0 >> 2) & 1) |
                                (uint64_t) __ballot_sync(0xffffffffu, (i1 >> 2) & 1) << 32;
            if (lane < 8) {
                uint8_t b = 0;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    b |= (uint8_t) (((hb >> (lane + 8 * k)) & 1) << k);
                }
                blk[16 + lane] = b;
            }
        }
    }
    if (lane == 0) {
        uint16_t * t = (uint16_t *) (blk + a.dense_bytes);
        t[0] = w[0], t[1] = w[1], t[2] = w[2], t[3] = w[3];
    }
}

// kvq::quantize_value_block of the warp's x (x0, x1), the slot's fp16 from s0 / s1 (x's, or a block-scaled key's raw
// key)
__device__ __forceinline__ void warp_quantize_value_block(const kvq_args & a, float x0, float x1, float s0, float s1,
                                                          uint8_t * blk, int lane) {
    if (!__all_sync(0xffffffffu, isfinite(x0) && isfinite(x1))) {
        for (int j = lane; j < a.dense_bytes; j += 32) {
            blk[j] = 0;
        }
        if (lane == 0) {  // a NaN block: zero indices, mid NaN
            uint16_t * t = (uint16_t *) (blk + a.dense_bytes);
            t[0] = 0x7e00, t[1] = 0, t[2] = 0, t[3] = 0;
        }
        return;
    }
    int slot = -1;
    if (a.outliers) {
        // the first channel of the minimum and of the maximum, then the extremes of the rest: drop the larger excess
        float vmin = x0, vmax = x0;
        int   imin = lane, imax = lane;
        if (x1 < vmin) {
            vmin = x1, imin = lane + 32;
        }
        if (x1 > vmax) {
            vmax = x1, imax = lane + 32;
        }
        warp_arg(vmin, imin, [](float p, float q) { return p < q; });
        warp_arg(vmax, imax, [](float p, float q) { return p > q; });
        const float min2 = warp_min(fminf(lane == imin ? INFINITY : x0, lane + 32 == imin ? INFINITY : x1));
        const float max2 = warp_reduce_max(fmaxf(lane == imax ? -INFINITY : x0, lane + 32 == imax ? -INFINITY : x1));
        slot             = KVQ_SUB(vmax, max2) >= KVQ_SUB(min2, vmin) ? imax : imin;
    }
    const float lo   = warp_min(fminf(lane == slot ? INFINITY : x0, lane + 32 == slot ? INFINITY : x1));
    const float hi   = warp_reduce_max(fmaxf(lane == slot ? -INFINITY : x0, lane + 32 == slot ? -INFINITY : x1));
    const float mid  = KVQ_MUL(KVQ_ADD(hi, lo), 0.5f);
    const float half = fmaxf(KVQ_MUL(KVQ_SUB(hi, lo), 0.5f), 1e-8f);
    const int   i0   = kvq::nearest_level(a, KVQ_DIV(KVQ_SUB(x0, mid), half));
    const int   i1   = kvq::nearest_level(a, KVQ_DIV(KVQ_SUB(x1, mid), half));
    const float sv   = slot >= 0 ? warp_value(s0, s1, slot) : 0.0f;
    const uint16_t w[4] = { kvq::f2h(mid), kvq::f2h(half), slot >= 0 ? (uint16_t) (0x8000u | (unsigned) slot) : (uint16_t) 0,
                            slot >= 0 ? kvq::f2h(sv) : (uint16_t) 0 };
    warp_pack(a, i0, i1, w, blk, lane);
}

// kvq::quantize_block of the warp's 64 values (lane l: x0 = value l, x1 = value l + 32) into blk
__device__ __forceinline__ void warp_quantize_block(const kvq_args & a, float x0, float x1, uint8_t * blk, int lane) {
    if (a.row_blocks <= 0) {
        warp_quantize_value_block(a, x0, x1, x0, x1, blk, lane);
        return;
    }
    const int64_t c0 = kvq::key_channel0(a, blk);
    const float   m0 = a.k_mid[c0 + lane], m1 = a.k_mid[c0 + lane + 32];
    const float   h0 = a.k_half[c0 + lane], h1 = a.k_half[c0 + lane + 32];
    if (a.k_block) {  // block-scaled keys: normalised per channel, then a value block whose slot holds the raw key
        warp_quantize_value_block(a, KVQ_DIV(KVQ_SUB(x0, m0), h0), KVQ_DIV(KVQ_SUB(x1, m1), h1), x0, x1, blk, lane);
        return;
    }
    // a pre-RoPE key: per-channel scales, two outlier slots (the largest excesses beyond +-1, the first channel among
    // equals: the serial scan's strict comparisons)
    const bool  f0 = isfinite(x0), f1 = isfinite(x1);
    const float n0 = f0 ? KVQ_DIV(KVQ_SUB(x0, m0), h0) : 0.0f, n1 = f1 ? KVQ_DIV(KVQ_SUB(x1, m1), h1) : 0.0f;
    const int   i0 = f0 ? kvq::nearest_level(a, n0) : 0, i1 = f1 ? kvq::nearest_level(a, n1) : 0;
    const bool  nan = !__all_sync(0xffffffffu, f0 && f1);
    uint16_t    w[4] = { 0x0000, 0x3c00, 0, 0 };
    if (nan) {
        w[0] = 0x7e00;
    } else if (a.outliers) {
        const float e0 = KVQ_SUB(fabsf(n0), 1.0f), e1 = KVQ_SUB(fabsf(n1), 1.0f);
        auto        gt = [](float p, float q) { return p > q; };
        float       ea = e0 > 0.0f ? e0 : -1.0f;  // the largest excess > 0 (-1: none)
        int         ca = lane;
        if (e1 > 0.0f && e1 > ea) {
            ea = e1, ca = lane + 32;
        }
        warp_arg(ea, ca, gt);
        const int out0 = ea > 0.0f ? ca : -1;
        float     eb   = e0 > 0.0f && lane != out0 ? e0 : -1.0f;  // the next, over the other channels
        int       cb   = lane;
        if (e1 > 0.0f && lane + 32 != out0 && e1 > eb) {
            eb = e1, cb = lane + 32;
        }
        warp_arg(eb, cb, gt);
        const int out1 = eb > 0.0f ? cb : -1;
        const int lo_c = out1 >= 0 && out1 < out0 ? out1 : out0, hi_c = out1 >= 0 && out1 < out0 ? out0 : out1;
        const float vlo = lo_c >= 0 ? warp_value(x0, x1, lo_c) : 0.0f, vhi = hi_c >= 0 ? warp_value(x0, x1, hi_c) : 0.0f;
        if (lo_c >= 0) {
            w[0] = (uint16_t) (0x8000u | (unsigned) lo_c), w[1] = kvq::f2h(vlo);
        }
        if (hi_c >= 0) {
            w[2] = (uint16_t) (0x8000u | (unsigned) hi_c), w[3] = kvq::f2h(vhi);
        }
    }
    warp_pack(a, i0, i1, w, blk, lane);
}

// f32 rows of src -> NUQ blocks of dst: SET_ROWS (rows picked by idx) or CPY (the same shape); a warp per block, lane l
// holding values l and l + 32 (warp_quantize_block). A thread per block (kvq::quantize_at, the host-checked reference)
// spent ~40 us of serial work on a decode token's few blocks, two launches a layer; it stays as the scalar twin in
// kvquant_decode.cuh, held to the CPU's bytes on the host.
template <typename idx_t>
__global__ void __launch_bounds__(QW_THREADS) k_quantize(const char * src, shape4 s, char * dst, shape4 d,
                                                         const char * idx, shape4 is, bool by_idx, kvq_args a) {
    const int     lane = threadIdx.x % 32;
    const int64_t nbr  = s.ne[0] / QK, n = nbr * s.ne[1] * s.ne[2] * s.ne[3];
    const int64_t w0 = ((int64_t) blockIdx.x * blockDim.x + threadIdx.x) / 32, nw = (int64_t) gridDim.x * blockDim.x / 32;
    for (int64_t t = w0; t < n; t += nw) {  // kvq::quantize_at's indexing
        const int64_t ib = t % nbr, i1 = t / nbr % s.ne[1], i2 = t / nbr / s.ne[1] % s.ne[2],
                      i3 = t / nbr / s.ne[1] / s.ne[2];
        const float * x  = (const float *) (src + i1 * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3]) + ib * QK;
        int64_t       r1 = i1;
        if (by_idx) {
            r1 = (int64_t) *(const idx_t *) (idx + i1 * is.nb[0] + i2 % is.ne[1] * is.nb[1] + i3 % is.ne[2] * is.nb[2]);
        }
        char *      blk = dst + r1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3] + ib * a.block_bytes;
        const float x0 = x[lane], x1 = x[lane + 32];
        int64_t     off;
        const int   slot = kvq::sink_slot(a, blk, &off);
        if (slot >= 0) {  // a sink row keeps the floats too (the blocks are written as well)
            a.sink_data[slot * a.row_values + off + lane]      = x0;
            a.sink_data[slot * a.row_values + off + lane + 32] = x1;
        }
        warp_quantize_block(a, x0, x1, (uint8_t *) blk, lane);
    }
}

// NUQ -> T of dst's shape: CPY (src of the same shape) or GET_ROWS (src rows picked by idx); one thread per value
template <typename T, typename idx_t>
__global__ void k_dequantize(const char * src, shape4 s, char * dst, shape4 d, const char * idx, shape4 is,
                             bool by_idx, kvq_args a) {
    const int64_t n = d.ne[0] * d.ne[1] * d.ne[2] * d.ne[3];
    for (int64_t t = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (int64_t) gridDim.x * blockDim.x) {
        kvq::dequantize_at<T, idx_t>(t, src, s, dst, d, idx, is, by_idx, a);
    }
}

// ---- the device copies of the bindings (kvquant_device.h's hooks) ----

struct dev_binding {
    int       device;
    float *   k_mid  = nullptr;  // row_blocks * 64 each
    float *   k_half = nullptr;
    int64_t * sink   = nullptr;  // 1 + sink_cap
    float *   sink_data = nullptr;
    int64_t   row_values = 0;
};

std::mutex                                                    dev_lock;
std::map<std::pair<const char *, uint64_t>, dev_binding>      dev_bindings;

static void free_binding(dev_binding & b) {
    ggml_cuda_set_device(b.device);
    cudaFree(b.k_mid);
    cudaFree(b.k_half);
    cudaFree(b.sink);
    cudaFree(b.sink_data);
}

// the device copies of binding d, made now when missing (the caller holds dev_lock); nullptr with a message
// when the memory is not a CUDA device's or CUDA fails
static dev_binding * make_binding(const ggml_ext_kvquant_binding_desc & d, bool quiet) {
    auto it = dev_bindings.find({ d.lo, d.serial });
    if (it != dev_bindings.end()) {
        return &it->second;
    }
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, d.lo) != cudaSuccess ||
        (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
        (void) cudaGetLastError();  // host memory (a CPU cache) or no CUDA device: nothing to mirror
        return nullptr;
    }
    int prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    ggml_cuda_set_device(attr.device);
    dev_binding b;
    b.device     = attr.device;
    b.row_values = d.row_values;
    bool ok      = true;
    if (d.row_blocks > 0) {
        const size_t n = (size_t) d.row_blocks * QK * sizeof(float);
        ok             = ok && cudaMalloc(&b.k_mid, n) == cudaSuccess && cudaMalloc(&b.k_half, n) == cudaSuccess &&
             cudaMemcpy(b.k_mid, d.k_mid, n, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(b.k_half, d.k_half, n, cudaMemcpyHostToDevice) == cudaSuccess;
    }
    if (ok && d.n_sink > 0 && d.sink_cap > 0) {
        const size_t nr = (size_t) (1 + d.sink_cap) * sizeof(int64_t);
        ok = cudaMalloc(&b.sink, nr) == cudaSuccess && cudaMemset(b.sink, 0, nr) == cudaSuccess &&
             cudaMalloc(&b.sink_data, (size_t) d.sink_cap * d.row_values * sizeof(float)) == cudaSuccess;
    }
    if (!ok) {
        (void) cudaGetLastError();
        free_binding(b);
        ggml_cuda_set_device(prev);
        if (!quiet) {
            GGML_LOG_ERROR("ggml-ext: KVQuant cache on CUDA device %d: no memory for the tables of a cache tensor\n",
                           attr.device);
        }
        return nullptr;
    }
    ggml_cuda_set_device(prev);
    return &dev_bindings.emplace(std::make_pair(d.lo, d.serial), b).first->second;
}

static void upload_sinks(dev_binding & b, const int64_t * rows, int hw) {
    int64_t buf[1 + GGML_EXT_KVQUANT_MAX_SINK * 256];
    buf[0] = hw;
    for (int i = 0; i < hw; i++) {
        buf[1 + i] = rows[i];
    }
    int prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    ggml_cuda_set_device(b.device);
    // graphs still in flight on ggml-cuda's streams may read the marks: the change waits for them (it is rare:
    // only when a cell starts or stops holding a sink position)
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(b.sink, buf, (size_t) (1 + hw) * sizeof(int64_t), cudaMemcpyHostToDevice));
    ggml_cuda_set_device(prev);
}

static void hook_bound(const ggml_ext_kvquant_binding_desc * d) {
    std::lock_guard<std::mutex> g(dev_lock);
    make_binding(*d, false);
}

static void hook_unbound(const void * lo, uint64_t serial) {
    std::lock_guard<std::mutex> g(dev_lock);
    auto it = dev_bindings.find({ (const char *) lo, serial });
    if (it != dev_bindings.end()) {
        int prev = 0;
        CUDA_CHECK(cudaGetDevice(&prev));
        free_binding(it->second);
        ggml_cuda_set_device(prev);
        dev_bindings.erase(it);
    }
}

static void hook_sinks_changed(const void * lo, uint64_t serial, const int64_t * rows, int hw) {
    std::lock_guard<std::mutex> g(dev_lock);
    auto it = dev_bindings.find({ (const char *) lo, serial });
    if (it != dev_bindings.end() && it->second.sink) {
        upload_sinks(it->second, rows, hw);
    }
}

static void hook_sink_copy(const void * lo, uint64_t serial, int slot, float * host, bool down) {
    std::lock_guard<std::mutex> g(dev_lock);
    auto it = dev_bindings.find({ (const char *) lo, serial });
    if (it == dev_bindings.end() || !it->second.sink_data) {
        return;  // a host cache: the host floats are the ones
    }
    dev_binding & b    = it->second;
    int           prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    ggml_cuda_set_device(b.device);
    float * dev = b.sink_data + (size_t) slot * b.row_values;
    CUDA_CHECK(cudaDeviceSynchronize());  // the graphs that write or read the rows
    if (down) {
        CUDA_CHECK(cudaMemcpy(host, dev, (size_t) b.row_values * sizeof(float), cudaMemcpyDeviceToHost));
    } else {
        CUDA_CHECK(cudaMemcpy(dev, host, (size_t) b.row_values * sizeof(float), cudaMemcpyHostToDevice));
    }
    ggml_cuda_set_device(prev);
}

static void hook_sink_download(const void * lo, uint64_t serial, int slot, float * dst) {
    hook_sink_copy(lo, serial, slot, dst, true);
}

static void hook_sink_upload(const void * lo, uint64_t serial, int slot, const float * src) {
    hook_sink_copy(lo, serial, slot, const_cast<float *>(src), false);
}

const ggml_ext_kvquant_device_hooks hooks = { hook_bound, hook_unbound, hook_sinks_changed, hook_sink_download,
                                          hook_sink_upload };

struct register_hooks {
    register_hooks() { ggml_ext_kvquant_set_device_hooks(&hooks); }
} register_hooks_at_load;

static bool is_nuq(const ggml_tensor * t) {
    return t && ggml_ext_kvquant_is_cache_type((int) t->type);
}

// the kernel arguments for NUQ memory at p (its binding's, or the uniform levels')
static kvq_args args_for(const void * p, ggml_type type, int device) {
    ggml_ext_kvquant_binding_desc d;
    GGML_ASSERT(ggml_ext_kvquant_binding_find(p, (int) type, &d));
    kvq_args a = {};
    a.bits        = d.bits;
    a.block_bytes = (int) d.block_bytes;
    a.dense_bytes = QK * d.bits / 8;
    memcpy(a.values, d.values, sizeof(a.values));
    memcpy(a.mids, d.mids, sizeof(a.mids));
    if (!d.lo) {
        return a;  // not bound: uniform levels, no keys, no sink (as on the CPU)
    }
    a.lo         = d.lo;
    a.row_blocks = d.row_blocks;
    a.k_block    = d.k_block;
    a.outliers   = d.outliers;
    a.row_values = d.row_values;
    std::lock_guard<std::mutex> g(dev_lock);
    dev_binding *               b = make_binding(d, false);
    if (!b) {
        GGML_ABORT("ggml-ext: a KVQuant cache tensor on CUDA has no device tables (see above)");
    }
    if (b->device != device) {
        GGML_ABORT("ggml-ext: a KVQuant cache tensor of CUDA device %d reached device %d", b->device, device);
    }
    if (d.row_blocks > 0) {
        a.k_mid  = b->k_mid;
        a.k_half = b->k_half;
    }
    if (b->sink) {
        a.sink      = b->sink;
        a.sink_data = b->sink_data;
        a.row_bytes = d.row_values / QK * (int64_t) d.block_bytes;
    }
    return a;
}

static int n_grid(int64_t n, int block) {
    return (int) std::min<int64_t>((n + block - 1) / block, 65535);
}

// a NUQ tensor whose rows are whole blocks, contiguous within a row
static bool rows_of_blocks(const ggml_tensor * t) {
    return t->ne[0] % QK == 0 && t->nb[0] == ggml_type_size(t->type);
}

static bool plain_rows(const ggml_tensor * t, ggml_type type) {
    return t->type == type && t->nb[0] == ggml_type_size(type);
}

// V of a flash attention node as f16 in `buf` (contiguous): the tensor that replaces it
static ggml_tensor f16_twin(const ggml_tensor * v, void * data) {
    ggml_tensor t = *v;
    t.type        = GGML_TYPE_F16;
    t.data        = data;
    t.view_src    = nullptr;
    t.view_offs   = 0;
    t.nb[0]       = sizeof(half);
    for (int i = 1; i < GGML_MAX_DIMS; i++) {
        t.nb[i] = t.nb[i - 1] * t.ne[i - 1];
    }
    return t;
}

template <typename T>
static void launch_dequantize(const ggml_tensor * src, const ggml_tensor * dst_shape, void * dst_data, shape4 d,
                       const ggml_tensor * idx, int device, cudaStream_t stream) {
    const kvq_args a = args_for(src->data, src->type, device);
    const int64_t  n = ggml_nelements(dst_shape);
    if (n == 0) {
        return;
    }
    shape4 is = {};
    if (idx) {
        is = shape_of(idx);
    }
    if (idx && idx->type == GGML_TYPE_I64) {
        k_dequantize<T, int64_t><<<n_grid(n, 256), 256, 0, stream>>>((const char *) src->data, shape_of(src),
                                                                       (char *) dst_data, d, (const char *) idx->data,
                                                                       is, true, a);
    } else {
        k_dequantize<T, int32_t><<<n_grid(n, 256), 256, 0, stream>>>((const char *) src->data, shape_of(src),
                                                                       (char *) dst_data, d,
                                                                       idx ? (const char *) idx->data : nullptr, is,
                                                                       idx != nullptr, a);
    }
}

static void launch_quantize(const ggml_tensor * src, ggml_tensor * dst, const ggml_tensor * idx, int device,
                     cudaStream_t stream) {
    const kvq_args a  = args_for(dst->data, dst->type, device);
    const int64_t  nb = ggml_nelements(src) / QK;
    if (nb == 0) {
        return;
    }
    shape4 is = {};
    if (idx) {
        is = shape_of(idx);
    }
    if (idx && idx->type == GGML_TYPE_I64) {
        k_quantize<int64_t><<<n_grid(nb, QW_THREADS / 32), QW_THREADS, 0, stream>>>((const char *) src->data, shape_of(src),
                                                                (char *) dst->data, shape_of(dst),
                                                                (const char *) idx->data, is, true, a);
    } else {
        k_quantize<int32_t><<<n_grid(nb, QW_THREADS / 32), QW_THREADS, 0, stream>>>((const char *) src->data, shape_of(src),
                                                                (char *) dst->data, shape_of(dst),
                                                                idx ? (const char *) idx->data : nullptr, is,
                                                                idx != nullptr, a);
    }
}

}  // namespace

// the kernel arguments of NUQ memory, for the decode op's kernels (kvquant_attn_cuda.cu)
kvq::kvq_args ggml_ext_cuda_kvquant_args(const void * p, ggml_type type, int device) {
    return args_for(p, type, device);
}

bool ggml_ext_cuda_kvquant_involved(const ggml_tensor * op) {
    if (ggml_ext_kvquant_attn_node_kind(op)) {
        return true;  // the decode op's nodes (kvquant_attn_cuda.cu)
    }
    switch (op->op) {  // views of a NUQ cache: no kernel, upstream says yes
        case GGML_OP_NONE:
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return false;
        default:
            break;
    }
    if (is_nuq(op)) {
        return true;
    }
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        if (is_nuq(op->src[i])) {
            return true;
        }
    }
    return false;
}

// NUQ bytes this device may read or write: not in host memory. A cache kept on the CPU (--no-kv-offload) is bound
// by its host address; a copy the scheduler would upload for the GPU would lie outside every binding (uniform
// levels), so such nodes stay on the CPU, which reads the cache in place.
static bool nuq_off_host(const ggml_tensor * op) {
    for (int i = -1; i < GGML_MAX_SRC; i++) {
        const ggml_tensor * t = i < 0 ? op : op->src[i];
        if (t && is_nuq(t)) {
            const ggml_backend_buffer_t b = t->view_src ? t->view_src->buffer : t->buffer;
            if (b && ggml_backend_buffer_is_host(b)) {
                return false;
            }
        }
    }
    return true;
}

bool ggml_ext_cuda_kvquant_supports(int device, const ggml_tensor * op) {
    const ggml_tensor * s0 = op->src[0], * s1 = op->src[1];
    if (!nuq_off_host(op)) {
        return false;
    }
    switch (op->op) {
        case GGML_OP_CUSTOM:  // the decode op's nodes (kvquant_attn_cuda.cu)
            return ggml_ext_cuda_kvquant_attn_supports(device, op);
        case GGML_OP_SET_ROWS:  // f32 rows into a NUQ cache
            return is_nuq(op) && rows_of_blocks(op) && plain_rows(s0, GGML_TYPE_F32) && s0->ne[0] == op->ne[0] &&
                   (s1->type == GGML_TYPE_I64 || s1->type == GGML_TYPE_I32) && s1->ne[0] == s0->ne[1] &&
                   s0->ne[2] % s1->ne[1] == 0 && s0->ne[3] % s1->ne[2] == 0 && op->ne[2] == s0->ne[2] &&
                   op->ne[3] == s0->ne[3];
        case GGML_OP_CPY:
        case GGML_OP_DUP:
            if (!ggml_are_same_shape(op, s0)) {
                return false;
            }
            if (is_nuq(s0)) {  // NUQ -> f32 / f16 (the K path's cast before RoPE)
                return !is_nuq(op) && rows_of_blocks(s0) && (op->type == GGML_TYPE_F32 || op->type == GGML_TYPE_F16);
            }
            return is_nuq(op) && rows_of_blocks(op) && plain_rows(s0, GGML_TYPE_F32);
        case GGML_OP_GET_ROWS:
            return is_nuq(s0) && !is_nuq(op) && rows_of_blocks(s0) && op->type == GGML_TYPE_F32 &&
                   (s1->type == GGML_TYPE_I32 || s1->type == GGML_TYPE_I64);
        case GGML_OP_FLASH_ATTN_EXT:
            {
                // a NUQ V (not K: the K path dequantizes and ropes before): upstream's kernels on V as f16
                const ggml_tensor * v = op->src[2];
                if (is_nuq(op->src[0]) || is_nuq(op->src[1]) || !is_nuq(v) || !rows_of_blocks(v) ||
                    (op->src[3] && is_nuq(op->src[3])) || (op->src[4] && is_nuq(op->src[4]))) {
                    return false;
                }
                // K: f16 as it is, any other type through upstream's converter to an f16 twin (the node's allocation
                // was sized for the NUQ node, which has no room for upstream's own f16 copies)
                const ggml_tensor * k = op->src[1];
                if (k->type != GGML_TYPE_F16 &&
                    (k->nb[0] != ggml_type_size(k->type) || ggml_get_to_fp16_nc_cuda(k->type) == nullptr)) {
                    return false;
                }
                ggml_tensor vf   = f16_twin(v, nullptr);
                ggml_tensor kf   = f16_twin(k, nullptr);
                ggml_tensor node = *op;
                node.src[1]      = &kf;
                node.src[2]      = &vf;
                return ggml_cuda_flash_attn_ext_supported(device, &node);
            }
        default:
            return false;
    }
}

bool ggml_ext_cuda_kvquant_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    if (!ggml_ext_cuda_kvquant_involved(dst)) {
        return false;
    }
    cudaStream_t        stream = ctx.stream();
    const ggml_tensor * s0     = dst->src[0];
    switch (dst->op) {
        case GGML_OP_CUSTOM:
            ggml_ext_cuda_kvquant_attn_forward(ctx, dst);
            break;
        case GGML_OP_SET_ROWS:
            launch_quantize(s0, dst, dst->src[1], ctx.device, stream);
            break;
        case GGML_OP_CPY:
        case GGML_OP_DUP:
            {
                ggml_tensor * out = dst->op == GGML_OP_CPY ? dst->src[1] : dst;
                if (is_nuq(s0)) {
                    if (out->type == GGML_TYPE_F32) {
                        launch_dequantize<float>(s0, out, out->data, shape_of(out), nullptr, ctx.device, stream);
                    } else {
                        launch_dequantize<half>(s0, out, out->data, shape_of(out), nullptr, ctx.device, stream);
                    }
                } else {
                    launch_quantize(s0, out, nullptr, ctx.device, stream);
                }
            }
            break;
        case GGML_OP_GET_ROWS:
            launch_dequantize<float>(s0, dst, dst->data, shape_of(dst), dst->src[1], ctx.device, stream);
            break;
        case GGML_OP_FLASH_ATTN_EXT:
            {
                const ggml_tensor *         v = dst->src[2];
                ggml_cuda_pool_alloc<half> vf(ctx.pool(), ggml_nelements(v));
                ggml_tensor                 twin = f16_twin(v, vf.get());
                launch_dequantize<half>(v, &twin, vf.get(), shape_of(&twin), nullptr, ctx.device, stream);
                ggml_tensor node = *dst;
                node.src[2]      = &twin;
                const ggml_tensor *         k = dst->src[1];
                ggml_cuda_pool_alloc<half> kf(ctx.pool());
                ggml_tensor                 ktwin;
                if (k->type != GGML_TYPE_F16) {
                    kf.alloc(ggml_nelements(k));
                    ktwin            = f16_twin(k, kf.get());
                    const size_t ts  = ggml_type_size(k->type);
                    ggml_get_to_fp16_nc_cuda(k->type)(k->data, kf.get(), k->ne[0], k->ne[1], k->ne[2], k->ne[3],
                                                      k->nb[1] / ts, k->nb[2] / ts, k->nb[3] / ts, stream);
                    node.src[1] = &ktwin;
                }
                ggml_cuda_flash_attn_ext(ctx, &node);
            }
            break;
        default:
            GGML_ABORT("ggml-ext: %s with a KVQuant cache type reached CUDA (supports_op refuses it)", ggml_op_desc(dst));
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}
