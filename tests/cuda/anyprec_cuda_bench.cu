// Standalone device check + bench of the any-precision CUDA kernels (ggml_ext/src/cuda/anyprec_cuda.cu), run by
// scripts/device_anyprec.sh. For each shape (rows x n_per_row) and precision 3..8 of a 3..8-bit tensor with
// random planes and tables:
//   * check: every path against the C reference (ggml_ext_apq_gemv_ref per token; relative error of each
//     output at most TOL of sum_j |w_j x_j|): v0 (file layout), v1..v8 and the default (row-lane layout made
//     by ggml_ext_apq_relayout_cuda) at one token, v2, v8 and the default at 2, 3, 5, 8 tokens, the
//     dequantize kernel (bit-exact
//     against ggml_ext_apq_dequantize) and dequantize + cuBLAS at 16 tokens (x rounded to fp16 there, so
//     tolerance 1e-3); the max relative error of each shape/precision is printed;
//   * time (CUDA events, median of 200 launches): each variant at one token against cuBLAS's fp16 GEMV of
//     the same shape, as a fraction of the bandwidth measured by a device-to-device copy; v2 at 8 tokens,
//     v8 at 2 and 8 tokens against cuBLAS fp16 at 8 tokens; dequantize + convert x + cuBLAS at 16 tokens against cuBLAS fp16.
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
int     ggml_ext_apq_gemv_ref(const uint8_t *, const ggml_ext_fp16_t *, int64_t, int64_t, int64_t, int64_t, int, int,
                              const float *, float *);
int     ggml_ext_apq_pack_tables(const float *, int64_t, int64_t, int64_t, int, int, ggml_ext_fp16_t *);
int     ggml_ext_apq_dequantize(const uint8_t *, const ggml_ext_fp16_t *, int64_t, int64_t, int64_t, int64_t, int, int,
                                int, float *);
int64_t ggml_ext_apq_row_table_len(int, int);
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
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return t[t.size() / 2];
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

