// Standalone device check + bench of the any-precision CUDA kernels the op uses (ggml_ext/src/cuda/anyprec_cuda.cu),
// run by bench/device/device_anyprec.sh. For each shape (rows x n_per_row) and precision 3..8 of a 3..8-bit tensor with
// random planes and tables, on the row-lane layout (made here from the file's bytes by relayout(), as
// apq_mul_mat.cu makes it at upload):
//   * check: ggml_ext_anyprec_gemv_rl_cuda at 1, 2, 3, 5, 8 tokens against the C reference (ggml_ext_anyprec_gemv_ref per
//     token; relative error of each output at most TOL of sum_j |w_j x_j|), the dequantize kernel bit-exact
//     against ggml_ext_anyprec_dequantize, and dequantize + cuBLAS at 16 tokens (x rounded to fp16 there, so
//     tolerance 1e-3); the max relative error of each shape/precision is printed;
//   * time: the GEMV at one token against cuBLAS's fp16 GEMV of the same shape, as a fraction of the bandwidth
//     measured by a device-to-device copy (a read-only kernel's bandwidth printed beside it); the GEMV at 2 and
//     8 tokens against cuBLAS fp16 at 8 tokens; dequantize + convert x + cuBLAS at 16 tokens against cuBLAS
//     fp16. Every timing is L2-COLD and back to back (b2b_us): 40 launches between two events, each launch on
//     its own copy of the weights and tables, the copies rotated so that a round reads >= 3 x the L2. The GEMV
//     and cuBLAS at one token are also timed in a CUDA graph (graph_us) and alone (one launch between two
//     events on one copy: L2-warm for shapes under the L2, and the host's launch time included); an empty
//     kernel gives the launch floor of each method.
// Prints markdown tables; exit 1 on any mismatch.
#include "../../ggml_ext/src/cuda/anyprec_cuda.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
typedef uint16_t ggml_ext_fp16_t;
int     ggml_ext_anyprec_gemv_ref(const uint8_t *, const ggml_ext_fp16_t *, int64_t, int64_t, int64_t, int64_t, int, int,
                                  const float *, float *);
int     ggml_ext_anyprec_pack_tables(const float *, int64_t, int64_t, int64_t, int, int, ggml_ext_fp16_t *);
int     ggml_ext_anyprec_dequantize(const uint8_t *, const ggml_ext_fp16_t *, int64_t, int64_t, int64_t, int64_t, int, int,
                                    int, float *);
int64_t ggml_ext_anyprec_row_table_len(int, int);
}

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

static uint64_t s = 88172645463325252ull;
static uint32_t rnd() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (uint32_t) s;
}

// The stream every timed launch goes to: a created one (the legacy default stream cannot be captured into a
// graph), blocking, so that it still orders with the cudaMemset / cudaMemcpy calls of the checks.
static cudaStream_t st;

template <class F> static float median_us(F f, int iters = 200) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 10; i++) f();
    std::vector<float> t;
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(a, st));
        f();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return t[t.size() / 2];
}

// Back-to-back: n launches between one pair of events, f(i) the i-th (the caller rotates over copies of the
// weights with i, so that each launch reads them from DRAM, not from the L2 the previous one filled); the
// median over reps of the mean time per launch. This is what a decode step sees when the host runs ahead
// of the GPU (launch gaps of ~1-2 us, no host round trip per launch).
template <class F> static float b2b_us(F f, int n = 40, int reps = 7) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 10; i++) f(i);
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < n; i++) f(r * n + i);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f / n);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return t[t.size() / 2];
}

// The same n launches captured into one CUDA graph (what llama.cpp's CUDA backend does for decode): the
// median over reps of graph time / n; -1 where the capture fails (reported as "-").
template <class F> static float graph_us(F f, int n = 40, int reps = 7) {
    for (int i = 0; i < 4; i++) f(i);
    CK(cudaStreamSynchronize(st));
    cudaGraph_t     g  = nullptr;
    cudaGraphExec_t ge = nullptr;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        cudaGetLastError();
        return -1.0f;
    }
    for (int i = 0; i < n; i++) f(i);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        return -1.0f;
    }
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(ge, st));
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f / n);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t[t.size() / 2];
}

static __global__ void empty_kernel() {}

// read bandwidth: every byte of buf read once (uint4 loads, grid-stride), folded into one word
static __global__ void read_kernel(const uint4 * __restrict__ p, size_t n, unsigned * out) {
    unsigned s = 0;
    for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        s ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (s == 0x12345678u) *out = s;  // keeps the loads
}

