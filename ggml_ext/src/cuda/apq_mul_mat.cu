// GGML_OP_APQ_MUL_MAT on CUDA: dst = W_b . x for an any-precision weight (docs/formats/anyprec.md), with
// the kernels of anyprec_cuda.cu, checked against the CPU backend (src/ops/apq_mul_mat_cpu.c) by
// tests/c/test_ext_ops.cpp.
//
// Where the weight's bytes live. The kernels (the GEMVs and the dequantizer) read the "row-lane" layout of
// anyprec_cuda.h, not the file's plane-major rows: lane l of a warp owns row 32 g + l, so a warp's load of
// one plane is 512 contiguous bytes and its table lookups never conflict. So an APQ weight in a CUDA buffer
// holds the row-lane layout, made when it is written (patch 0400 sends the buffer's set/get here through
// device_layout.cu) and turned back on reads: callers, the RPC server and the scheduler's
// copies see the file's bytes. The relayout is a permutation of 32-bit words (each file word of plane p,
// row r, word c is one row-lane word, its bits permuted), so any piece of an upload (llama.cpp's loader
// sends 1 MiB pieces without mmap) converts by itself: a piece goes to a scratch buffer and one kernel
// scatters it; a piece that starts or ends inside a word first reads the word back.
//
// Padding. The row-lane layout needs whole groups of 32 rows and rows of a multiple of 128 weights
// (SmolLM2's 576 is not): the weight is held as ceil(N / 32) * 32 rows of Kp = ceil(K / 128) * 128 weights
// (patch 0420 asks ggml_ext_cuda_anyprec_alloc_size for the room), the padding's codes zero (written with the
// last row / last word they pad), and the forward pads x with zeros to Kp, so padded weights add nothing.
//
// Dispatch (as the kernels' measurements in docs/RESULTS.md chose): 1 token the persistent GEMV, 2..8
// tokens the split-K GEMV (atomics: its last bits vary from run to run; both ggml_ext_anyprec_gemv_rl_cuda),
// more tokens the weight dequantized to fp16 at precision b and multiplied by cuBLAS (cublasGemmEx through ggml-cuda's handle, fp32 accumulation), the
// activations rounded to fp16 as ggml-cuda's own cuBLAS path does for quantized weights.
#include "ggml-cuda/common.cuh"

#include "anyprec_cuda.h"
#include "ggml-cuda.h"
#include "ggml-ext-cuda.cuh"
#include "ggml-ext-ops.h"

#include <cstring>
#include <vector>

namespace {

constexpr int64_t GEMV_MAX_TOKENS = 8;

// the row-lane geometry of a weight [K, N] held padded: words are 32 weights of one plane
struct rl_shape {
    int64_t N, Kw, Kpw, G;  // rows, file words per row, padded words per row (multiple of 4), row groups
    int     P;              // planes

    explicit rl_shape(const ggml_tensor * t) :
        N(t->ne[1]),
        Kw(t->ne[0] / 32),
        Kpw((t->ne[0] + 127) / 128 * 4),
        G((t->ne[1] + 31) / 32),
        P(ggml_ext_anyprec_parent_bits((int) t->type)) {}

    int64_t padded_k() const { return Kpw * 32; }

    size_t bytes() const { return (size_t) P * ggml_ext_anyprec_rl_plane_size(N, padded_k()); }
};

// row-lane word of plane p, row r, word c (anyprec_cuda.h: plane, group, super-chunk, lane, word)
__device__ __forceinline__ int64_t rl_index(int64_t p, int64_t r, int64_t c, int64_t G, int64_t Kpw) {
    const int64_t Q = Kpw / 4;
    return ((p * G + r / 32) * Q + c / 4) * 128 + (r % 32) * 4 + (c % 4);
}

// file word (bit u = weight u of its 32) -> row-lane word (bit 8 i + m = weight 4 m + i), and back
__device__ __forceinline__ uint32_t to_lanes(uint32_t in) {
    uint32_t v = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int m = 0; m < 8; m++) {
            v |= ((in >> (4 * m + i)) & 1u) << (8 * i + m);
        }
    }
    return v;
}

__device__ __forceinline__ uint32_t from_lanes(uint32_t v) {
    uint32_t in = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int m = 0; m < 8; m++) {
            in |= ((v >> (8 * i + m)) & 1u) << (4 * m + i);
        }
    }
    return in;
}

// file words w0 .. w0 + n - 1 (src) into the row-lane layout; the thread writing a row's last word also
// zeroes that row's padded words, the one writing the last row's word the padded rows below it
__global__ void k_apq_scatter(const uint32_t * __restrict__ src, int64_t w0, int64_t n, int64_t N, int64_t Kw,
                              int64_t Kpw, int64_t G, uint32_t * __restrict__ rl) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t o = w0 + i;
        const int64_t p = o / (N * Kw), r = (o / Kw) % N, c = o % Kw;
        rl[rl_index(p, r, c, G, Kpw)] = to_lanes(src[i]);
        const int64_t r_end = r == N - 1 ? 32 * G : r + 1;
        const int64_t c_end = c == Kw - 1 ? Kpw : c + 1;
        for (int64_t rr = r; rr < r_end; rr++) {
            for (int64_t cc = rr == r ? c + 1 : c; cc < c_end; cc++) {
                rl[rl_index(p, rr, cc, G, Kpw)] = 0;
            }
        }
    }
}

