// ggml-ext's types on every backend, in the manner of llama.cpp's test-backend-ops: for each registered
// type with a stock twin (the interleaved Q4_0 / IQ4_NL layouts, ggml_ext_base_layout_type), a weight
// matrix quantized by ggml_quantize_chunk times F32 activations, over the shapes the models use:
//   CPU               the reference for every other backend (ggml-ext's kernels), same bits with 1-4 threads
//   --rpc HOST:PORT   a ggml-rpc-server: the same bits as the local CPU backend when it computes on a CPU;
//                     with --rpc-gpu the server computes on a GPU and is held to the GPU rules below
//   GPU devices       every GPU in the ggml registry (CUDA with GGML_EXT_CUDA=ON), which holds these
//                     weights in the base layout: the result equals, bit for bit, the same GPU's result
//                     on the base type's tensor the weights were repacked from (upstream's own kernels on
//                     the same values), and is within test-backend-ops' MUL_MAT bound of the CPU (NMSE
//                     at most 5e-4: the GPU quantizes activations to Q8_1 or runs cuBLAS on dequantized
//                     weights, the CPU to Q8_0)
//   --require-gpu     exit 77 (skip) when there is no GPU device
// ggml-ext's own quantized types (the codebooks CB2 / CB3, no stock twin) are held as they are and run by
// ggml-ext's kernels on every backend: over shapes from one token (the GPU's mat-vec) through 2..8 tokens
// (still the mat-vec) to 9+ (dequantize + cuBLAS), with row counts that are not multiples of the kernels'
// row tiles, each backend's result is held to the exact product of the dequantized weights (double sums:
// NMSE at most 1e-4 on the CPU, which quantizes activations to Q8_K (about 1.5e-5 measured), and on a GPU up
// to 8 tokens (its integer mat-vec quantizes them to q8_1; GGML_EXT_CB_MMV=f32 selects the f32 one); at most
// 1e-5 on a GPU past 8 tokens (cuBLAS, f32 / f16 activations)) and a GPU's to the CPU's (2e-4); through RPC the
// local CPU's bits.
// The weights go up in uneven pieces (as llama.cpp's loader sends them) and come back byte for byte,
// whole and in slices that start and end inside a row group; nodes a backend cannot run on these
// layouts (get_rows, a view of part of each row) are refused by supports_op, not run wrong.
// Built and run by tests/formats/test_interleaved4_backends.py and scripts/test_cuda.sh (make test-cuda).
#include "backend_test.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-ext.h"
#include "ggml-rpc.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// weights [K, N] (N rows of K), activations [K, M]
struct mm_case {
    int64_t K, N, M;
};

static const mm_case k_cases[] = {
    { 64, 8, 1 },        // the smallest: two blocks, one group of 8
    { 576, 576, 1 },     // SmolLM2's attention, one token (MMVQ on CUDA)
    { 576, 1536, 7 },    // its FFN up, a few tokens
    { 1536, 576, 33 },   // its FFN down, a batch (MMQ on CUDA)
    { 4096, 64, 512 },   // a 7B row width, a prompt's batch
    { 320, 24, 3 },      // K not a multiple of 256, N of 8 but not of 16
};

struct graph {
    ggml_context *        ctx = nullptr;
    ggml_tensor *         w = nullptr, *x = nullptr, *y = nullptr;
    ggml_cgraph *         gf  = nullptr;
    ggml_backend_buffer_t buf = nullptr;

    ~graph() {
        if (buf) {
            ggml_backend_buffer_free(buf);
        }
        if (ctx) {
            ggml_free(ctx);
        }
    }
};

// The random weights (scale 0.1) and activations of case c, seeded by the type id and the shape.
static void random_case(int type_id, const mm_case & c, std::vector<float> & wf, std::vector<float> & x) {
    rng r{ (uint64_t) (1000 * type_id + c.K + 7 * c.N) };
    wf.resize(c.K * c.N);
    x.resize(c.K * c.M);
    for (auto & v : wf) {
        v = r.next() * 0.1f;
    }
    for (auto & v : x) {
        v = r.next();
    }
}