// copies of a device buffer (c[0] the original): rotating over them keeps each launch's reads out of L2
template <class T> static std::vector<T *> make_copies(T * src, size_t bytes, int count) {
    std::vector<T *> c{ src };
    for (int i = 1; i < count; i++) {
        T * d;
        CK(cudaMalloc(&d, bytes));
        CK(cudaMemcpy(d, src, bytes, cudaMemcpyDeviceToDevice));
        c.push_back(d);
    }
    return c;
}

template <class T> static void free_copies(std::vector<T *> & c) {
    for (size_t i = 1; i < c.size(); i++) cudaFree(c[i]);
    c.resize(1);
}

static int bad = 0;

// max over tokens t < nt and rows of |got - want| / sum|w x|; counts outputs over tol as mismatches
static double check(const char * what, int64_t n, int64_t k, int b, const std::vector<float> & got,
                    const std::vector<float> & want, const std::vector<double> & mag, int nt, double tol) {
    double worst = 0;
    for (int t = 0; t < nt; t++) {
        for (int64_t r = 0; r < n; r++) {
            const double e = fabs((double) got[t * n + r] - want[t * n + r]) / (mag[t * n + r] + 1e-30);
            worst = std::max(worst, e);
            if (!(e <= tol)) {  // also NaN
                if (bad++ < 10) {
                    fprintf(stderr, "mismatch %s %lldx%lld bits %d token %d row %lld: gpu %g cpu %g\n", what,
                            (long long) n, (long long) k, b, t, (long long) r, got[t * n + r], want[t * n + r]);
                }
            }
        }
    }
    return worst;
}


// The file's bytes (planes plane-major, rows of n_per_row / 8 bytes) -> the row-lane layout of anyprec_cuda.h,
// one thread per output word: the bench's own way to the layout that apq_mul_mat.cu's upload makes.
static __global__ void relayout_kernel(const uint8_t * __restrict__ planes, int64_t n, int64_t k, int P,
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
            for (int i = 0; i < 4; i++) {
                for (int m = 0; m < 8; m++) {
                    v |= ((in >> (4 * m + i)) & 1u) << (8 * i + m);
                }
            }
        }
        out[o] = v;
    }
}

static void relayout(const uint8_t * planes, int64_t n, int64_t k, int P, uint8_t * out) {
    const int64_t words  = (int64_t) P * (int64_t) (ggml_ext_anyprec_rl_plane_size(n, k) / 4);
    const int64_t blocks = (words + 255) / 256 < 65535 ? (words + 255) / 256 : 65535;
    relayout_kernel<<<(unsigned) blocks, 256, 0, st>>>(planes, n, k, P, (uint32_t *) out);
    CK(cudaGetLastError());
}

