// The KVQuant cache types NUQ4 / NUQ3 / NUQ2 (docs/KVQUANT.md "The CUDA path", docs/formats/kvquant.md) with the
// cache in VRAM: what llama.cpp's graph sends to ggml-cuda for them, called through patch 0421:
//   SET_ROWS  f32 -> NUQ   append and quantize (one thread per 64-value block; values with the block's own
//                          mid / half and, with --kv-outliers, one outlier slot; pre-RoPE keys per channel with
//                          two slots), and the sink rows' floats;
//   CPY       NUQ -> f32 / f16, f32 -> NUQ (same shapes): the K path's ggml_cast before RoPE (patch 0307);
//   GET_ROWS  NUQ -> f32;
//   FLASH_ATTN_EXT with a NUQ V: V dequantized to f16 in ggml-cuda's pool, then upstream's flash attention on it.
// The bytes and the values are the CPU row functions' (ggml/kvquant_base.c: from_float, to_float, the block
// decoder of formats/kvquant/nuq_decode.h): the same comparisons, the quantizer's arithmetic in IEEE round-to-
// nearest intrinsics (ggml-cuda builds with -use_fast_math, which would change divisions) and the decode's product
// rounded before the sum, so a block and a decoded f32 value are bit for bit the CPU's (tests/c/test_kvquant_cuda.cpp);
// f16 output is the f32 value rounded to nearest.
//
// Tables: a cache tensor is bound to its layer's table by ADDRESS in ggml-base (ggml_ext_kvq_bind*, the llama
// glue; a device cache with its device address). The 2^B values and midpoints travel as kernel parameters; what is
// per binding and larger lives in device memory made when the binding is made (the hooks of ggml/kvquant_device.h,
// registered when ggml-cuda loads): the per-channel key scales, the sink marks (slot -> cache row, count first:
// updated before the graph that writes the rows, so a CUDA graph replays with the current marks) and the sink rows'
// floats (written by SET_ROWS, read instead of the blocks; the state's side blob copies them out / in).
// Memory outside every binding uses the uniform levels, as on the CPU.
#include "ggml-ext-cuda.cuh"

#include "ggml-cuda/common.cuh"
#include "ggml-cuda/fattn.cuh"
#include "ggml-ext-kvq.h"
#include "ggml/kvquant_device.h"

#include <cuda_fp16.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