// y = w x on `backend`, the weights' bytes sent in pieces of `piece` bytes (0: at once)
static std::vector<float> mul_mat(ggml_backend_t backend, ggml_type type, const mm_case & c,
                                  const std::vector<uint8_t> & wbytes, const std::vector<float> & x, size_t piece,
                                  std::vector<uint8_t> * readback = nullptr) {
    graph            g;
    ggml_init_params ip = { 8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    g.ctx               = ggml_init(ip);
    g.w                 = ggml_new_tensor_2d(g.ctx, type, c.K, c.N);
    g.x                 = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, c.K, c.M);
    g.y                 = ggml_mul_mat(g.ctx, g.w, g.x);
    g.gf                = ggml_new_graph(g.ctx);
    ggml_build_forward_expand(g.gf, g.y);
    g.buf = ggml_backend_alloc_ctx_tensors(g.ctx, backend);
    CHECK(ggml_nbytes(g.w) == wbytes.size(), "%s bytes", ggml_type_name(type));
    for (size_t off = 0; off < wbytes.size();) {
        const size_t n = piece ? std::min(piece, wbytes.size() - off) : wbytes.size();
        ggml_backend_tensor_set(g.w, wbytes.data() + off, off, n);
        off += n;
    }
    ggml_backend_tensor_set(g.x, x.data(), 0, x.size() * sizeof(float));
    std::vector<float> y(c.N * c.M, NAN);
    if (!ggml_backend_supports_op(backend, g.y)) {
        CHECK(false, "%s refuses mul_mat %s %lldx%lld x %lld", ggml_backend_name(backend), ggml_type_name(type),
              (long long) c.K, (long long) c.N, (long long) c.M);
        return y;
    }
    CHECK(ggml_backend_graph_compute(backend, g.gf) == GGML_STATUS_SUCCESS, "compute");
    ggml_backend_tensor_get(g.y, y.data(), 0, y.size() * sizeof(float));
    if (readback) {
        readback->assign(wbytes.size(), 0);
        ggml_backend_tensor_get(g.w, readback->data(), 0, readback->size());
    }
    return y;
}

static double nmse(const std::vector<float> & got, const std::vector<float> & want) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < got.size(); i++) {
        err += ((double) got[i] - want[i]) * ((double) got[i] - want[i]);
        norm += (double) want[i] * want[i];
    }
    return err / norm;
}

// The weights' bytes come back from `backend` as they went in: whole, and in slices that start and end
// inside a row group (a GPU keeping the base layout re-interleaves on the way out).
static void check_readback(ggml_backend_t backend, ggml_type type, const mm_case & c, const std::vector<uint8_t> & w) {
    graph            g;
    ggml_init_params ip = { 2 * ggml_tensor_overhead(), nullptr, true };
    g.ctx               = ggml_init(ip);
    g.w                 = ggml_new_tensor_2d(g.ctx, type, c.K, c.N);
    g.buf               = ggml_backend_alloc_ctx_tensors(g.ctx, backend);
    ggml_backend_tensor_set(g.w, w.data(), 0, w.size());
    // overwrite a middle slice with its own bytes in two odd pieces: nothing may move
    const size_t a = w.size() / 3 + 5, b = std::min(w.size(), a + 777);
    ggml_backend_tensor_set(g.w, w.data() + a, a, 100);
    ggml_backend_tensor_set(g.w, w.data() + a + 100, a + 100, b - a - 100);
    std::vector<uint8_t> back(w.size());
    ggml_backend_tensor_get(g.w, back.data(), 0, back.size());
    CHECK(back == w, "%s: %s %lldx%lld whole readback differs", ggml_backend_name(backend), ggml_type_name(type),
          (long long) c.K, (long long) c.N);
    std::vector<uint8_t> part(b - a);
    ggml_backend_tensor_get(g.w, part.data(), a, part.size());
    CHECK(!std::memcmp(part.data(), w.data() + a, part.size()), "%s: %s slice readback differs",
          ggml_backend_name(backend), ggml_type_name(type));
}

// Nodes a backend cannot run on an interleaved layout must be refused, not run wrong.
static void check_refusals(ggml_backend_t backend, ggml_type type) {
    ggml_init_params ip  = { 8 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    w   = ggml_new_tensor_2d(ctx, type, 64, 16);
    ggml_tensor *    ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 3);
    ggml_tensor *    gr  = ggml_get_rows(ctx, w, ids);
    ggml_tensor *    x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 4);
    ggml_tensor *    wv  = ggml_mul_mat(ctx, ggml_view_2d(ctx, w, 32, 16, w->nb[1], 0), x);  // half of each row
    const bool       rpc = ggml_backend_is_rpc(backend);  // RPC answers yes to everything
    CHECK(rpc || !ggml_backend_supports_op(backend, gr), "%s accepts get_rows of %s", ggml_backend_name(backend),
          ggml_type_name(type));
    CHECK(rpc || !ggml_backend_supports_op(backend, wv), "%s accepts mul_mat of a column view of %s",
          ggml_backend_name(backend), ggml_type_name(type));
    ggml_free(ctx);
}

// ---- the codebook types (own ids, no stock twin) ----