int main() {
    const int S = 3, P = 8, NTB = 16;  // NTB: tokens of the cuBLAS path
    // APQ_BITS=lo-hi: only those precisions (quick runs)
    int b_lo = S, b_hi = P;
    if (getenv("APQ_BITS")) {
        if (sscanf(getenv("APQ_BITS"), "%d-%d", &b_lo, &b_hi) < 2) b_hi = b_lo;
        b_lo = std::max(b_lo, S);
        b_hi = std::min(b_hi, P);
    }
    CK(cudaStreamCreate(&st));
    size_t big = (size_t) 1 << 30;     // bandwidth: device-to-device copy of 1 GiB (reads + writes 2 GiB)
    void * src, * dst;
    CK(cudaMalloc(&src, big));
    CK(cudaMalloc(&dst, big));
    CK(cudaMemset(src, 1, big));
    const float copy_us = median_us([&] { CK(cudaMemcpyAsync(dst, src, big, cudaMemcpyDeviceToDevice, st)); }, 20);
    const double bw = 2.0 * (double) big / (copy_us * 1e-6);  // bytes/s
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const float read_us = median_us([&] {
        read_kernel<<<prop.multiProcessorCount * 8, 512, 0, st>>>((const uint4 *) src, big / 16, (unsigned *) dst);
    }, 20);
    const double rbw = (double) big / (read_us * 1e-6);
    CK(cudaFree(src));
    CK(cudaFree(dst));
    // launch floor: an empty kernel, launched alone (host round trip per launch), back to back, and from a
    // CUDA graph
    const float e1 = median_us([&] { empty_kernel<<<1, 32, 0, st>>>(); });
    const float eb = b2b_us([&](int) { empty_kernel<<<1, 32, 0, st>>>(); });
    const float eg = graph_us([&](int) { empty_kernel<<<1, 32, 0, st>>>(); });
    const double l2    = (double) prop.l2CacheSize;
    const double rot   = 3.0 * l2;  // bytes one rotation over the weight copies reads (at the seed precision)
    printf("# %s; measured copy bandwidth %.0f GB/s (the %% of bandwidth below divides by it), read-only "
           "bandwidth %.0f GB/s; L2 %.0f MB\n", prop.name, bw / 1e9, rbw / 1e9, l2 / 1e6);
    printf("bandwidth_GBps %.1f\n", bw / 1e9);  // for bench/device/device_anyprec.sh's table of other kernels
    printf("# launch floor (empty kernel): %.2f us alone (event pair around one launch), %.2f us back to back, "
           "%.2f us in a CUDA graph\n", e1, eb, eg);
    printf("# timings: 'b2b' = mean of 40 back-to-back launches (median of 7 rounds), each launch reading its "
           "own copy of the weights and tables (copies rotated so that one round reads >= 3 x L2: every launch "
           "reads from DRAM); 'graph' = the same 40 launches in one CUDA graph; 'alone' = one launch between two "
           "events on the same copy (L2-warm when it fits; includes the host's launch time)\n\n");
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 2;
    if (cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS) return 2;
    // n_per_row a multiple of 128 (the row-lane layout's; the op pads other lengths, tests/c/test_ext_ops.cpp
    // checks that); 1000 rows: a padded last row group
    const int64_t shapes[][2] = { { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 }, { 14336, 4096 }, { 1000, 1536 } };
    // the issue's table: one row per shape and method, bytes read / L2-cold back-to-back time
    std::string t0 =
        "## one-token GEMV per width and shape (L2-cold, back to back): MB read (planes + tables + x + y), us, GB/s, % "
        "of the measured copy bandwidth\n\n"
        "| rows x n_per_row | method | MB | us | GB/s | % of bandwidth |\n|---|---|---|---|---|---|\n";
    auto t0_row = [&](int64_t n, int64_t k, const char * method, double bytes, double us) {
        char r[256];
        snprintf(r, sizeof r, "| %lldx%lld | %s | %.2f | %.2f | %.0f | %.1f |\n", (long long) n, (long long) k, method,
                 bytes / 1e6, us, bytes / (us * 1e-6) / 1e9, 100.0 * bytes / (us * 1e-6) / bw);
        t0 += r;
    };
    std::string t1 =
        "## one token (GEMV): latency in us, L2-cold back to back; % of bandwidth and speedup over cuBLAS fp16\n\n"
        "| rows x n_per_row | bits | ideal us | GEMV b2b | GB/s | % of bandwidth | GEMV graph | GEMV alone (warm) | cuBLAS fp16 b2b | fp16 graph | fp16 alone | speedup (b2b) | 16/b | max rel err |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    std::string t2 =
        "## batches (L2-cold back to back): the GEMV at 2 and 8 tokens; dequantize (deq) + x to fp16 + cuBLAS at 16 tokens; cuBLAS fp16 at 8 and 16\n\n"
        "| rows x n_per_row | bits | 2 tok us | 8 tok us | fp16 8 tok us | deq us | deq % of bandwidth | deq+cuBLAS 16 tok us | fp16 16 tok us | max rel err cuBLAS path |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
    char line[1024];
    for (auto & sh : shapes) {
        const int64_t n = sh[0], k = sh[1];
        const size_t  np = (size_t) P * n * k / 8;
        std::vector<uint8_t> planes(np);
        for (auto & v : planes) v = (uint8_t) rnd();
        const int64_t tl = ggml_ext_anyprec_row_table_len(S, P);
        std::vector<float> tf((size_t) (n * tl));
        for (auto & v : tf) v = ((int) (rnd() % 2001) - 1000) * 1e-4f;
        std::vector<uint16_t> t16((size_t) (n * tl));
        ggml_ext_anyprec_pack_tables(tf.data(), 0, n, n, S, P, t16.data());
        std::vector<float> x((size_t) (NTB * k));
        for (auto & v : x) v = ((int) (rnd() % 2001) - 1000) * 1e-3f;
        const size_t rl_size = (size_t) P * ggml_ext_anyprec_rl_plane_size(n, k);
        uint8_t * dp, * drl; uint16_t * dt, * dw16, * dx16; float * dx, * dy, * dyc; __half * dh16;
        CK(cudaMalloc(&dp, np));
        CK(cudaMalloc(&drl, rl_size));
        CK(cudaMalloc(&dt, t16.size() * 2));
        CK(cudaMalloc(&dx, NTB * k * 4));
        CK(cudaMalloc(&dy, NTB * n * 4));
        CK(cudaMalloc(&dyc, NTB * n * 4));
        CK(cudaMalloc(&dw16, (size_t) n * k * 2));
        CK(cudaMalloc(&dx16, NTB * k * 2));
        CK(cudaMalloc(&dh16, NTB * n * 2));
        CK(cudaMemcpy(dp, planes.data(), np, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dt, t16.data(), t16.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dx, x.data(), NTB * k * 4, cudaMemcpyHostToDevice));
        relayout(dp, n, k, P, drl);
        CK(cudaDeviceSynchronize());
        // fp16 baselines (weights: whatever the dequantize kernel left there; zeros first)
        CK(cudaMemset(dw16, 0, (size_t) n * k * 2));
        CK(cudaMemset(dx16, 0, NTB * k * 2));
        // copies for the L2-cold rotation: one round over them reads >= rot bytes at S bits (fp16: all of W)
        const double seed_bytes = (double) S * n * k / 8;
        const int    nc   = (int) std::min(1024.0, std::ceil(rot / seed_bytes) + 1);
        const int    nc16 = (int) std::min(1024.0, std::ceil(rot / (2.0 * n * k)) + 1);
        std::vector<uint8_t *>  rlc  = make_copies(drl, rl_size, nc);
        std::vector<uint16_t *> dtc  = make_copies(dt, t16.size() * 2, nc);
        std::vector<uint16_t *> w16c = make_copies(dw16, (size_t) n * k * 2, nc16);
        const __half one = __float2half(1.0f), zero = __float2half(0.0f);
        const float  fone = 1.0f, fzero = 0.0f;
        auto fp16_gemm = [&](int nt, int i) {
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int) n, nt, (int) k, &one, w16c[i % nc16], CUDA_R_16F, (int) k,
                         dx16, CUDA_R_16F, (int) k, &zero, dh16, CUDA_R_16F, (int) n, CUBLAS_COMPUTE_16F,
                         CUBLAS_GEMM_DEFAULT);
        };
        const float f16_us    = b2b_us([&](int i) { fp16_gemm(1, i); });
        const float f16_graph = graph_us([&](int i) { fp16_gemm(1, i); });
        const float f16_alone = median_us([&] { fp16_gemm(1, 0); });
        const float f16_8us   = b2b_us([&](int i) { fp16_gemm(8, i); });
        const float f16_16us  = b2b_us([&](int i) { fp16_gemm(NTB, i); });
        auto deq_gemm = [&](int b, int i) {
            uint16_t * w = w16c[i % nc16];
            CK(ggml_ext_anyprec_dequantize_rl_cuda(rlc[i % rlc.size()], dtc[i % nc], n, k, S, b, w, st));
            CK(ggml_ext_anyprec_f32_to_f16_cuda(dx, dx16, NTB * k, st));
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int) n, NTB, (int) k, &fone, w, CUDA_R_16F, (int) k, dx16,
                         CUDA_R_16F, (int) k, &fzero, dyc, CUDA_R_32F, (int) n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
        };
        auto gemv = [&](int b, int nt, int i) {
            return ggml_ext_anyprec_gemv_rl_cuda(rlc[i % rlc.size()], dtc[i % nc], n, k, S, b, dx, nt, dy, st);
        };
        for (int b = b_lo; b <= b_hi; b++) {
            std::vector<float>  deq((size_t) (n * k)), want((size_t) (NTB * n)), got((size_t) (NTB * n));
            std::vector<double> mag((size_t) (NTB * n));
            ggml_ext_anyprec_dequantize(planes.data(), t16.data(), 0, n, n, k, S, P, b, deq.data());
#pragma omp parallel for schedule(dynamic)
            for (int t = 0; t < NTB; t++) {
                ggml_ext_anyprec_gemv_ref(planes.data(), t16.data(), 0, n, n, k, S, b, x.data() + t * k,
                                          want.data() + t * n);
                for (int64_t r = 0; r < n; r++) {
                    double m = 0;
                    for (int64_t j = 0; j < k; j++) m += fabs((double) deq[r * k + j] * x[t * k + j]);
                    mag[t * n + r] = m;
                }
            }
            double worst = 0;
            for (int nt : { 1, 2, 3, 5, 8 }) {
                char name[24];
                snprintf(name, sizeof name, "GEMV x%d", nt);
                CK(cudaMemset(dy, 0xff, NTB * n * 4));
                CK(gemv(b, nt, 0));
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(got.data(), dy, nt * n * 4, cudaMemcpyDeviceToHost));
                worst = std::max(worst, check(name, n, k, b, got, want, mag, nt, 1e-4));
            }
            const float us1   = b2b_us([&](int i) { gemv(b, 1, i); });
            const float us1_g = graph_us([&](int i) { gemv(b, 1, i); });
            const float us1_a = median_us([&] { gemv(b, 1, 0); });
            const float us2   = b2b_us([&](int i) { gemv(b, 2, i); });
            const float us8   = b2b_us([&](int i) { gemv(b, 8, i); });
            // dequantize: bit-exact
            CK(ggml_ext_anyprec_dequantize_rl_cuda(drl, dt, n, k, S, b, dw16, st));
            CK(cudaDeviceSynchronize());
            std::vector<__half> w16((size_t) (n * k));
            CK(cudaMemcpy(w16.data(), dw16, (size_t) n * k * 2, cudaMemcpyDeviceToHost));
            int64_t deq_bad = 0;
            for (size_t i = 0; i < w16.size(); i++) deq_bad += __half2float(w16[i]) != deq[i];
            if (deq_bad) {
                fprintf(stderr, "mismatch dequantize %lldx%lld bits %d: %lld weights differ\n", (long long) n,
                        (long long) k, b, (long long) deq_bad);
                bad++;
            }
            const float deq_us = b2b_us([&](int i) {
                ggml_ext_anyprec_dequantize_rl_cuda(rlc[i % rlc.size()], dtc[i % nc], n, k, S, b, w16c[i % nc16], st);
            });
            deq_gemm(b, 0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got.data(), dyc, NTB * n * 4, cudaMemcpyDeviceToHost));
            const double worst_c = check("deq+cuBLAS", n, k, b, got, want, mag, NTB, 1e-3);
            const float  deqg_us = b2b_us([&](int i) { deq_gemm(b, i); });

            const double bytes = (double) b * n * k / 8 + 2.0 * n * (1 << b) + 4.0 * k + 4.0 * n;
            auto         cell  = [&](float v) { return v > 0 ? std::to_string(v).substr(0, 6) : std::string("-"); };
            snprintf(line, sizeof line,
                     "| %lldx%lld | %d | %.2f | %.2f | %.0f | %.1f | %s | %.2f | %.2f | %s | %.2f | %.2f | %.2f | %.1e |\n",
                     (long long) n, (long long) k, b, 1e6 * bytes / bw, us1, bytes / (us1 * 1e-6) / 1e9,
                     100.0 * bytes / (us1 * 1e-6) / bw,
                     cell(us1_g).c_str(), us1_a, f16_us, cell(f16_graph).c_str(), f16_alone, f16_us / us1, 16.0 / b,
                     worst);
            t1 += line;
            printf("%s", line);
            const std::string method = "APQ " + std::to_string(b) + "-bit";
            t0_row(n, k, method.c_str(), bytes, us1);
            fflush(stdout);
            // dequantize moves b/8 + 2 bytes per weight (planes read, fp16 written)
            const double deq_pct = 100.0 * ((double) b * n * k / 8 + 2.0 * n * k) / (deq_us * 1e-6) / bw;
            snprintf(line, sizeof line, "| %lldx%lld | %d | %.2f | %.2f | %.2f | %.2f | %.1f | %.2f | %.2f | %.1e |\n",
                     (long long) n, (long long) k, b, us2, us8, f16_8us, deq_us, deq_pct, deqg_us, f16_16us, worst_c);
            t2 += line;
        }
        t0_row(n, k, "cuBLAS fp16", 2.0 * n * k + 2.0 * k + 2.0 * n, f16_us);
        free_copies(rlc); free_copies(dtc); free_copies(w16c);
        cudaFree(dp); cudaFree(drl); cudaFree(dt); cudaFree(dx); cudaFree(dy); cudaFree(dyc); cudaFree(dw16);
        cudaFree(dx16); cudaFree(dh16);
    }
    cublasDestroy(h);
    printf("\n%s\n%s\n%s\n%s\n", t0.c_str(), t1.c_str(), t2.c_str(),
           bad ? "MISMATCH" : "all GPU results match the CPU reference");
    return bad ? 1 : 0;
}