namespace {

constexpr int QK = GGML_EXT_KVQ_DEV_BLOCK;  // 64 values per block

// what a kernel needs of one binding (by value: kernel parameters)
struct kvq_args {
    int           bits;
    int           block_bytes;
    int           dense_bytes;
    float         values[16];
    float         mids[15];
    const char *  lo;          // the binding's first byte (NULL: not bound, uniform levels)
    int64_t       row_blocks;  // > 0: keys, per-channel scales below
    const float * k_mid;
    const float * k_half;
    int           outliers;
    int64_t       row_bytes;   // bytes per cache row (sink rows; 0: no sink)
    int64_t       row_values;
    const int64_t * sink;      // [0]: slots in use (hw), [1 + s]: the cache row of slot s (-1: free); NULL: no sink
    float *       sink_data;   // slot s: row_values floats
};

__device__ __forceinline__ bool is_tag(unsigned w) {
    return (w & 0xffc0u) == 0x8000u;
}

__device__ __forceinline__ int get_index(const uint8_t * blk, int bits, int s) {
    if (bits == 4) {
        return (blk[s % 32] >> (4 * (s / 32))) & 15;
    }
    int q = (blk[s % 16] >> (2 * (s / 16))) & 3;
    if (bits == 3) {
        q |= ((blk[16 + s % 8] >> (s / 8)) & 1) << 2;
    }
    return q;
}

__device__ __forceinline__ int nearest_level(const kvq_args & a, float xn) {
    const int n = 1 << a.bits;
    int       q = 0;  // past the midpoints below xn; a tie goes to the lower level (NaN: 0)
    while (q < n - 1 && a.mids[q] < xn) {
        q++;
    }
    return q;
}

// the sink slot of the cache row holding blk (-1: none)
__device__ __forceinline__ int sink_slot(const kvq_args & a, const char * blk, int64_t * off) {
    if (!a.sink) {
        return -1;
    }
    const int64_t o   = blk - a.lo;
    const int64_t row = o / a.row_bytes;
    const int64_t hw  = a.sink[0];
    for (int64_t s = 0; s < hw; s++) {
        if (a.sink[1 + s] == row) {
            *off = (o % a.row_bytes) / a.block_bytes * QK;
            return (int) s;
        }
    }
    return -1;
}

__device__ __forceinline__ uint16_t f2h(float x) {
    return __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ float h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}
template <> __device__ __forceinline__ half from_f32<half>(float x) {
    return __float2half_rn(x);
}

// one block of 64 values x into blk: ggml/kvquant_base.c's from_float for one block, bit for bit
__device__ void quantize_block(const kvq_args & a, const float * x, uint8_t * blk) {
    uint8_t  idx[QK];
    uint16_t w[4];
    if (a.row_blocks > 0) {
        // a pre-RoPE key: per-channel scales, two outlier slots (the largest excesses beyond +-1)
        const int64_t c0 = ((blk - (const uint8_t *) a.lo) / a.block_bytes) % a.row_blocks * QK;
        int           out[2] = { -1, -1 };
        float         ex[2]  = { 0.0f, 0.0f };
        bool          nan    = false;
        for (int c = 0; c < QK; c++) {
            const float v = x[c];
            idx[c]        = 0;
            if (!isfinite(v)) {
                nan = true;
                continue;
            }
            const float xn = __fdiv_rn(__fsub_rn(v, a.k_mid[c0 + c]), a.k_half[c0 + c]);
            idx[c]         = (uint8_t) nearest_level(a, xn);
            const float e  = __fsub_rn(fabsf(xn), 1.0f);
            if (a.outliers && e > 0.0f) {
                if (e > ex[0]) {
                    out[1] = out[0], ex[1] = ex[0];
                    out[0] = c, ex[0] = e;
                } else if (e > ex[1]) {
                    out[1] = c, ex[1] = e;
                }
            }
        }
        w[0] = 0x0000, w[1] = 0x3c00, w[2] = 0, w[3] = 0;
        if (nan) {
            w[0] = 0x7e00;
        } else {
            const int first = out[1] >= 0 && out[1] < out[0] ? 1 : 0;
            for (int s = 0, j = first; s < 2; s++, j = 1 - j) {
                if (out[j] >= 0) {
                    w[2 * s]     = (uint16_t) (0x8000u | (unsigned) out[j]);
                    w[2 * s + 1] = f2h(x[out[j]]);
                }
            }
            if (out[0] < 0 && out[1] < 0) {
                w[0] = 0x0000, w[1] = 0x3c00;
            }
        }
    } else {
        // a value block: its own mid / half from the min / max (with outliers: of the 63 left after the slot)
        bool finite = true;
        int  imin = 0, imax = 0;
        for (int c = 0; c < QK; c++) {
            finite = finite && isfinite(x[c]);
            imin   = x[c] < x[imin] ? c : imin;
            imax   = x[c] > x[imax] ? c : imax;
        }
        if (!finite) {
            // a NaN or infinity: a NaN block (zero indices, mid NaN), as the CPU writes it
            for (int j = 0; j < a.dense_bytes; j++) {
                blk[j] = 0;
            }
            const uint16_t nanw[4] = { 0x7e00, 0, 0, 0 };
            memcpy(blk + a.dense_bytes, nanw, sizeof(nanw));
            return;
        }
        int slot = -1;
        if (a.outliers) {
            float min2 = INFINITY, max2 = -INFINITY;
            for (int c = 0; c < QK; c++) {
                if (c != imin) {
                    min2 = fminf(min2, x[c]);
                }
                if (c != imax) {
                    max2 = fmaxf(max2, x[c]);
                }
            }
            const bool drop_max = __fsub_rn(x[imax], max2) >= __fsub_rn(min2, x[imin]);
            slot                = drop_max ? imax : imin;
        }
        float lo = INFINITY, hi = -INFINITY;
        for (int c = 0; c < QK; c++) {
            if (c != slot) {
                lo = fminf(lo, x[c]);
                hi = fmaxf(hi, x[c]);
            }
        }
        const float mid  = __fmul_rn(__fadd_rn(hi, lo), 0.5f);
        const float half = fmaxf(__fmul_rn(__fsub_rn(hi, lo), 0.5f), 1e-8f);
        for (int c = 0; c < QK; c++) {
            idx[c] = (uint8_t) nearest_level(a, __fdiv_rn(__fsub_rn(x[c], mid), half));
        }
        w[0] = f2h(mid), w[1] = f2h(half);
        w[2] = slot >= 0 ? (uint16_t) (0x8000u | (unsigned) slot) : 0;
        w[3] = slot >= 0 ? f2h(x[slot]) : 0;
    }
    // the 64 indices in the slot order of formats/kvquant/kvquant.h (head_dim 64)
    if (a.bits == 4) {
        for (int j = 0; j < 32; j++) {
            blk[j] = (uint8_t) (idx[j] | idx[j + 32] << 4);
        }
    } else {
        for (int j = 0; j < 16; j++) {
            blk[j] = (uint8_t) ((idx[j] & 3) | (idx[j + 16] & 3) << 2 | (idx[j + 32] & 3) << 4 | (idx[j + 48] & 3) << 6);
        }
        if (a.bits == 3) {
            for (int j = 0; j < 8; j++) {
                uint8_t b = 0;
                for (int k = 0; k < 8; k++) {
                    b |= (uint8_t) (((idx[j + 8 * k] >> 2) & 1) << k);
                }
                blk[16 + j] = b;
            }
        }
    }
    memcpy(blk + a.dense_bytes, w, sizeof(w));
}

// value c of the block at blk: ggml/kvquant_base.c's to_float, bit for bit
__device__ __forceinline__ float dequantize_value(const kvq_args & a, const char * blk, int c) {
    int64_t   off;
    const int s = sink_slot(a, blk, &off);
    if (s >= 0) {
        return a.sink_data[s * a.row_values + off + c];
    }
    const uint8_t * b = (const uint8_t *) blk;
    uint16_t        w[4];
    memcpy(w, b + a.dense_bytes, sizeof(w));
    const float t = a.values[get_index(b, a.bits, c)];
    if (a.row_blocks > 0) {
        const int64_t ch = (blk - a.lo) / a.block_bytes % a.row_blocks * QK + c;
        float         y  = __fadd_rn(__fmul_rn(t, a.k_half[ch]), a.k_mid[ch]);
        if (is_tag(w[2]) && (w[2] & 63) == c) {
            y = h2f(w[3]);
        } else if (is_tag(w[0]) && (w[0] & 63) == c) {
            y = h2f(w[1]);
        }
        return y;
    }
    if (is_tag(w[2]) && (w[2] & 63) == c) {
        return h2f(w[3]);
    }
    return __fadd_rn(__fmul_rn(t, h2f(w[1])), h2f(w[0]));
}

struct shape4 {
    int64_t ne[4];
    size_t  nb[4];
};

static shape4 shape_of(const ggml_tensor * t) {
    shape4 s;
    for (int i = 0; i < 4; i++) {
        s.ne[i] = t->ne[i];
        s.nb[i] = t->nb[i];
    }
    return s;
}

// f32 rows of src -> NUQ blocks of dst: SET_ROWS (rows picked by idx) or CPY (the same shape)
template <typename idx_t>
__global__ void k_quantize(const char * src, shape4 s, char * dst, shape4 d, const char * idx, shape4 is, bool by_idx,
                           kvq_args a) {
    const int64_t nbr = s.ne[0] / QK;
    const int64_t n   = nbr * s.ne[1] * s.ne[2] * s.ne[3];
    for (int64_t t = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (int64_t) gridDim.x * blockDim.x) {
        const int64_t ib = t % nbr, i1 = t / nbr % s.ne[1], i2 = t / nbr / s.ne[1] % s.ne[2],
                      i3 = t / nbr / s.ne[1] / s.ne[2];
        const float * x  = (const float *) (src + i1 * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3]) + ib * QK;
        int64_t       r1 = i1;
        if (by_idx) {
            r1 = (int64_t) *(const idx_t *) (idx + i1 * is.nb[0] + i2 % is.ne[1] * is.nb[1] + i3 % is.ne[2] * is.nb[2]);
        }
        char * blk = dst + r1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3] + ib * a.block_bytes;
        float  xv[QK];
        for (int c = 0; c < QK; c++) {
            xv[c] = x[c];
        }
        int64_t   off;
        const int slot = sink_slot(a, blk, &off);
        if (slot >= 0) {  // a sink row keeps the floats too (the blocks are written as well)
            for (int c = 0; c < QK; c++) {
                a.sink_data[slot * a.row_values + off + c] = xv[c];
            }
        }
        quantize_block(a, xv, (uint8_t *) blk);
    }
}

