// Reproduces docs/RESULTS.md "GPU path" and "Codebooks (CB2/CB3)": mat-vec per type through a ggml backend (run by device_gpu_baseline.sh).
// Mat-vec / small-batch mat-mul time of one ggml type on one backend, at given shapes.
//
// The baseline tool for the GPU kernels (issues 15, 17): the same program is built against the
// pristine upstream ggml (stock types on upstream's kernels: Q4_0, Q3_K, Q2_K, IQ2_S, F16 = cuBLAS /
// ggml-cuda's own f16 path) and against ours (CB2, CB3 as well), so every row of a table comes from the
// same harness. Each measurement is one graph of `reps` MUL_MAT nodes over `copies` distinct weight
// tensors (their total above the GPU's L2 cache, so each node streams its weights from memory),
// computed `iters` times after a warm-up; time per node = wall time / (iters * reps). Weights: 32 rows
// of random normal floats quantized by ggml_quantize_chunk (the type's own reference quantizer; the IQ
// types' are slow), tiled over all M rows: a kernel's speed does not depend on which rows repeat.
//
//   bench-mul-mat-backend TYPE M K [N=1] [--backend CUDA0] [--iters 20] [--reps 64] [--min-bytes 512M]
//   prints one line: type M K N us_per_op GB_per_s (weight bytes / time)
//
// Build (bench/device/device_gpu_baseline.sh does this):
//   c++ -O2 -std=c++17 bench_mul_mat_backend.cpp -I$SRC/ggml/include -L$LIB -lggml -lggml-base -o bench
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static ggml_type type_by_name(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && strcasecmp(n, name) == 0) return (ggml_type) t;
    }
    fprintf(stderr, "unknown ggml type '%s'\n", name);
    exit(2);
}

static long long parse_bytes(const char * s) {
    char * end; double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024; else if (*end == 'M' || *end == 'm') v *= 1 << 20;
    else if (*end == 'G' || *end == 'g') v *= 1 << 30;
    return (long long) v;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TYPE M K [N] [--backend NAME] [--iters I] [--reps R] [--min-bytes B]\n", argv[0]);
        return 2;
    }
    const ggml_type type = type_by_name(argv[1]);
    const int64_t M = atoll(argv[2]), K = atoll(argv[3]);
    int64_t N = 1; int iters = 20, reps = 64; long long min_bytes = 512ll << 20;
    std::string backend_name = "";
    for (int i = 4; i < argc; ++i) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend_name = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc) min_bytes = parse_bytes(argv[++i]);
        else if (argv[i][0] != '-') N = atoll(argv[i]);
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    if (K % ggml_blck_size(type) != 0) {
        fprintf(stderr, "%s: K=%lld is not a multiple of the block size %lld\n", ggml_type_name(type),
                (long long) K, (long long) ggml_blck_size(type));
        return 2;
    }
    ggml_backend_load_all();
    ggml_backend_t backend = backend_name.empty()
        ? ggml_backend_init_best()
        : ggml_backend_init_by_name(backend_name.c_str(), nullptr);
    if (!backend) { fprintf(stderr, "no backend '%s'\n", backend_name.c_str()); return 2; }

    const size_t w_bytes = ggml_row_size(type, K) * M;
    const int copies = (int) std::max<long long>(1, (min_bytes + (long long) w_bytes - 1) / (long long) w_bytes);

    ggml_init_params ip = { ggml_tensor_overhead() * (copies + 2 * reps + 8) + ggml_graph_overhead_custom(4 * reps + 8, false),
                            nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    std::vector<ggml_tensor *> w(copies);
    for (int c = 0; c < copies; ++c) w[c] = ggml_new_tensor_2d(ctx, type, K, M);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 4 * reps + 8, false);
    for (int r = 0; r < reps; ++r) ggml_build_forward_expand(gf, ggml_mul_mat(ctx, w[r % copies], x));
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) { fprintf(stderr, "out of backend memory (%d copies of %zu bytes)\n", copies, w_bytes); return 1; }
    if (!ggml_backend_supports_op(backend, ggml_graph_node(gf, 0))) {
        fprintf(stderr, "%s: backend %s does not support MUL_MAT of %s\n", argv[0], ggml_backend_name(backend),
                ggml_type_name(type));
        return 3;
    }

    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t M0 = std::min<int64_t>(M, 32);
    std::vector<float> f(K * M0);
    std::vector<uint8_t> q(w_bytes);
    for (float & v : f) v = nd(rng) / 32.0f;
    ggml_quantize_init(type);
    const size_t chunk = ggml_quantize_chunk(type, f.data(), q.data(), 0, M0, K, nullptr);
    for (int64_t r = M0; r < M; r += M0) {  // tile the quantized rows; one set of bytes for every copy
        memcpy(q.data() + r * ggml_row_size(type, K), q.data(), std::min<size_t>(chunk, (M - r) * ggml_row_size(type, K)));
    }
    for (int c = 0; c < copies; ++c) ggml_backend_tensor_set(w[c], q.data(), 0, w_bytes);
    std::vector<float> xv(K * N);
    for (float & v : xv) v = nd(rng);
    ggml_backend_tensor_set(x, xv.data(), 0, xv.size() * sizeof(float));

    for (int i = 0; i < 3; ++i) ggml_backend_graph_compute(backend, gf);  // warm-up (CUDA graphs captured)
    ggml_backend_synchronize(backend);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) ggml_backend_graph_compute(backend, gf);
    ggml_backend_synchronize(backend);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double us = s * 1e6 / ((double) iters * reps);
    printf("%s %lld %lld %lld %.2f %.1f\n", ggml_type_name(type), (long long) M, (long long) K, (long long) N, us,
           w_bytes / (us * 1e-6) / 1e9);

    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(backend);
    return 0;
}