__global__ void k_apq_gather(const uint32_t * __restrict__ rl, int64_t w0, int64_t n, int64_t N, int64_t Kw,
                             int64_t Kpw, int64_t G, uint32_t * __restrict__ dst) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t o = w0 + i;
        const int64_t p = o / (N * Kw), r = (o / Kw) % N, c = o % Kw;
        dst[i]          = from_lanes(rl[rl_index(p, r, c, G, Kpw)]);
    }
}

// x [K, ne1, ne2, ne3] (rows at byte strides nb1..nb3) -> xp [T][Kp], zeros past K
__global__ void k_apq_pad_x(const char * __restrict__ x, int64_t K, int64_t Kp, int64_t ne1, int64_t ne2,
                            size_t nb1, size_t nb2, size_t nb3, int64_t T, float * __restrict__ xp) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < T * Kp; i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t t = i / Kp, j = i % Kp;
        const int64_t i1 = t % ne1, i2 = (t / ne1) % ne2, i3 = t / (ne1 * ne2);
        xp[i] = j < K ? *(const float *) (x + i1 * nb1 + i2 * nb2 + i3 * nb3 + j * sizeof(float)) : 0.0f;
    }
}

static unsigned grid_for(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned) (b < 1 ? 1 : b > 65535 ? 65535 : b);
}

// file words [w0, w0 + n) of t <-> host words, through a scratch buffer on cudaStreamPerThread
static void set_words(ggml_tensor * t, const uint32_t * host, int64_t w0, int64_t n) {
    const rl_shape s(t);
    void *         d = nullptr;
    CUDA_CHECK(cudaMallocAsync(&d, (size_t) n * 4, cudaStreamPerThread));
    CUDA_CHECK(cudaMemcpyAsync(d, host, (size_t) n * 4, cudaMemcpyHostToDevice, cudaStreamPerThread));
    k_apq_scatter<<<grid_for(n), 256, 0, cudaStreamPerThread>>>((const uint32_t *) d, w0, n, s.N, s.Kw, s.Kpw, s.G,
                                                                (uint32_t *) t->data);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(d, cudaStreamPerThread));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
}

static void get_words(const ggml_tensor * t, uint32_t * host, int64_t w0, int64_t n) {
    const rl_shape s(t);
    void *         d = nullptr;
    CUDA_CHECK(cudaMallocAsync(&d, (size_t) n * 4, cudaStreamPerThread));
    k_apq_gather<<<grid_for(n), 256, 0, cudaStreamPerThread>>>((const uint32_t *) t->data, w0, n, s.N, s.Kw, s.Kpw,
                                                               s.G, (uint32_t *) d);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(host, d, (size_t) n * 4, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    CUDA_CHECK(cudaFreeAsync(d, cudaStreamPerThread));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
}

// the weight's buffer is this device's plain CUDA buffer (not a split buffer, not host memory), or none yet
static bool on_device(const ggml_tensor * t, int device) {
    return t->buffer == nullptr || ggml_backend_buffer_get_type(t->buffer) == ggml_backend_cuda_buffer_type(device);
}

}  // namespace

bool ggml_ext_cuda_anyprec_layout(const ggml_tensor * t) {
    return t != nullptr && ggml_ext_anyprec_parent_bits((int) t->type) > 0 && t->view_src == nullptr && t->ne[2] == 1 &&
           t->ne[3] == 1 && t->ne[0] % 32 == 0 && ggml_is_contiguous(t);
}

size_t ggml_ext_cuda_anyprec_alloc_size(const ggml_tensor * t) {
    return rl_shape(t).bytes();
}

void ggml_ext_cuda_anyprec_set(ggml_tensor * t, const void * data, size_t offset, size_t size) {
    if (size == 0) {
        return;
    }
    GGML_ASSERT(ggml_ext_cuda_anyprec_layout(t) && offset + size <= ggml_nbytes(t));
    const size_t lo = offset / 4 * 4, hi = (offset + size + 3) / 4 * 4;
    std::vector<uint32_t> words((hi - lo) / 4);
    if (lo != offset) {  // the first word's bytes before the write, as they are now
        get_words(t, words.data(), (int64_t) (lo / 4), 1);
    }
    if (hi != offset + size && (hi - lo > 4 || lo == offset)) {  // the last word's bytes after it
        get_words(t, words.data() + words.size() - 1, (int64_t) (hi / 4 - 1), 1);
    }
    std::memcpy((char *) words.data() + (offset - lo), data, size);
    set_words(t, words.data(), (int64_t) (lo / 4), (int64_t) words.size());
}

