// Standalone device check + bench of the any-precision CUDA GEMV (ggml_ext/src/cuda/anyprec_cuda.cu), run by
// scripts/device_anyprec.sh: for each shape (rows x n_per_row) and precision 3..8 of a 3..8-bit tensor with
// random planes and tables, the GPU result against the C reference (ggml_ext_apq_gemv_ref; relative error
// of each row at most 1e-4 of sum |w x|), then latency (CUDA events, median of 200 launches) against cuBLAS's
// fp16 GEMV (cublasGemmEx, one column) of the same shape, and the bytes each reads as a fraction of the
// device bandwidth measured by a device-to-device copy. Prints a markdown table; exit 1 on a mismatch.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
typedef uint16_t ggml_ext_fp16_t;
int     ggml_ext_apq_gemv_ref(const uint8_t *, const ggml_ext_fp16_t *, int64_t, int64_t, int64_t, int64_t, int, int,
                              const float *, float *);
int     ggml_ext_apq_pack_tables(const float *, int64_t, int64_t, int64_t, int, int, ggml_ext_fp16_t *);
int     ggml_ext_apq_dequantize(const uint8_t *, const ggml_ext_fp16_t *, int64_t, int64_t, int64_t, int64_t, int, int,
                                int, float *);
int64_t ggml_ext_apq_row_table_len(int, int);
cudaError_t ggml_ext_apq_gemv_cuda(const uint8_t *, const uint16_t *, int64_t, int64_t, int, int, const float *,
                                   float *, cudaStream_t);
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

template <class F> static float median_us(F f, int iters = 200) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 10; i++) f();
    std::vector<float> t;
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(a));
        f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    const int S = 3, P = 8;
    // bandwidth: device-to-device copy of 1 GiB (reads + writes 2 GiB)
    size_t big = (size_t) 1 << 30;
    void * src, * dst;
    CK(cudaMalloc(&src, big));
    CK(cudaMalloc(&dst, big));
    CK(cudaMemset(src, 1, big));
    const float copy_us = median_us([&] { CK(cudaMemcpyAsync(dst, src, big, cudaMemcpyDeviceToDevice)); }, 20);
    const double bw = 2.0 * (double) big / (copy_us * 1e-6);  // bytes/s
    CK(cudaFree(src));
    CK(cudaFree(dst));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# %s; measured copy bandwidth %.0f GB/s\n\n", prop.name, bw / 1e9);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 2;
    const int64_t shapes[][2] = { { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 }, { 14336, 4096 }, { 576, 576 } };
    printf("| rows x n_per_row | bits | anyprec us | bytes read | %% of bandwidth | cuBLAS fp16 us | speedup |\n");
    printf("|---|---|---|---|---|---|---|\n");
    int bad = 0;
    for (auto & sh : shapes) {
        const int64_t n = sh[0], k = sh[1];
        const size_t  np = (size_t) P * n * k / 8;
        std::vector<uint8_t> planes(np);
        for (auto & v : planes) v = (uint8_t) rnd();
        const int64_t tl = ggml_ext_apq_row_table_len(S, P);
        std::vector<float> tf((size_t) (n * tl));
        for (auto & v : tf) v = ((int) (rnd() % 2001) - 1000) * 1e-4f;
        std::vector<uint16_t> t16((size_t) (n * tl));
        ggml_ext_apq_pack_tables(tf.data(), 0, n, n, S, P, t16.data());
        std::vector<float> x((size_t) k);
        for (auto & v : x) v = ((int) (rnd() % 2001) - 1000) * 1e-3f;
        uint8_t * dp; uint16_t * dt; float * dx, * dy; __half * dw16, * dx16, * dy16;
        CK(cudaMalloc(&dp, np));
        CK(cudaMalloc(&dt, t16.size() * 2));
        CK(cudaMalloc(&dx, k * 4));
        CK(cudaMalloc(&dy, n * 4));
        CK(cudaMalloc(&dw16, (size_t) n * k * 2));
        CK(cudaMalloc(&dx16, k * 2));
        CK(cudaMalloc(&dy16, n * 2));
        CK(cudaMemset(dw16, 0, (size_t) n * k * 2));
        CK(cudaMemset(dx16, 0, k * 2));
        CK(cudaMemcpy(dp, planes.data(), np, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dt, t16.data(), t16.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dx, x.data(), k * 4, cudaMemcpyHostToDevice));
        const __half one = __float2half(1.0f), zero = __float2half(0.0f);
        const float f16_us = median_us([&] {
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int) n, 1, (int) k, &one, dw16, CUDA_R_16F, (int) k, dx16,
                         CUDA_R_16F, (int) k, &zero, dy16, CUDA_R_16F, (int) n, CUBLAS_COMPUTE_16F,
                         CUBLAS_GEMM_DEFAULT);
        });
        for (int b = S; b <= P; b++) {
            std::vector<float> want(n), got(n), deq((size_t) (n * k));
            ggml_ext_apq_gemv_ref(planes.data(), t16.data(), 0, n, n, k, S, b, x.data(), want.data());
            ggml_ext_apq_dequantize(planes.data(), t16.data(), 0, n, n, k, S, P, b, deq.data());
            CK(ggml_ext_apq_gemv_cuda(dp, dt, n, k, S, b, dx, dy, 0));
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got.data(), dy, n * 4, cudaMemcpyDeviceToHost));
            for (int64_t r = 0; r < n; r++) {
                double mag = 0;
                for (int64_t j = 0; j < k; j++) mag += fabs((double) deq[r * k + j] * x[j]);
                if (fabs((double) got[r] - want[r]) > 1e-4 * mag + 1e-20) {
                    if (bad++ < 5) fprintf(stderr, "mismatch %lldx%lld bits %d row %lld: gpu %g cpu %g\n",
                                           (long long) n, (long long) k, b, (long long) r, got[r], want[r]);
                }
            }
            const float us = median_us([&] { ggml_ext_apq_gemv_cuda(dp, dt, n, k, S, b, dx, dy, 0); });
            const double bytes = (double) b * n * k / 8 + 2.0 * n * (1 << b) + 4.0 * k + 4.0 * n;
            printf("| %lldx%lld | %d | %.2f | %.0f | %.1f | %.2f | %.2f |\n", (long long) n, (long long) k, b, us,
                   bytes, 100.0 * bytes / (us * 1e-6) / bw, f16_us, f16_us / us);
        }
        cudaFree(dp); cudaFree(dt); cudaFree(dx); cudaFree(dy); cudaFree(dw16); cudaFree(dx16); cudaFree(dy16);
    }
    cublasDestroy(h);
    printf("\n%s\n", bad ? "MISMATCH" : "all GPU results match the CPU reference");
    return bad ? 1 : 0;
}