static const mm_case k_cb_cases[] = {
    { 256, 8, 1 },       // one block per row, one row tile
    { 1536, 576, 1 },    // SmolLM2's FFN down (its only width that is a multiple of 256), one token
    { 2304, 576, 2 },    // 2..8 tokens: the GPU's mat-vec with several columns; 9 blocks a row: one full step
                         // of its 8 blocks' loads in flight, then a partial one
    { 768, 203, 5 },     // rows not a multiple of the mat-vec's 8 per CUDA block
    { 1536, 13, 8 },     // the mat-vec's largest batch, 13 rows
    { 1536, 576, 9 },    // the smallest batch on cuBLAS
    { 512, 389, 33 },    // a batch, odd rows
    { 4096, 64, 512 },   // a 7B row width, a prompt's batch
};

// y[m * N + n] = sum_k w[n, k] x[m, k] in double on the weights' dequantized values: the exact product every
// backend approximates
static std::vector<float> exact_mul_mat(ggml_type type, const mm_case & c, const std::vector<uint8_t> & w,
                                        const std::vector<float> & x) {
    std::vector<float> wf(c.K * c.N);
    ggml_get_type_traits(type)->to_float(w.data(), wf.data(), c.K * c.N);
    std::vector<float> y(c.N * c.M);
    for (int64_t m = 0; m < c.M; m++) {
        for (int64_t n = 0; n < c.N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < c.K; k++) {
                acc += (double) wf[n * c.K + k] * x[m * c.K + k];
            }
            y[m * c.N + n] = (float) acc;
        }
    }
    return y;
}

// get_rows and mul_mat_id of the codebook types are not run on a GPU (llama.cpp keeps token_embd on the
// CPU); supports_op must say so rather than run them wrong.
static void check_cb_refusals(ggml_backend_t backend, ggml_type type) {
    ggml_init_params ip  = { 8 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    w   = ggml_new_tensor_3d(ctx, type, 256, 16, 2);
    ggml_tensor *    ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 3);
    ggml_tensor *    gr  = ggml_get_rows(ctx, ggml_view_2d(ctx, w, 256, 16, w->nb[1], 0), ids);
    ggml_tensor *    x   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 256, 1, 4);
    ggml_tensor *    eid = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, 4);
    ggml_tensor *    mid = ggml_mul_mat_id(ctx, w, x, eid);
    CHECK(!ggml_backend_supports_op(backend, gr), "%s accepts get_rows of %s", ggml_backend_name(backend),
          ggml_type_name(type));
    CHECK(!ggml_backend_supports_op(backend, mid), "%s accepts mul_mat_id of %s", ggml_backend_name(backend),
          ggml_type_name(type));
    ggml_free(ctx);
}

// y = w x on backend b with the weights uploaded piecewise (they must read back unchanged); an RPC server
// over a CPU must give `on_cpu` bit for bit, and then true is returned (nothing more to compare).
static bool cpu_rpc_matches(ggml_backend_t b, ggml_type type, const char * name, const mm_case & c,
                            const std::vector<uint8_t> & w, const std::vector<float> & x,
                            const std::vector<float> & on_cpu, bool rpc_gpu, std::vector<float> & got) {
    std::vector<uint8_t> back;
    got = mul_mat(b, type, c, w, x, 1000003 % (w.size() / 3 + 1) + 1, &back);
    CHECK(back == w, "%s: %s %lldx%lld readback after a piecewise upload differs", ggml_backend_name(b), name,
          (long long) c.K, (long long) c.N);
    if (!ggml_backend_is_rpc(b) || rpc_gpu) {
        return false;
    }
    CHECK(!std::memcmp(on_cpu.data(), got.data(), got.size() * sizeof(float)),
          "%s: %s %lldx%lldx%lld differs from the local CPU", ggml_backend_name(b), name, (long long) c.K,
          (long long) c.N, (long long) c.M);
    return true;
}

