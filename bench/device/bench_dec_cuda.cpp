// Reproduces docs/RESULTS.md "QDEC": the DEC node's cost against the base GEMV on CUDA (run by device_dec.sh).
// QDEC on the GPU: base GEMV + DEC_MUL_MAT time normalised to the base GEMV alone (issue 18's measure), for
// one weight shape over k_chunk and n_tb. Run by bench/device/device_dec.sh (MODE=bench), which prints the table.
//
// Each measurement is one graph of `reps` linears over `copies` distinct weights (their total above the
// GPU's L2 cache, so each node streams its weights from memory, as in bench_mul_mat_backend.cpp): the
// base graph is reps x MUL_MAT(W_c, x) (ggml-cuda's own GEMV of a Q4_0 weight), the DEC graph the same
// MUL_MATs each followed by DEC_MUL_MAT(y_c, x, R_c, S_c) with R_c in pinned host memory (the CUDA
// device's host buffer type: cudaMallocHost, mapped; read zero-copy over PCIe) or, with --r device, in GPU
// memory (the bandwidth argument's other side). Time per linear = wall time / (iters * reps) after a
// warm-up. x is random normal; b0 = max |x|, b15 = the largest k-th largest |x| of a chunk (what
// `calibrate dec` stores, measured on this x).
//
//   bench-dec-cuda M K [--k 0,8,16,32,64,128] [--ntb 0,33,66,132,264] [--mode approx|exact]
//                      [--r host|device] [--iters 50] [--reps 32] [--min-bytes 512M] [--type q4_0]
//   prints markdown rows: | M x K | r | launch | mode | k_chunk | n_tb | base us | base+DEC us | ratio | residual GB/s |
//   (launch: GGML_EXT_DEC_LAUNCH as set by the caller, "auto" when unset; n_tb 0: the op's default, one per SM)
//
// Build: c++ -O2 -std=c++17 bench/device/bench_dec_cuda.cpp -I$P/include -L$P/lib -lggml -lggml-base -o bench-dec-cuda
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-ext-ops.h"
#include "ggml.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static std::vector<int> parse_list(const char * s) {
    std::vector<int> v;
    for (const char * p = s; *p;) {
        v.push_back(atoi(p));
        const char * c = strchr(p, ',');
        if (!c) break;
        p = c + 1;
    }
    return v;
}

static long long parse_bytes(const char * s) {
    char * end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1 << 20;
    else if (*end == 'G' || *end == 'g') v *= 1 << 30;
    return (long long) v;
}

struct bench {
    ggml_backend_t backend;
    int iters, reps;
};

