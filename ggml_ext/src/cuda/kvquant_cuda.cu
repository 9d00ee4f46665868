// The KVQuant cache types NUQ4 / NUQ3 / NUQ2 (docs/KVQUANT.md "The CUDA path", docs/formats/kvquant.md) with the
// cache in VRAM: what llama.cpp's graph sends to ggml-cuda for them, called through patch 0421:
//   SET_ROWS  f32 -> NUQ   append and quantize (one thread per 64-value block; values with the block's own
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

// f32 rows of src -> NUQ blocks of dst: SET_ROWS (rows picked by idx) or CPY (the same shape); one thread per block
template <typename idx_t>
__global__ void k_quantize(const char * src, shape4 s, char * dst, shape4 d, const char * idx, shape4 is, bool by_idx,
                           kvq_args a) {
    const int64_t n = s.ne[0] / QK * s.ne[1] * s.ne[2] * s.ne[3];
    for (int64_t t = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (int64_t) gridDim.x * blockDim.x) {
        kvq::quantize_at<idx_t>(t, src, s, dst, d, idx, is, by_idx, a);
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