// Every codebook type in mul_mat on the CPU and each other backend; returns the number of mul_mat runs.
static int check_codebook_types(ggml_backend_t cpu, const std::vector<ggml_backend_t> & others, bool rpc_gpu,
                                int * n_types) {
    int runs = 0;
    *n_types = 0;
    for (int t = 0; t < ggml_ext_type_count(); t++) {
        const ggml_ext_type_info * info = ggml_ext_type_info_at(t);
        if (info->id != GGML_TYPE_CB2 && info->id != GGML_TYPE_CB3) {
            continue;
        }
        (*n_types)++;
        const ggml_type type = (ggml_type) info->id;
        for (ggml_backend_t b : others) {
            if (!ggml_backend_is_rpc(b)) {  // RPC answers yes to everything
                check_cb_refusals(b, type);
            }
        }
        std::vector<uint8_t> w;  // the last shape's weights
        int64_t              wK = 0;
        for (const mm_case & c : k_cb_cases) {
            // the weights depend on the shape only (quantizing is the slow part: once per K x N)
            std::vector<float> wf, x;
            random_case((int) info->id, c, wf, x);
            const size_t nbytes = ggml_row_size(type, c.K) * c.N;
            if (w.size() != nbytes || wK != c.K) {
                w.assign(nbytes, 0);
                wK = c.K;
                CHECK(ggml_quantize_chunk(type, wf.data(), w.data(), 0, c.N, c.K, nullptr) == nbytes,
                      "%s quantize", info->name);
            }
            const std::vector<float> exact = exact_mul_mat(type, c, w, x);

            ggml_backend_cpu_set_n_threads(cpu, 4);
            const std::vector<float> on_cpu = mul_mat(cpu, type, c, w, x, 0);
            runs++;
            const double e_cpu = nmse(on_cpu, exact);
            CHECK(e_cpu <= 1e-4, "CPU: %s %lldx%lldx%lld NMSE %.3g against the exact product", info->name,
                  (long long) c.K, (long long) c.N, (long long) c.M, e_cpu);
            std::printf("CPU %s K=%lld N=%lld M=%lld: NMSE vs exact %.2e\n", info->name, (long long) c.K,
                        (long long) c.N, (long long) c.M, e_cpu);
            for (ggml_backend_t b : others) {
                std::vector<float> got;
                runs++;
                if (cpu_rpc_matches(b, type, info->name, c, w, x, on_cpu, rpc_gpu, got)) {
                    continue;
                }
                const double e_exact = nmse(got, exact), e_vs_cpu = nmse(got, on_cpu);
                // up to 8 tokens a GPU runs the integer mat-vec on q8_1 activations (as the CPU on Q8_K: the
                // CPU's bound); more run cuBLAS on the dequantized weights with f32 / f16 activations
                const double bound = c.M <= 8 ? 1e-4 : 1e-5;
                CHECK(e_exact <= bound, "%s: %s %lldx%lldx%lld NMSE %.3g against the exact product",
                      ggml_backend_name(b), info->name, (long long) c.K, (long long) c.N, (long long) c.M, e_exact);
                CHECK(e_vs_cpu <= 2e-4, "%s: %s %lldx%lldx%lld NMSE %.3g against the CPU", ggml_backend_name(b),
                      info->name, (long long) c.K, (long long) c.N, (long long) c.M, e_vs_cpu);
                std::printf("%s %s K=%lld N=%lld M=%lld: NMSE vs exact %.2e, vs CPU %.2e (CPU vs exact %.2e)\n",
                            ggml_backend_name(b), info->name, (long long) c.K, (long long) c.N, (long long) c.M,
                            e_exact, e_vs_cpu, e_cpu);
            }
        }
    }
    return runs;
}