// NUQ -> T of dst's shape: CPY (src of the same shape) or GET_ROWS (src rows picked by idx)
template <typename T, typename idx_t>
__global__ void k_dequantize(const char * src, shape4 s, char * dst, shape4 d, const char * idx, shape4 is,
                             bool by_idx, kvq_args a) {
    const int64_t n = d.ne[0] * d.ne[1] * d.ne[2] * d.ne[3];
    for (int64_t t = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (int64_t) gridDim.x * blockDim.x) {
        const int64_t i0 = t % d.ne[0], i1 = t / d.ne[0] % d.ne[1], i2 = t / d.ne[0] / d.ne[1] % d.ne[2],
                      i3 = t / d.ne[0] / d.ne[1] / d.ne[2];
        const char *  row;
        if (by_idx) {  // GET_ROWS: dst (i0, i1, i2, i3) = src0 (i0, idx[i1, i2, i3], i2, i3)
            const int64_t r = (int64_t) *(const idx_t *) (idx + i1 * is.nb[0] + i2 * is.nb[1] + i3 * is.nb[2]);
            row             = src + r * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3];
        } else {
            row = src + i1 * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3];
        }
        const float y = dequantize_value(a, row + i0 / QK * a.block_bytes, (int) (i0 % QK));
        *(T *) (dst + i0 * d.nb[0] + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) = from_f32<T>(y);
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