int main() {
    const int S = 3, P = 8, NTB = 16;  // NTB: tokens of the cuBLAS path
    size_t big = (size_t) 1 << 30;     // bandwidth: device-to-device copy of 1 GiB (reads + writes 2 GiB)
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
    const int64_t shapes[][2] = { { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 }, { 14336, 4096 }, { 576, 576 },
                                  { 1000, 1536 } };
    std::string t1 =
        "## one token (GEMV): latency in us per variant; % of bandwidth and speedup of the best row-lane variant\n\n"
        "| rows x n_per_row | bits | v0 | v1 | v2 | v3 | v4 | v5 | v6 | v7 | v8 | best | % of bandwidth | cuBLAS fp16 | speedup | 16/b | max rel err |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    std::string t2 =
        "## batches: v2 at 8 tokens, v8 at 1, 2, 8 tokens; dequantize (deq) + x to fp16 + cuBLAS at 16 tokens; cuBLAS fp16 at 8 and 16\n\n"
        "| rows x n_per_row | bits | v2 8 tok us | v8 1 tok us | v8 2 tok us | v8 8 tok us | fp16 8 tok us | deq us | deq % of bandwidth | deq+cuBLAS 16 tok us | fp16 16 tok us | max rel err cuBLAS path |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    char line[512];
    for (auto & sh : shapes) {
        const int64_t n = sh[0], k = sh[1];
        const bool    rl_ok = k % 128 == 0;
        const size_t  np = (size_t) P * n * k / 8;
        std::vector<uint8_t> planes(np);
        for (auto & v : planes) v = (uint8_t) rnd();
        const int64_t tl = ggml_ext_apq_row_table_len(S, P);
        std::vector<float> tf((size_t) (n * tl));
        for (auto & v : tf) v = ((int) (rnd() % 2001) - 1000) * 1e-4f;
        std::vector<uint16_t> t16((size_t) (n * tl));
        ggml_ext_apq_pack_tables(tf.data(), 0, n, n, S, P, t16.data());
        std::vector<float> x((size_t) (NTB * k));
        for (auto & v : x) v = ((int) (rnd() % 2001) - 1000) * 1e-3f;
        const size_t rl_size = rl_ok ? (size_t) P * ggml_ext_apq_rl_plane_size(n, k) : 16;
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
        if (rl_ok) {
            CK(ggml_ext_apq_relayout_cuda(dp, n, k, P, drl, 0));
        }
        CK(cudaDeviceSynchronize());
        // fp16 baselines (weights: whatever the dequantize kernel left there; zeros first)
        CK(cudaMemset(dw16, 0, (size_t) n * k * 2));
        CK(cudaMemset(dx16, 0, NTB * k * 2));
        const __half one = __float2half(1.0f), zero = __float2half(0.0f);
        const float  fone = 1.0f, fzero = 0.0f;
        auto fp16_gemm = [&](int nt) {
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int) n, nt, (int) k, &one, dw16, CUDA_R_16F, (int) k, dx16,
                         CUDA_R_16F, (int) k, &zero, dh16, CUDA_R_16F, (int) n, CUBLAS_COMPUTE_16F,
                         CUBLAS_GEMM_DEFAULT);
        };
        const float f16_us   = median_us([&] { fp16_gemm(1); });
        const float f16_8us  = median_us([&] { fp16_gemm(8); });
        const float f16_16us = median_us([&] { fp16_gemm(NTB); });
        auto deq_gemm = [&](int b) {
            CK(ggml_ext_apq_dequantize_rl_cuda(drl, dt, n, k, S, b, dw16, 0));
            CK(ggml_ext_apq_f32_to_f16_cuda(dx, dx16, NTB * k, 0));
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int) n, NTB, (int) k, &fone, dw16, CUDA_R_16F, (int) k, dx16,
                         CUDA_R_16F, (int) k, &fzero, dyc, CUDA_R_32F, (int) n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
        };
        for (int b = S; b <= P; b++) {
            std::vector<float>  deq((size_t) (n * k)), want((size_t) (NTB * n)), got((size_t) (NTB * n));
            std::vector<double> mag((size_t) (NTB * n));
            ggml_ext_apq_dequantize(planes.data(), t16.data(), 0, n, n, k, S, P, b, deq.data());
#pragma omp parallel for schedule(dynamic)
            for (int t = 0; t < NTB; t++) {
                ggml_ext_apq_gemv_ref(planes.data(), t16.data(), 0, n, n, k, S, b, x.data() + t * k,
                                      want.data() + t * n);
                for (int64_t r = 0; r < n; r++) {
                    double m = 0;
                    for (int64_t j = 0; j < k; j++) m += fabs((double) deq[r * k + j] * x[t * k + j]);
                    mag[t * n + r] = m;
                }
            }
            double worst = 0;
            auto run_check = [&](const char * what, int nt, double tol) {
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(got.data(), dy, nt * n * 4, cudaMemcpyDeviceToHost));
                worst = std::max(worst, check(what, n, k, b, got, want, mag, nt, tol));
            };
            CK(cudaMemset(dy, 0xff, NTB * n * 4));
            CK(ggml_ext_apq_gemv_cuda(dp, dt, n, k, S, b, dx, dy, 0));
            run_check("v0", 1, 1e-4);
            float us[9] = { 0, 0, 0, 0, 0, 0, 0, 0, 0 };
            us[0] = median_us([&] { ggml_ext_apq_gemv_cuda(dp, dt, n, k, S, b, dx, dy, 0); });
            int   best_v = 0;
            float best = 1e30f, v2_8 = 0, v8_2 = 0, v8_8 = 0, deq_us = 0, deqg_us = 0;
            double worst_c = 0;
            if (rl_ok) {
                for (int v = 1; v <= 8; v++) {
                    char name[8];
                    snprintf(name, sizeof name, "v%d", v);
                    CK(cudaMemset(dy, 0xff, NTB * n * 4));
                    const cudaError_t e = ggml_ext_apq_gemv_rl_cuda(drl, dt, n, k, S, b, v, dx, 1, dy, 0);
                    if (e != cudaSuccess) {  // a launch refused (not a wrong result): reported, the rest go on
                        fprintf(stderr, "%s %lldx%lld bits %d: %s\n", name, (long long) n, (long long) k, b,
                                cudaGetErrorString(e));
                        cudaGetLastError();
                        bad++;
                        continue;
                    }
                    run_check(name, 1, 1e-4);
                    us[v] = median_us([&] { ggml_ext_apq_gemv_rl_cuda(drl, dt, n, k, S, b, v, dx, 1, dy, 0); });
                    if (us[v] < best) {
                        best   = us[v];
                        best_v = v;
                    }
                }
                for (int nt : { 1, 2, 3, 5, 8 }) {
                    for (int v : { 0, 2, 8 }) {  // 0: the default
                        if (nt == 1 && v != 0) continue;
                        char name[24];
                        snprintf(name, sizeof name, "v%d x%d", v, nt);
                        CK(cudaMemset(dy, 0xff, NTB * n * 4));
                        CK(ggml_ext_apq_gemv_rl_cuda(drl, dt, n, k, S, b, v, dx, nt, dy, 0));
                        run_check(name, nt, 1e-4);
                    }
                }
                v2_8 = median_us([&] { ggml_ext_apq_gemv_rl_cuda(drl, dt, n, k, S, b, 2, dx, 8, dy, 0); });
                v8_2 = median_us([&] { ggml_ext_apq_gemv_rl_cuda(drl, dt, n, k, S, b, 8, dx, 2, dy, 0); });
                v8_8 = median_us([&] { ggml_ext_apq_gemv_rl_cuda(drl, dt, n, k, S, b, 8, dx, 8, dy, 0); });
                // dequantize: bit-exact
                CK(ggml_ext_apq_dequantize_rl_cuda(drl, dt, n, k, S, b, dw16, 0));
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
                deq_us = median_us([&] { ggml_ext_apq_dequantize_rl_cuda(drl, dt, n, k, S, b, dw16, 0); });
                deq_gemm(b);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(got.data(), dyc, NTB * n * 4, cudaMemcpyDeviceToHost));
                worst_c = check("deq+cuBLAS", n, k, b, got, want, mag, NTB, 1e-3);
                deqg_us = median_us([&] { deq_gemm(b); });
            }
            const double bytes = (double) b * n * k / 8 + 2.0 * n * (1 << b) + 4.0 * k + 4.0 * n;
            const float  bus   = best_v ? best : us[0];
            auto         cell  = [&](float v) { return v > 0 ? std::to_string(v).substr(0, 6) : std::string("-"); };
            snprintf(line, sizeof line, "| %lldx%lld | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f (v%d) | %.1f | %.2f | %.2f | %.2f | %.1e |\n",
                     (long long) n, (long long) k, b, cell(us[0]).c_str(), cell(us[1]).c_str(), cell(us[2]).c_str(),
                     cell(us[3]).c_str(), cell(us[4]).c_str(), cell(us[5]).c_str(), cell(us[6]).c_str(),
                     cell(us[7]).c_str(), cell(us[8]).c_str(), bus, best_v, 100.0 * bytes / (bus * 1e-6) / bw, f16_us,
                     f16_us / bus, 16.0 / b, worst);
            t1 += line;
            printf("%s", line);
            fflush(stdout);
            if (rl_ok) {
                // dequantize moves b/8 + 2 bytes per weight (planes read, fp16 written)
                const double deq_pct = 100.0 * ((double) b * n * k / 8 + 2.0 * n * k) / (deq_us * 1e-6) / bw;
                snprintf(line, sizeof line,
                         "| %lldx%lld | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.2f | %.2f | %.1e |\n",
                         (long long) n, (long long) k, b, v2_8, us[8], v8_2, v8_8, f16_8us, deq_us, deq_pct, deqg_us,
                         f16_16us, worst_c);
                t2 += line;
            }
        }
        cudaFree(dp); cudaFree(drl); cudaFree(dt); cudaFree(dx); cudaFree(dy); cudaFree(dyc); cudaFree(dw16);
        cudaFree(dx16); cudaFree(dh16);
    }
    cublasDestroy(h);
    printf("\n%s\n%s\n%s\n", t1.c_str(), t2.c_str(),
           bad ? "MISMATCH" : "all GPU results match the CPU reference");
    return bad ? 1 : 0;
}