int main(int argc, char ** argv) {
    const char * rpc         = nullptr;
    bool         require_gpu = false, rpc_gpu = false;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--rpc") && i + 1 < argc) {
            rpc = argv[++i];
        } else if (!std::strcmp(argv[i], "--rpc-gpu")) {
            rpc_gpu = true;
        } else if (!std::strcmp(argv[i], "--require-gpu")) {
            require_gpu = true;
        } else {
            std::fprintf(stderr, "usage: %s [--rpc HOST:PORT [--rpc-gpu]] [--require-gpu]\n", argv[0]);
            return 2;
        }
    }
    int                         n_gpu  = 0;
    std::vector<ggml_backend_t> others = other_backends(rpc, &n_gpu);
    if (require_gpu && n_gpu == 0 && !(rpc && rpc_gpu)) {
        std::printf("SKIP: no GPU device (a build without GGML_EXT_CUDA, or no CUDA device)\n");
        return 77;
    }
    ggml_backend_t cpu = ggml_backend_cpu_init();

    int runs = 0, n_types = 0;
    for (int t = 0; t < ggml_ext_type_count(); t++) {
        const ggml_ext_type_info * info = ggml_ext_type_info_at(t);
        if (ggml_ext_base_layout_type(info->id) < 0) {
            continue;
        }
        n_types++;
        const ggml_type type = (ggml_type) info->id;
        const ggml_type base = (ggml_type) ggml_ext_base_layout_type(info->id);
        check_refusals(cpu, type);
        for (ggml_backend_t b : others) {
            check_refusals(b, type);
        }
        for (const mm_case & c : k_cases) {
            std::vector<float> wf, x;
            random_case((int) info->id, c, wf, x);
            const size_t         nbytes = ggml_row_size(type, c.K) * c.N;
            std::vector<uint8_t> w(nbytes), wb(nbytes), relaid(nbytes);
            ggml_quantize_chunk(type, wf.data(), w.data(), 0, c.N, c.K, nullptr);
            // the stock twin: the type's bytes in the base layout, and back to the same bytes
            CHECK(ggml_ext_to_base_layout(info->id, wb.data(), w.data(), c.N, c.K) == 0, "%s to_base_layout",
                  info->name);
            CHECK(ggml_ext_from_base_layout(info->id, relaid.data(), wb.data(), c.N, c.K) == 0 && relaid == w,
                  "%s %lldx%lld: from_base_layout(to_base_layout(w)) != w", info->name, (long long) c.K,
                  (long long) c.N);
            if (base == GGML_TYPE_Q4_0) {  // one rounding rule: the type's quantizer is Q4_0's, relaid out
                std::vector<uint8_t> q(nbytes);
                ggml_quantize_chunk(base, wf.data(), q.data(), 0, c.N, c.K, nullptr);
                CHECK(q == wb, "%s %lldx%lld: not the relayout of ggml's Q4_0", info->name, (long long) c.K,
                      (long long) c.N);
            }

            std::vector<float> first;
            for (int nth = 1; nth <= 4; nth += 3) {
                ggml_backend_cpu_set_n_threads(cpu, nth);
                const std::vector<float> got = mul_mat(cpu, type, c, w, x, 0);
                runs++;
                if (first.empty()) {
                    first = got;
                } else {
                    CHECK(!std::memcmp(first.data(), got.data(), got.size() * sizeof(float)),
                          "%s: CPU %d threads differ from 1", info->name, nth);
                }
            }
            {  // ggml's own CPU kernel on the base type's tensor: the same products up to float rounding
                const std::vector<float> stock = mul_mat(cpu, base, c, wb, x, 0);
                const double             e     = nmse(first, stock);
                CHECK(e <= 1e-7, "CPU: %s %lldx%lldx%lld NMSE %.3g against ggml's %s kernel", info->name,
                      (long long) c.K, (long long) c.N, (long long) c.M, e, ggml_type_name(base));
            }
            for (ggml_backend_t b : others) {
                std::vector<float> got;
                runs++;
                if (cpu_rpc_matches(b, type, info->name, c, w, x, first, rpc_gpu, got)) {
                    continue;
                }
                const std::vector<float> twin = mul_mat(b, base, c, wb, x, 0);
                CHECK(!std::memcmp(twin.data(), got.data(), got.size() * sizeof(float)),
                      "%s: %s %lldx%lldx%lld is not the %s result (NMSE %.3g)", ggml_backend_name(b), info->name,
                      (long long) c.K, (long long) c.N, (long long) c.M, ggml_type_name(base), nmse(got, twin));
                const double e = nmse(got, first);
                CHECK(e <= 5e-4, "%s: %s %lldx%lldx%lld NMSE %.3g against the CPU", ggml_backend_name(b), info->name,
                      (long long) c.K, (long long) c.N, (long long) c.M, e);
                if (c.M == 1 || c.M == 512) {
                    std::printf("%s %s K=%lld N=%lld M=%lld: NMSE vs CPU %.2e, == %s\n", ggml_backend_name(b),
                                info->name, (long long) c.K, (long long) c.N, (long long) c.M, e,
                                ggml_type_name(base));
                }
            }
            for (ggml_backend_t b : others) {
                check_readback(b, type, c, w);
            }
        }
    }
    CHECK(n_types == 6, "%d types with a stock twin", n_types);

    int       n_cb    = 0;
    const int cb_runs = check_codebook_types(cpu, others, rpc_gpu, &n_cb);
    CHECK(n_cb == 2, "%d codebook types", n_cb);

    for (ggml_backend_t b : others) {
        std::printf("backend: %s\n", ggml_backend_name(b));
        ggml_backend_free(b);
    }
    ggml_backend_free(cpu);
    std::printf("codebooks: %d mul_mat runs, %d types x %zu shapes\n", cb_runs, n_cb,
                sizeof(k_cb_cases) / sizeof(k_cb_cases[0]));
    std::printf("%s: %d mul_mat runs, %d types x %zu shapes on CPU (1, 4 threads)%s%s, %d failures\n",
                g_fails ? "FAILED" : "OK", runs, n_types, sizeof(k_cases) / sizeof(k_cases[0]), rpc ? " + RPC" : "",
                n_gpu || rpc_gpu ? " + GPU" : "", g_fails);
    return g_fails ? 1 : 0;
}