void free_binding(dev_binding & b) {
    ggml_cuda_set_device(b.device);
    cudaFree(b.k_mid);
    cudaFree(b.k_half);
    cudaFree(b.sink);
    cudaFree(b.sink_data);
}

// the device copies of binding d, made now when missing (the caller holds dev_lock); nullptr with a message
// when the memory is not a CUDA device's or CUDA fails
dev_binding * make_binding(const ggml_ext_kvq_binding_desc & d, bool quiet) {
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

void upload_sinks(dev_binding & b, const int64_t * rows, int hw) {
    int64_t buf[1 + GGML_EXT_KVQ_MAX_SINK * 256];
    buf[0] = hw;
    for (int i = 0; i < hw; i++) {
        buf[1 + i] = rows[i];
    }
    int prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    ggml_cuda_set_device(b.device);
    CUDA_CHECK(cudaMemcpy(b.sink, buf, (size_t) (1 + hw) * sizeof(int64_t), cudaMemcpyHostToDevice));
    ggml_cuda_set_device(prev);
}

void hook_bound(const ggml_ext_kvq_binding_desc * d) {
    std::lock_guard<std::mutex> g(dev_lock);
    make_binding(*d, false);
}

void hook_unbound(const void * lo, uint64_t serial) {
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

void hook_sinks_changed(const void * lo, uint64_t serial, const int64_t * rows, int hw) {
    std::lock_guard<std::mutex> g(dev_lock);
    auto it = dev_bindings.find({ (const char *) lo, serial });
    if (it != dev_bindings.end() && it->second.sink) {
        upload_sinks(it->second, rows, hw);
    }
}

void hook_sink_copy(const void * lo, uint64_t serial, int slot, float * host, bool down) {
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
    if (down) {
        CUDA_CHECK(cudaDeviceSynchronize());  // the graphs that wrote the rows
        CUDA_CHECK(cudaMemcpy(host, dev, (size_t) b.row_values * sizeof(float), cudaMemcpyDeviceToHost));
    } else {
        CUDA_CHECK(cudaMemcpy(dev, host, (size_t) b.row_values * sizeof(float), cudaMemcpyHostToDevice));
    }
    ggml_cuda_set_device(prev);
}

void hook_sink_download(const void * lo, uint64_t serial, int slot, float * dst) {
    hook_sink_copy(lo, serial, slot, dst, true);
}

void hook_sink_upload(const void * lo, uint64_t serial, int slot, const float * src) {
    hook_sink_copy(lo, serial, slot, const_cast<float *>(src), false);
}

const ggml_ext_kvq_device_hooks hooks = { hook_bound, hook_unbound, hook_sinks_changed, hook_sink_download,
                                          hook_sink_upload };

struct register_hooks {
    register_hooks() { ggml_ext_kvq_set_device_hooks(&hooks); }
} register_hooks_at_load;

bool is_nuq(const ggml_tensor * t) {
    return t && ggml_ext_kvq_is_cache_type((int) t->type);
}

// the kernel arguments for NUQ memory at p (its binding's, or the uniform levels')
kvq_args args_for(const void * p, ggml_type type, int device) {
    ggml_ext_kvq_binding_desc d;
    GGML_ASSERT(ggml_ext_kvq_binding_find(p, (int) type, &d));
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

int n_grid(int64_t n, int block) {
    return (int) std::min<int64_t>((n + block - 1) / block, 65535);
}

// a NUQ tensor whose rows are whole blocks, contiguous within a row
bool rows_of_blocks(const ggml_tensor * t) {
    return t->ne[0] % QK == 0 && t->nb[0] == ggml_type_size(t->type);
}

bool plain_rows(const ggml_tensor * t, ggml_type type) {
    return t->type == type && t->nb[0] == ggml_type_size(type);
}

// V of a flash attention node as f16 in `buf` (contiguous): the tensor that replaces it
ggml_tensor f16_twin(const ggml_tensor * v, void * data) {
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
void launch_dequantize(const ggml_tensor * src, const ggml_tensor * dst_shape, void * dst_data, shape4 d,
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

void launch_quantize(const ggml_tensor * src, ggml_tensor * dst, const ggml_tensor * idx, int device,
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
        k_quantize<int64_t><<<n_grid(nb, 64), 64, 0, stream>>>((const char *) src->data, shape_of(src),
                                                                (char *) dst->data, shape_of(dst),
                                                                (const char *) idx->data, is, true, a);
    } else {
        k_quantize<int32_t><<<n_grid(nb, 64), 64, 0, stream>>>((const char *) src->data, shape_of(src),
                                                                (char *) dst->data, shape_of(dst),
                                                                idx ? (const char *) idx->data : nullptr, is,
                                                                idx != nullptr, a);
    }
}

}  // namespace

bool ggml_ext_cuda_kvq_involved(const ggml_tensor * op) {
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

bool ggml_ext_cuda_kvq_supports(int device, const ggml_tensor * op) {
    const ggml_tensor * s0 = op->src[0], * s1 = op->src[1];
    switch (op->op) {
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
                ggml_tensor vf   = f16_twin(v, nullptr);
                ggml_tensor node = *op;
                node.src[2]      = &vf;
                return ggml_cuda_flash_attn_ext_supported(device, &node);
            }
        default:
            return false;
    }
}

bool ggml_ext_cuda_kvq_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    if (!ggml_ext_cuda_kvq_involved(dst)) {
        return false;
    }
    cudaStream_t        stream = ctx.stream();
    const ggml_tensor * s0     = dst->src[0];
    switch (dst->op) {
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
                ggml_cuda_flash_attn_ext(ctx, &node);
            }
            break;
        default:
            GGML_ABORT("ggml-ext: %s with a KVQuant cache type reached CUDA (supports_op refuses it)", ggml_op_desc(dst));
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}