// seconds per linear of a graph
static double time_graph(const bench & b, ggml_cgraph * gf) {
    for (int i = 0; i < 3; ++i) ggml_backend_graph_compute(b.backend, gf);  // warm-up (CUDA graphs captured)
    ggml_backend_synchronize(b.backend);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < b.iters; ++i) ggml_backend_graph_compute(b.backend, gf);
    ggml_backend_synchronize(b.backend);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / ((double) b.iters * b.reps);
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s M K [--k LIST] [--ntb LIST] [--mode approx|exact] [--r host|device] [--iters I] "
                        "[--reps R] [--min-bytes B] [--type T]\n", argv[0]);
        return 2;
    }
    const int64_t M = atoll(argv[1]), K = atoll(argv[2]);
    std::vector<int> ks = { 0, 8, 16, 32, 64, 128 }, ntbs = { 0 };
    int iters = 50, reps = 32, mode = GGML_EXT_QDEC_APPROX;
    bool r_host = true;
    long long min_bytes = 512ll << 20;
    ggml_type type = GGML_TYPE_Q4_0;
    for (int i = 3; i < argc; ++i) {
        if (!strcmp(argv[i], "--k") && i + 1 < argc) ks = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--ntb") && i + 1 < argc) ntbs = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc) mode = !strcmp(argv[++i], "exact") ? GGML_EXT_QDEC_EXACT : GGML_EXT_QDEC_APPROX;
        else if (!strcmp(argv[i], "--r") && i + 1 < argc) r_host = strcmp(argv[++i], "device") != 0;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc) min_bytes = parse_bytes(argv[++i]);
        else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            const char * n = argv[++i];
            type = GGML_TYPE_COUNT;
            for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
                if (ggml_type_name((ggml_type) t) && !strcasecmp(ggml_type_name((ggml_type) t), n)) type = (ggml_type) t;
            }
            if (type == GGML_TYPE_COUNT) { fprintf(stderr, "unknown type %s\n", n); return 2; }
        } else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    ggml_backend_load_all();
    ggml_backend_t backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_GPU, nullptr);
    if (!backend) { fprintf(stderr, "no GPU backend\n"); return 3; }
    ggml_backend_buffer_type_t host_buft = ggml_backend_dev_host_buffer_type(ggml_backend_get_device(backend));
    if (r_host && !host_buft) { fprintf(stderr, "the GPU device has no host buffer type\n"); return 3; }
    const bench b = { backend, iters, reps };

    const size_t w_bytes = ggml_row_size(type, K) * M, r_bytes = (size_t) (M + 1) / 2 * K;
    const int copies = (int) std::max<long long>(1, (min_bytes + (long long) w_bytes - 1) / (long long) w_bytes);
    const int n_ctx = copies * 4 + 4 * reps + 16;

    // tensors: weights, x, scales in GPU memory; residuals in the host buffer (or GPU memory)
    ggml_init_params ip = { ggml_tensor_overhead() * n_ctx, nullptr, true };
    ggml_context * ctx_w = ggml_init(ip), * ctx_r = ggml_init(ip);
    std::vector<ggml_tensor *> w(copies), r(copies), s(copies);
    for (int c = 0; c < copies; ++c) {
        w[c] = ggml_new_tensor_2d(ctx_w, type, K, M);
        s[c] = ggml_new_tensor_1d(ctx_w, GGML_TYPE_F32, M);
        r[c] = ggml_new_tensor_2d(r_host ? ctx_r : ctx_w, GGML_TYPE_I8, (M + 1) / 2, K);
    }
    ggml_tensor * x = ggml_new_tensor_2d(ctx_w, GGML_TYPE_F32, K, 1);
    ggml_backend_buffer_t buf_w = ggml_backend_alloc_ctx_tensors(ctx_w, backend);
    ggml_backend_buffer_t buf_r = r_host ? ggml_backend_alloc_ctx_tensors_from_buft(ctx_r, host_buft) : nullptr;
    if (!buf_w || (r_host && !buf_r)) { fprintf(stderr, "out of memory (%d copies)\n", copies); return 1; }

    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    {
        const int64_t M0 = std::min<int64_t>(M, 32);
        std::vector<float> f(K * M0);
        std::vector<uint8_t> q(w_bytes);
        for (float & v : f) v = nd(rng) / 32.0f;
        ggml_quantize_init(type);
        const size_t chunk = ggml_quantize_chunk(type, f.data(), q.data(), 0, M0, K, nullptr);
        for (int64_t row = M0; row < M; row += M0) {
            memcpy(q.data() + row * ggml_row_size(type, K), q.data(), std::min<size_t>(chunk, (M - row) * ggml_row_size(type, K)));
        }
        std::vector<uint8_t> rb(r_bytes);
        for (auto & v : rb) v = (uint8_t) (rng() & 0xff);
        std::vector<float> sv(M, 0.002f);
        for (int c = 0; c < copies; ++c) {
            ggml_backend_tensor_set(w[c], q.data(), 0, w_bytes);
            ggml_backend_tensor_set(r[c], rb.data(), 0, r_bytes);
            ggml_backend_tensor_set(s[c], sv.data(), 0, M * sizeof(float));
        }
    }
    std::vector<float> xv(K);
    for (float & v : xv) v = nd(rng);
    ggml_backend_tensor_set(x, xv.data(), 0, K * sizeof(float));
    float b0 = 0;
    for (float v : xv) b0 = std::max(b0, std::fabs(v));

    // the base graph
    ggml_init_params gp = { ggml_tensor_overhead() * (4 * reps + 8) + ggml_graph_overhead_custom(4 * reps + 8, false),
                            nullptr, true };
    double t_base;
    {
        ggml_context * g = ggml_init(gp);
        ggml_cgraph * gf = ggml_new_graph_custom(g, 4 * reps + 8, false);
        for (int i = 0; i < reps; ++i) ggml_build_forward_expand(gf, ggml_mul_mat(g, w[i % copies], x));
        ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
        ggml_gallocr_alloc_graph(ga, gf);
        t_base = time_graph(b, gf);
        ggml_gallocr_free(ga);
        ggml_free(g);
    }
    const char * launch = getenv("GGML_EXT_DEC_LAUNCH");
    for (int k : ks) {
        // b15 for this k: the largest k-th largest |x| of a chunk
        float b15 = 0;
        for (int64_t c0 = 0; c0 < K && k > 0; c0 += GGML_EXT_QDEC_CHUNK) {
            std::vector<float> a;
            for (int64_t j = c0; j < std::min<int64_t>(K, c0 + GGML_EXT_QDEC_CHUNK); ++j) a.push_back(std::fabs(xv[j]));
            const size_t kk = std::min<size_t>(k, a.size());
            std::nth_element(a.begin(), a.begin() + (kk - 1), a.end(), std::greater<float>());
            b15 = std::max(b15, a[kk - 1]);
        }
        if (!(b15 > 0)) b15 = b0 > 0 ? b0 : 1.0f;
        for (int ntb : ntbs) {
            ggml_context * g = ggml_init(gp);
            ggml_cgraph * gf = ggml_new_graph_custom(g, 4 * reps + 8, false);
            for (int i = 0; i < reps; ++i) {
                const int c = i % copies;
                ggml_tensor * y = ggml_mul_mat(g, w[c], x);
                ggml_tensor * d = ggml_ext_dec_mul_mat(g, y, x, r[c], s[c], k, (ggml_ext_qdec_mode) mode, b0, b15);
                ggml_ext_dec_mul_mat_set_n_tb(d, ntb);
                ggml_build_forward_expand(gf, d);
            }
            if (!ggml_backend_supports_op(backend, ggml_graph_node(gf, 1))) {
                fprintf(stderr, "the GPU backend does not take DEC_MUL_MAT\n");
                return 3;
            }
            ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
            ggml_gallocr_alloc_graph(ga, gf);
            const double t = time_graph(b, gf);
            ggml_gallocr_free(ga);
            ggml_free(g);
            const int64_t n_chunks = (K + GGML_EXT_QDEC_CHUNK - 1) / GGML_EXT_QDEC_CHUNK;
            const int64_t kk = std::min<int64_t>(k, GGML_EXT_QDEC_CHUNK);
            const int64_t n_sel = kk ? (n_chunks - 1) * kk + std::min<int64_t>(kk, K - (n_chunks - 1) * GGML_EXT_QDEC_CHUNK) : 0;
            const double gbs = t > t_base && n_sel ? (double) n_sel * ((M + 1) / 2) / (t - t_base) / 1e9 : 0.0;
            printf("| %lldx%lld | %s | %s | %s | %d | %d | %.2f | %.2f | %.3f | %.1f |\n", (long long) M, (long long) K,
                   r_host ? "host" : "device", launch ? launch : "auto", mode == GGML_EXT_QDEC_EXACT ? "exact" : "approx",
                   k, ntb, t_base * 1e6, t * 1e6, t / t_base, gbs);
            fflush(stdout);
        }
    }
    ggml_backend_buffer_free(buf_w);
    if (buf_r) ggml_backend_buffer_free(buf_r);
    ggml_free(ctx_w);
    ggml_free(ctx_r);
    ggml_backend_free(backend);
    return 0;
}