void ggml_ext_cuda_anyprec_get(const ggml_tensor * t, void * data, size_t offset, size_t size) {
    if (size == 0) {
        return;
    }
    GGML_ASSERT(ggml_ext_cuda_anyprec_layout(t) && offset + size <= ggml_nbytes(t));
    const size_t          lo = offset / 4 * 4, hi = (offset + size + 3) / 4 * 4;
    std::vector<uint32_t> words((hi - lo) / 4);
    get_words(t, words.data(), (int64_t) (lo / 4), (int64_t) words.size());
    std::memcpy(data, (const char *) words.data() + (offset - lo), size);
}

bool ggml_ext_cuda_anyprec_supports_mul_mat(int device, const ggml_tensor * op) {
    const ggml_tensor * w = op->src[0];
    return op->op == GGML_OP_MUL_MAT && ggml_ext_cuda_anyprec_layout(w) && on_device(w, device) &&
           op->src[1]->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32;
}

void ggml_ext_cuda_anyprec_refuse_mul_mat(const ggml_tensor * src0) {
    GGML_ABORT("%s is an any-precision (APQ) weight: it runs through ggml_ext_apq_mul_mat with its tables and a "
               "precision (llama.cpp's linear hook does this), not through a plain mul_mat",
               src0->name);
}

static bool supports(int device, const ggml_tensor * op) {
    if (ggml_ext_apq_mul_mat_check(op) != nullptr) {
        return false;
    }
    const ggml_tensor * w   = op->src[0];
    const ggml_tensor * tab = op->src[2];
    // the operands on this GPU: the weight in the row-lane layout (its own buffer on this device; a weight
    // in host memory stays with the CPU backend rather than being copied up for every product), its tables
    const int64_t T = ggml_nrows(op);
    return ggml_ext_cuda_anyprec_layout(w) && w->buffer != nullptr && on_device(w, device) && tab->buffer != nullptr &&
           on_device(tab, device) && ggml_is_contiguous(op) && w->ne[1] <= INT32_MAX && T <= INT32_MAX &&
           rl_shape(w).padded_k() <= INT32_MAX;
}

static void forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const char * err = ggml_ext_apq_mul_mat_check(dst);
    if (err) {
        GGML_ABORT("%s", err);
    }
    const ggml_tensor * w   = dst->src[0];
    const ggml_tensor * x   = dst->src[1];
    const ggml_tensor * tab = dst->src[2];
    GGML_ASSERT(ggml_ext_cuda_anyprec_layout(w) && ggml_is_contiguous(dst));
    const int32_t * p = (const int32_t *) dst->op_params;
    const int       S = p[0], b = p[2];
    const rl_shape  s(w);
    const int64_t   K = w->ne[0], N = w->ne[1], Kp = s.padded_k(), T = ggml_nrows(dst);
    if (N == 0 || T == 0) {
        return;
    }
    cudaStream_t     stream = ctx.stream();
    const uint8_t *  rl     = (const uint8_t *) w->data;
    const uint16_t * tables = (const uint16_t *) tab->data;
    float *          y      = (float *) dst->data;
    GGML_ASSERT((uintptr_t) tables % 16 == 0);

    // x as T rows of Kp floats (zeros past K), 16-byte aligned: as it is when it already is that
    const float *               xc = (const float *) x->data;
    ggml_cuda_pool_alloc<float> xpad(ctx.pool());
    if (Kp != K || !ggml_is_contiguous(x) || (uintptr_t) xc % 16 != 0) {
        xpad.alloc((size_t) (T * Kp));
        k_apq_pad_x<<<grid_for(T * Kp), 256, 0, stream>>>((const char *) x->data, K, Kp, x->ne[1], x->ne[2], x->nb[1],
                                                          x->nb[2], x->nb[3], T, xpad.get());
        CUDA_CHECK(cudaGetLastError());
        xc = xpad.get();
    }

    if (T <= GEMV_MAX_TOKENS) {
        CUDA_CHECK(ggml_ext_anyprec_gemv_rl_cuda(rl, tables, N, Kp, S, b, xc, T, y, stream));
        return;
    }
    ggml_cuda_pool_alloc<half> w16(ctx.pool(), (size_t) (N * Kp));
    ggml_cuda_pool_alloc<half> x16(ctx.pool(), (size_t) (T * Kp));
    CUDA_CHECK(ggml_ext_anyprec_dequantize_rl_cuda(rl, tables, N, Kp, S, b, (uint16_t *) w16.get(), stream));
    CUDA_CHECK(ggml_ext_anyprec_f32_to_f16_cuda(xc, (uint16_t *) x16.get(), T * Kp, stream));
    // dst [N, T] (column-major N x T) = W^T x: W row-major N x Kp is column-major Kp x N
    cublasHandle_t handle = ctx.cublas_handle();
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int) N, (int) T, (int) Kp, &alpha, w16.get(),
                              CUDA_R_16F, (int) Kp, x16.get(), CUDA_R_16F, (int) Kp, &beta, y, CUDA_R_32F, (int) N,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
}

extern const ggml_ext_cuda_op ggml_ext_cuda_op_apq_mul_mat = { supports, forward };
