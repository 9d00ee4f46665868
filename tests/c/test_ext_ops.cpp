// ggml-ext's ops through ggml's backend API, in the manner of llama.cpp's test-backend-ops: each case
// builds one graph and runs it on the CPU backend (checked against a double-precision reference here,
// and for the same bits with 1-4 threads), then on every other backend it is given or finds:
//   --rpc HOST:PORT   a ggml-rpc-server: its CPU backend runs the same code, so the bits must be equal
//   GPU devices       every GPU the ggml registry lists (CUDA with GGML_EXT_CUDA=ON): normalised mean
//                     squared error against the CPU at most 1e-7 (test-backend-ops' default bound; APQ_MUL_MAT
//                     above 8 tokens, f16 activations into cuBLAS: 5e-4, test-backend-ops' MUL_MAT bound),
//                     APQ weights uploaded and read back in uneven pieces; DEC_MUL_MAT's residual term alone
//                     (dst - y), r in GPU memory and in the device's pinned host buffer (zero-copy), the
//                     cooperative and the two-kernel launch, plus Llama-3-8B shapes run only with a GPU
//   --require-gpu     exit 77 (skip) when there is no GPU device
//   --large           DEC_MUL_MAT's large (GPU-only) shapes on the CPU too
// Also: the op's id, name and symbol, and supports_op refusing a malformed node on each backend.
// Built and run by tests/kernels/test_ext_ops.py and scripts/test_cuda.sh (make test-cuda).
#include "backend_test.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-ext-ops.h"
#include "ggml-rpc.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

// One col_sidecar case: y [M, n1, n2], x [K, n1, n2] (rows padded by x_pad floats when x_pad > 0,
// so x is a strided view), idx [k], s [k, M].
// The CPU result at nth threads: kept as `first` at 1 thread, else it must equal that bit for bit.
static void same_as_one_thread(const std::string & name, int nth, const std::vector<float> & got,
                               std::vector<float> & first) {
    if (nth == 1) {
        first = got;
        return;
    }
    CHECK(!std::memcmp(first.data(), got.data(), got.size() * sizeof(float)), "%s: %d threads differ from 1 thread",
          name.c_str(), nth);
}

struct sidecar_case {
    int64_t M, K, k, n1, n2, x_pad;

    std::string name() const {
        char b[96];
        std::snprintf(b, sizeof(b), "col_sidecar M=%lld K=%lld k=%lld rows=%lldx%lld%s", (long long) M, (long long) K,
                      (long long) k, (long long) n1, (long long) n2, x_pad ? " strided-x" : "");
        return b;
    }
};

struct inputs {
    std::vector<float>   y, x, s;  // x: n1*n2 rows of K + x_pad floats
    std::vector<int32_t> idx;
};

static inputs make_inputs(const sidecar_case & c, uint64_t seed) {
    rng     r{ seed };
    inputs  in;
    in.y.resize(c.M * c.n1 * c.n2);
    in.x.resize((c.K + c.x_pad) * c.n1 * c.n2);
    in.s.resize(c.k * c.M);
    for (auto & v : in.y) {
        v = r.next();
    }
    for (auto & v : in.x) {
        v = r.next() * 4.0f;
    }
    for (auto & v : in.s) {
        v = r.next() * 0.5f;
    }
    // distinct columns, spread over K, in a shuffled order (the op must not assume sorted indices)
    for (int64_t j = 0; j < c.k; j++) {
        in.idx.push_back((int32_t) ((j * 7919 + 13) % c.K));
    }
    for (int64_t j = c.k - 1; j > 0; j--) {
        const int64_t o = (int64_t) ((r.next() + 1.0f) * 0.5f * (float) (j + 1)) % (j + 1);
        std::swap(in.idx[j], in.idx[o]);
    }
    return in;
}

// dst[m, r] = y[m, r] + sum_j s[j, m] * x[idx[j], r] in double; also the bound of |terms| per output.
static void reference(const sidecar_case & c, const inputs & in, std::vector<double> & out, std::vector<double> & mag) {
    const int64_t rows = c.n1 * c.n2, xs = c.K + c.x_pad;
    out.assign(c.M * rows, 0.0);
    mag.assign(c.M * rows, 0.0);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t m = 0; m < c.M; m++) {
            double acc = in.y[r * c.M + m], a = std::fabs(acc);
            for (int64_t j = 0; j < c.k; j++) {
                const double t = (double) in.s[m * c.k + j] * in.x[r * xs + in.idx[j]];
                acc += t;
                a += std::fabs(t);
            }
            out[r * c.M + m] = acc;
            mag[r * c.M + m] = a;
        }
    }
}

struct built {
    ggml_context *        ctx;
    ggml_tensor *         y, *x, *xp, *idx, *s, *out;
    ggml_cgraph *         gf;
    ggml_backend_buffer_t buf;
};

static built build(const sidecar_case & c, ggml_backend_t backend, const inputs & in) {
    ggml_init_params ip = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    built            b{};
    b.ctx = ggml_init(ip);
    b.y   = ggml_new_tensor_3d(b.ctx, GGML_TYPE_F32, c.M, c.n1, c.n2);
    b.xp  = ggml_new_tensor_3d(b.ctx, GGML_TYPE_F32, c.K + c.x_pad, c.n1, c.n2);
    b.x   = c.x_pad ? ggml_view_3d(b.ctx, b.xp, c.K, c.n1, c.n2, b.xp->nb[1], b.xp->nb[2], 0) : b.xp;
    b.idx = ggml_new_tensor_1d(b.ctx, GGML_TYPE_I32, c.k);
    b.s   = ggml_new_tensor_2d(b.ctx, GGML_TYPE_F32, c.k, c.M);
    b.out = ggml_ext_col_sidecar(b.ctx, b.y, b.x, b.idx, b.s);
    b.gf  = ggml_new_graph(b.ctx);
    ggml_build_forward_expand(b.gf, b.out);
    b.buf = ggml_backend_alloc_ctx_tensors(b.ctx, backend);
    ggml_backend_tensor_set(b.y, in.y.data(), 0, in.y.size() * sizeof(float));
    ggml_backend_tensor_set(b.xp, in.x.data(), 0, in.x.size() * sizeof(float));
    ggml_backend_tensor_set(b.idx, in.idx.data(), 0, in.idx.size() * sizeof(int32_t));
    ggml_backend_tensor_set(b.s, in.s.data(), 0, in.s.size() * sizeof(float));
    return b;
}

static std::vector<float> run(const sidecar_case & c, ggml_backend_t backend, const inputs & in) {
    built b = build(c, backend, in);
    CHECK(ggml_backend_supports_op(backend, b.out), "%s on %s", c.name().c_str(), ggml_backend_name(backend));
    std::vector<float> out(ggml_nelements(b.out));
    CHECK(ggml_backend_graph_compute(backend, b.gf) == GGML_STATUS_SUCCESS, "%s", c.name().c_str());
    ggml_backend_tensor_get(b.out, out.data(), 0, out.size() * sizeof(float));
    ggml_backend_buffer_free(b.buf);
    ggml_free(b.ctx);
    return out;
}

// supports_op on a COL_SIDECAR node whose idx is F32: every backend must refuse it.
static void check_refuses_malformed(ggml_backend_t backend) {
    ggml_init_params ip  = { 8 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    y   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2);
    ggml_tensor *    x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 16, 2);
    ggml_tensor *    idx = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 3);
    ggml_tensor *    s   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 8);
    ggml_tensor *    bad = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2);
    bad->op              = GGML_OP_COL_SIDECAR;  // built by hand: the constructor refuses it
    bad->src[0] = y, bad->src[1] = x, bad->src[2] = idx, bad->src[3] = s;
    CHECK(ggml_ext_col_sidecar_check(bad) != nullptr, "the check names the F32 idx");
    CHECK(!ggml_backend_supports_op(backend, bad) || ggml_backend_is_rpc(backend),
          "%s accepts a col_sidecar with an F32 idx", ggml_backend_name(backend));
    ggml_free(ctx);
}

// ---- APQ_MUL_MAT: an any-precision weight (planes of parent P = 8, F16 tables of S..8) times x ----

struct apq_case {
    int64_t K, N, T;  // weight K x N (ggml: ne0 = K), T activation rows
    int     S, b;     // seed precision (tables), precision computed at

    std::string name() const {
        char s[96];
        std::snprintf(s, sizeof(s), "apq_mul_mat K=%lld N=%lld T=%lld S=%d b=%d", (long long) K, (long long) N,
                      (long long) T, S, b);
        return s;
    }
};

struct apq_inputs {
    std::vector<uint8_t>     codes, planes;  // codes: N x K 8-bit codes; planes: docs/formats/anyprec.md
    std::vector<ggml_fp16_t> tables;         // precision-major: precision p at N (2^p - 2^S)
    std::vector<float>       x;              // T x K
};

static apq_inputs apq_make(const apq_case & c, uint64_t seed) {
    rng        r{ seed };
    apq_inputs in;
    const int  P = 8;
    in.codes.resize(c.N * c.K);
    for (auto & v : in.codes) {
        v = (uint8_t) ((r.next() + 1.0f) * 128.0f);
    }
    in.planes.assign((size_t) P * c.N * c.K / 8, 0);
    for (int p = 0; p < P; p++) {
        for (int64_t row = 0; row < c.N; row++) {
            for (int64_t j = 0; j < c.K; j++) {
                const int bit = (in.codes[row * c.K + j] >> (P - 1 - p)) & 1;
                in.planes[((size_t) p * c.N + row) * (c.K / 8) + j / 8] |= (uint8_t) (bit << (j % 8));
            }
        }
    }
    for (int p = c.S; p <= P; p++) {
        for (int64_t i = 0; i < c.N * (1 << p); i++) {
            in.tables.push_back(ggml_fp32_to_fp16(r.next() * 0.25f));
        }
    }
    in.x.resize(c.T * c.K);
    for (auto & v : in.x) {
        v = r.next() * 4.0f;
    }
    return in;
}

// dst[r, t] = sum_j T_b[r][code >> (8 - b)] x[t, j] in double, and the bound of |terms| per output
static void apq_reference(const apq_case & c, const apq_inputs & in, std::vector<double> & out,
                          std::vector<double> & mag) {
    out.assign(c.N * c.T, 0.0);
    mag.assign(c.N * c.T, 0.0);
    const int64_t off = c.N * ((1 << c.b) - (1 << c.S));
    for (int64_t t = 0; t < c.T; t++) {
        for (int64_t row = 0; row < c.N; row++) {
            double acc = 0, a = 0;
            for (int64_t j = 0; j < c.K; j++) {
                const int    code = in.codes[row * c.K + j] >> (8 - c.b);
                const double w    = ggml_fp16_to_fp32(in.tables[off + row * (1 << c.b) + code]);
                acc += w * in.x[t * c.K + j];
                a += std::fabs(w * in.x[t * c.K + j]);
            }
            out[t * c.N + row] = acc;
            mag[t * c.N + row] = a;
        }
    }
}

// One run of c on `backend`; false when the backend refuses the node (asked after the tensors are in its
// buffers: CUDA takes the op only when the weight and its tables sit in its own memory). With `pieces`, the
// weight goes up in three uneven pieces (word-unaligned cuts) and is read back in three others, which must
// give the file's bytes again (a CUDA buffer holds the row-lane layout and converts on the way in and out).
static bool apq_run(const apq_case & c, ggml_backend_t backend, const apq_inputs & in, std::vector<float> & out,
                    bool pieces = false) {
    ggml_init_params ip  = { 8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    w   = ggml_new_tensor_2d(ctx, GGML_TYPE_APQ, c.K, c.N);
    ggml_tensor *    tab = ggml_new_tensor_1d(ctx, GGML_TYPE_F16, (int64_t) in.tables.size());
    ggml_tensor *    x   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.K, c.T);
    CHECK(ggml_ext_anyprec_seed_bits(w, tab) == c.S && ggml_ext_anyprec_parent_bits(GGML_TYPE_APQ) == 8, "%s: S, P",
          c.name().c_str());
    ggml_tensor * y  = ggml_ext_apq_mul_mat(ctx, w, x, tab, c.b);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    CHECK(ggml_nbytes(w) == in.planes.size(), "%s: APQ bytes %zu", c.name().c_str(), ggml_nbytes(w));
    const size_t n = in.planes.size(), cut[4] = { 0, n / 3 + 1, 2 * n / 3 + 3, n };
    if (pieces) {
        for (int i = 0; i < 3; i++) {
            ggml_backend_tensor_set(w, in.planes.data() + cut[i], cut[i], cut[i + 1] - cut[i]);
        }
        std::vector<uint8_t> back(n);
        const size_t         rcut[4] = { 0, 5, n / 2 + 2, n };
        for (int i = 0; i < 3; i++) {
            ggml_backend_tensor_get(w, back.data() + rcut[i], rcut[i], rcut[i + 1] - rcut[i]);
        }
        CHECK(back == in.planes, "%s: %s reads back other bytes than were written", c.name().c_str(),
              ggml_backend_name(backend));
    } else {
        ggml_backend_tensor_set(w, in.planes.data(), 0, n);
    }
    ggml_backend_tensor_set(tab, in.tables.data(), 0, in.tables.size() * sizeof(ggml_fp16_t));
    ggml_backend_tensor_set(x, in.x.data(), 0, in.x.size() * sizeof(float));
    const bool ok = ggml_backend_supports_op(backend, y);
    if (ok) {
        CHECK(ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS, "%s", c.name().c_str());
        out.resize(ggml_nelements(y));
        ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return ok;
}

// T <= 8: the bitplane GEMV per token; more: dequantized row blocks (src/ops/apq_mul_mat_cpu.c)
static const apq_case k_apq_cases[] = {
    { 32, 5, 1, 3, 3 },      // one block, one token, the seed precision
    { 576, 40, 8, 3, 4 },    // SmolLM2's width, the largest GEMV batch
    { 576, 37, 9, 3, 8 },    // the smallest dequantized batch, the parent precision
    { 1536, 20, 33, 3, 5 },  // SmolLM2's down rows, rows not a multiple of the 16-row block
    { 96, 3, 4, 6, 7 },      // seed 6, fewer rows than threads
};

// Every precision 3..8 at every path of the CUDA op (src/cuda/apq_mul_mat.cu): 1 token (v4 GEMV), 2 / 5 / 8
// (v8), 9 / 33 (dequantize + cuBLAS); row counts not a multiple of the 32-row group, row lengths a multiple
// of 128 (1536) and not (576, 352: the row-lane layout pads them), seeds 3 and 4.
static std::vector<apq_case> apq_sweep() {
    static const int64_t T[] = { 1, 2, 5, 8, 9, 33 };
    static const int64_t K[] = { 576, 1536, 352 };
    static const int64_t N[] = { 37, 65, 7, 33 };
    std::vector<apq_case> v;
    int                   i = 0;
    for (int b = 3; b <= 8; b++) {
        for (int64_t t : T) {
            v.push_back({ K[i % 3], N[i % 4], t, b >= 4 && i % 2 ? 4 : 3, b });
            i++;
        }
    }
    return v;
}

// ---- DEC_MUL_MAT: dynamic error compensation, dst = y + scales . R[:, sel(x)] x[sel(x)] per row ----

struct dec_case {
    int64_t M, K, T;
    int     k_chunk, mode;  // GGML_EXT_QDEC_APPROX / GGML_EXT_QDEC_EXACT
    int     n_tb     = 0;      // the CUDA kernel's GEMV blocks (0: the backend's choice)
    bool    gpu_only = false;  // a large shape: only where a GPU runs it too (keeps the CPU-only run fast)

    std::string name() const {
        char s[112];
        std::snprintf(s, sizeof(s), "dec_mul_mat M=%lld K=%lld T=%lld k_chunk=%d %s", (long long) M, (long long) K,
                      (long long) T, k_chunk, mode == GGML_EXT_QDEC_EXACT ? "exact" : "approx");
        std::string n = s;
        if (n_tb) {
            n += " n_tb=" + std::to_string(n_tb);
        }
        return n;
    }
};

struct dec_inputs {
    std::vector<float>   y, x, scales;  // x: T rows of K
    std::vector<uint8_t> r;             // K rows of (M+1)/2 bytes
    std::vector<int8_t>  q;             // M x K codes, -7..7
    float                b0, b15;
};

static dec_inputs dec_make(const dec_case & c, uint64_t seed) {
    rng        g{ seed };
    dec_inputs in;
    in.y.resize(c.M * c.T);
    for (auto & v : in.y) {
        v = g.next();
    }
    in.x.resize(c.K * c.T);
    for (auto & v : in.x) {
        v = g.next() * 2.0f;
        if (g.next() > 0.97f) {
            v *= 8.0f;  // a few outliers: the upper buckets and values past b0
        }
    }
    in.b0  = 12.0f;
    in.b15 = 1.6f;
    in.q.resize(c.M * c.K);
    const int64_t rb = (c.M + 1) / 2;
    in.r.assign(rb * c.K, 0x88);
    for (int64_t m = 0; m < c.M; m++) {
        for (int64_t j = 0; j < c.K; j++) {
            const int q = (int) std::lround(g.next() * 7.0f);
            in.q[m * c.K + j] = (int8_t) q;
            uint8_t & b       = in.r[j * rb + m / 2];
            b = (m & 1) ? (uint8_t) ((b & 0x0f) | ((q + 8) << 4)) : (uint8_t) ((b & 0xf0) | (q + 8));
        }
    }
    in.scales.resize(c.M);
    for (auto & v : in.scales) {
        v = 0.01f + 0.05f * std::fabs(g.next());
    }
    return in;
}

// The channels of one row, written apart from the library: order every channel of a chunk by a key and
// take the first k. exact: (|x| descending, index); approximate: (bucket, index), the bucket of |x| from
// the paper's 32 boundaries (16 over [b15, b0], 16 over [0, b15)).
static int dec_ref_bucket(float v, float b0, float b15) {
    if (!(v > 0.0f)) {
        return 31;
    }
    if (v >= b15) {
        const float t = (v - b15) / (b0 - b15) * 16.0f;
        return 15 - (t >= 15.0f ? 15 : (int) std::floor(t));
    }
    const float t = v / b15 * 16.0f;
    return 31 - (t >= 15.0f ? 15 : (int) std::floor(t));
}

static std::vector<int64_t> dec_ref_select(const dec_case & c, const float * x, float b0, float b15) {
    std::vector<int64_t> sel;
    for (int64_t c0 = 0; c0 < c.K; c0 += GGML_EXT_QDEC_CHUNK) {
        const int64_t        L = std::min<int64_t>(GGML_EXT_QDEC_CHUNK, c.K - c0);
        std::vector<int64_t> order(L);
        for (int64_t j = 0; j < L; j++) {
            order[j] = c0 + j;
        }
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
            if (c.mode == GGML_EXT_QDEC_EXACT) {
                return std::fabs(x[a]) > std::fabs(x[b]);
            }
            return dec_ref_bucket(std::fabs(x[a]), b0, b15) < dec_ref_bucket(std::fabs(x[b]), b0, b15);
        });
        order.resize(std::min<int64_t>(std::max(c.k_chunk, 0), L));
        std::sort(order.begin(), order.end());
        sel.insert(sel.end(), order.begin(), order.end());
    }
    return sel;
}

static void dec_reference(const dec_case & c, const dec_inputs & in, std::vector<double> & out,
                          std::vector<double> & mag) {
    out.assign(c.M * c.T, 0.0);
    mag.assign(c.M * c.T, 0.0);
    for (int64_t t = 0; t < c.T; t++) {
        const float *              x   = in.x.data() + t * c.K;
        const std::vector<int64_t> sel = dec_ref_select(c, x, in.b0, in.b15);
        // the library's selection of this row is the same list
        std::vector<int32_t> lib(c.K);
        const int64_t        n = ggml_ext_qdec_select(x, c.K, c.k_chunk, (ggml_ext_qdec_mode) c.mode, in.b0, in.b15,
                                                      lib.data());
        CHECK(n == (int64_t) sel.size(), "%s: row %lld selects %lld channels, want %zu", c.name().c_str(),
              (long long) t, (long long) n, sel.size());
        for (int64_t i = 0; i < n && i < (int64_t) sel.size(); i++) {
            CHECK(lib[i] == sel[i], "%s: row %lld channel %lld: %d, want %lld", c.name().c_str(), (long long) t,
                  (long long) i, lib[i], (long long) sel[i]);
        }
        for (int64_t m = 0; m < c.M; m++) {
            double acc = 0, a = 0;
            for (int64_t j : sel) {
                const double v = (double) in.q[m * c.K + j] * x[j];
                acc += v;
                a += std::fabs(v);
            }
            out[t * c.M + m] = in.y[t * c.M + m] + in.scales[m] * acc;
            mag[t * c.M + m] = std::fabs(in.y[t * c.M + m]) + in.scales[m] * a;
        }
    }
}

// One run of c on `backend`. host_r: the residual r in the device's host buffer (for CUDA: pinned host
// memory the kernel reads zero-copy, as at run time) instead of the backend's own memory.
static bool dec_run(const dec_case & c, ggml_backend_t backend, const dec_inputs & in, std::vector<float> & out,
                    bool host_r = false) {
    ggml_init_params ip    = { 8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context *   ctx   = ggml_init(ip);
    ggml_context *   ctx_r = ggml_init(ip);
    ggml_tensor *    y     = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.M, c.T);
    ggml_tensor *    x     = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.K, c.T);
    ggml_tensor *    r     = ggml_new_tensor_2d(host_r ? ctx_r : ctx, GGML_TYPE_I8, (c.M + 1) / 2, c.K);
    ggml_tensor *    s     = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.M);
    ggml_tensor * d  = ggml_ext_dec_mul_mat(ctx, y, x, r, s, c.k_chunk, (ggml_ext_qdec_mode) c.mode, in.b0, in.b15);
    ggml_ext_dec_mul_mat_set_n_tb(d, c.n_tb);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, d);
    if (!ggml_backend_supports_op(backend, d)) {
        ggml_free(ctx);
        ggml_free(ctx_r);
        return false;
    }
    ggml_backend_buffer_t buf   = ggml_backend_alloc_ctx_tensors(ctx, backend);
    ggml_backend_buffer_t buf_r = nullptr;
    if (host_r) {
        ggml_backend_buffer_type_t hb = ggml_backend_dev_host_buffer_type(ggml_backend_get_device(backend));
        CHECK(hb != nullptr, "%s: %s has no host buffer type", c.name().c_str(), ggml_backend_name(backend));
        if (!hb) {
            ggml_backend_buffer_free(buf);
            ggml_free(ctx);
            ggml_free(ctx_r);
            return false;
        }
        buf_r = ggml_backend_alloc_ctx_tensors_from_buft(ctx_r, hb);
    }
    ggml_backend_tensor_set(y, in.y.data(), 0, in.y.size() * sizeof(float));
    ggml_backend_tensor_set(x, in.x.data(), 0, in.x.size() * sizeof(float));
    ggml_backend_tensor_set(r, in.r.data(), 0, in.r.size());
    ggml_backend_tensor_set(s, in.scales.data(), 0, in.scales.size() * sizeof(float));
    CHECK(ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS, "%s", c.name().c_str());
    out.resize(ggml_nelements(d));
    ggml_backend_tensor_get(d, out.data(), 0, out.size() * sizeof(float));
    ggml_backend_buffer_free(buf);
    if (buf_r) {
        ggml_backend_buffer_free(buf_r);
    }
    ggml_free(ctx);
    ggml_free(ctx_r);
    return true;
}

// the bucket boundaries as the paper draws them (Fig. 9), and a malformed node refused
static void dec_check_buckets_and_refusal(ggml_backend_t backend) {
    CHECK(ggml_ext_qdec_bucket(20.0f, 12.0f, 1.6f) == 0 && ggml_ext_qdec_bucket(11.99f, 12.0f, 1.6f) == 0,
          "past b0 and just under it: the top bucket");
    CHECK(ggml_ext_qdec_bucket(1.6f, 12.0f, 1.6f) == 15 && ggml_ext_qdec_bucket(1.59f, 12.0f, 1.6f) == 16,
          "b15 opens bucket 15, just under it is bucket 16");
    CHECK(ggml_ext_qdec_bucket(0.05f, 12.0f, 1.6f) == 31 && ggml_ext_qdec_bucket(0.0f, 12.0f, 1.6f) == 31 &&
              ggml_ext_qdec_bucket(NAN, 12.0f, 1.6f) == 31,
          "below b15/16, zero and NaN: the bottom bucket");
    ggml_init_params ip  = { 8 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *   ctx = ggml_init(ip);
    ggml_tensor *    bad = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2);
    bad->op              = GGML_OP_DEC_MUL_MAT;
    bad->src[0]          = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2);
    bad->src[1]          = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 16, 2);
    bad->src[2]          = ggml_new_tensor_2d(ctx, GGML_TYPE_I8, 8, 16);  // M bytes, not M/2
    bad->src[3]          = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 8);
    CHECK(ggml_ext_dec_mul_mat_check(bad) != nullptr, "the check names r's shape");
    CHECK(!ggml_backend_supports_op(backend, bad) || ggml_backend_is_rpc(backend),
          "%s accepts a dec_mul_mat with a wrong r", ggml_backend_name(backend));
    ggml_free(ctx);
}

static const dec_case k_dec_cases[] = {
    { 8, 16, 1, 3, GGML_EXT_QDEC_APPROX },        // one token (decode), one short chunk
    { 576, 576, 4, 16, GGML_EXT_QDEC_APPROX },    // SmolLM2's width
    { 301, 1536, 3, 32, GGML_EXT_QDEC_APPROX },   // odd M, two chunks (1024 + 512): SmolLM2's down_proj
    { 64, 2500, 2, 64, GGML_EXT_QDEC_EXACT },     // the exact top-k, three chunks, the last 452 wide
    { 96, 96, 5, 200, GGML_EXT_QDEC_APPROX },     // k_chunk past the chunk: every channel
    { 32, 48, 2, 0, GGML_EXT_QDEC_EXACT },        // k_chunk 0: dst = y
    { 4096, 4096, 1, 16, GGML_EXT_QDEC_APPROX, 0, true },  // Llama-3-8B's q/o at one token (decode)
    { 4096, 4096, 1, 16, GGML_EXT_QDEC_EXACT, 0, true },
    { 1024, 4096, 1, 8, GGML_EXT_QDEC_APPROX, 0, true },   // its k/v
    { 1024, 4096, 1, 64, GGML_EXT_QDEC_EXACT, 0, true },
    { 14336, 4096, 1, 64, GGML_EXT_QDEC_APPROX, 0, true },  // gate/up
    { 14336, 4096, 1, 8, GGML_EXT_QDEC_EXACT, 1, true },    // one GEMV block: a lane walks the 448 pieces
    { 4096, 14336, 1, 16, GGML_EXT_QDEC_APPROX, 0, true },  // down: 14 chunks
    { 4096, 14336, 1, 64, GGML_EXT_QDEC_EXACT, 0, true },
    { 4096, 14336, 1, 0, GGML_EXT_QDEC_APPROX, 0, true },   // k_chunk 0 at a large shape: dst = y
    { 4095, 4100, 1, 16, GGML_EXT_QDEC_APPROX, 7, true },   // odd M (last nibble unused), a 4-wide last chunk
    { 1000, 3000, 1, 64, GGML_EXT_QDEC_APPROX, 3, true },   // rows of 500 bytes: the byte-wise loads
    { 1000, 3000, 3, 8, GGML_EXT_QDEC_EXACT, 0, true },     // a few tokens
    { 301, 1536, 2, 16, GGML_EXT_QDEC_EXACT, 2, true },
};

static const sidecar_case k_cases[] = {
    { 8, 16, 3, 1, 1, 0 },        // one token (decode)
    { 64, 96, 5, 7, 1, 0 },       // a few tokens
    { 576, 576, 16, 9, 2, 0 },    // SmolLM2's width, batched planes
    { 300, 1536, 40, 33, 1, 5 },  // M not a multiple of the CUDA block, strided x
    { 257, 64, 1, 2, 3, 3 },      // one column
    { 32, 48, 0, 4, 1, 0 },       // no column: dst = y
};

int main(int argc, char ** argv) {
    const char * rpc         = nullptr;
    bool         require_gpu = false;
    bool         large       = false;  // DEC's GPU-only shapes on the CPU too (without a GPU)
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--rpc") && i + 1 < argc) {
            rpc = argv[++i];
        } else if (!std::strcmp(argv[i], "--require-gpu")) {
            require_gpu = true;
        } else if (!std::strcmp(argv[i], "--large")) {
            large = true;
        } else {
            std::fprintf(stderr, "usage: %s [--rpc HOST:PORT] [--require-gpu] [--large]\n", argv[0]);
            return 2;
        }
    }

    // the op's identity: a real id after upstream's ops, its name and symbol from ggml-ext-ops.def
    CHECK(GGML_OP_COUNT == GGML_OP_GLU + 1 + GGML_EXT_OP_COUNT, "GGML_OP_COUNT %d", (int) GGML_OP_COUNT);
    CHECK(GGML_OP_COL_SIDECAR > GGML_OP_GLU && ggml_ext_is_ext_op(GGML_OP_COL_SIDECAR), "id %d", (int) GGML_OP_COL_SIDECAR);
    CHECK(!ggml_ext_is_ext_op(GGML_OP_GLU) && !ggml_ext_is_ext_op(GGML_OP_COUNT), "only ggml-ext's ids");
    CHECK(!std::strcmp(ggml_op_name(GGML_OP_COL_SIDECAR), "COL_SIDECAR"), "%s", ggml_op_name(GGML_OP_COL_SIDECAR));
    CHECK(!std::strcmp(ggml_op_symbol(GGML_OP_COL_SIDECAR), "y+S*x[idx]"), "%s", ggml_op_symbol(GGML_OP_COL_SIDECAR));

    int                         n_gpu  = 0;
    std::vector<ggml_backend_t> others = other_backends(rpc, &n_gpu);
    if (require_gpu && n_gpu == 0) {
        std::printf("SKIP: no GPU device (a build without GGML_EXT_CUDA, or no CUDA device)\n");
        return 77;
    }

    ggml_backend_t cpu = ggml_backend_cpu_init();
    check_refuses_malformed(cpu);
    for (ggml_backend_t b : others) {
        check_refuses_malformed(b);
    }

    int runs = 0;
    for (const sidecar_case & c : k_cases) {
        const inputs        in = make_inputs(c, 1234 + c.M * 31 + c.k);
        std::vector<double> ref, mag;
        reference(c, in, ref, mag);

        std::vector<float> first;
        for (int nth = 1; nth <= 4; nth++) {
            ggml_backend_cpu_set_n_threads(cpu, nth);
            const std::vector<float> got = run(c, cpu, in);
            runs++;
            double worst = 0;
            for (size_t i = 0; i < got.size(); i++) {
                // float sums of k + 1 terms: a few ulps of the largest partial sum
                worst = std::fmax(worst, std::fabs(got[i] - ref[i]) / (mag[i] * 1e-6 * (c.k + 1) + 1e-30));
            }
            CHECK(worst <= 1.0, "%s: CPU (%d threads) off the reference by %.3g of the bound", c.name().c_str(), nth, worst);
            same_as_one_thread(c.name(), nth, got, first);
        }
        for (ggml_backend_t b : others) {
            const std::vector<float> got = run(c, b, in);
            runs++;
            if (ggml_backend_is_rpc(b)) {
                CHECK(!std::memcmp(first.data(), got.data(), got.size() * sizeof(float)),
                      "%s: %s differs from the local CPU backend", c.name().c_str(), ggml_backend_name(b));
            } else {
                double err = 0, norm = 0;
                for (size_t i = 0; i < got.size(); i++) {
                    err += ((double) got[i] - first[i]) * ((double) got[i] - first[i]);
                    norm += (double) first[i] * first[i];
                }
                CHECK(err / norm <= 1e-7, "%s: %s NMSE %.3g against the CPU", c.name().c_str(), ggml_backend_name(b),
                      err / norm);
            }
        }
    }

    std::vector<apq_case> apq_cases(std::begin(k_apq_cases), std::end(k_apq_cases));
    for (const apq_case & c : apq_sweep()) {
        apq_cases.push_back(c);
    }
    int apq_runs = 0, apq_gpu_runs = 0;
    for (const apq_case & c : apq_cases) {
        const apq_inputs    in = apq_make(c, 99 + c.K * 7 + c.N + c.T * 131 + c.b);
        std::vector<double> ref, mag;
        apq_reference(c, in, ref, mag);
        std::vector<float> first, got;
        for (int nth = 1; nth <= 4; nth++) {
            ggml_backend_cpu_set_n_threads(cpu, nth);
            CHECK(apq_run(c, cpu, in, got), "%s: the CPU backend refuses it", c.name().c_str());
            apq_runs++;
            double worst = 0;
            for (size_t i = 0; i < got.size(); i++) {
                worst = std::fmax(worst, std::fabs(got[i] - ref[i]) / (mag[i] * 1e-6 * (double) c.K + 1e-30));
            }
            CHECK(worst <= 1.0, "%s: CPU (%d threads) off the reference by %.3g of the bound", c.name().c_str(), nth,
                  worst);
            same_as_one_thread(c.name(), nth, got, first);
        }
        for (ggml_backend_t b : others) {
            const bool rpc = ggml_backend_is_rpc(b);
            if (!apq_run(c, b, in, got, !rpc)) {
                CHECK(false, "%s: %s refuses it", c.name().c_str(), ggml_backend_name(b));
                continue;
            }
            apq_runs++;
            if (rpc) {
                CHECK(!memcmp(first.data(), got.data(), got.size() * sizeof(float)),
                      "%s: %s differs from the local CPU backend", c.name().c_str(), ggml_backend_name(b));
                continue;
            }
            // GPU: the GEMVs (up to 8 tokens) sum the same f32 products in another order: test-backend-ops'
            // default bound; above 8 tokens cuBLAS multiplies the activations rounded to f16, as ggml-cuda's
            // own cuBLAS path for quantized weights: test-backend-ops' MUL_MAT bound
            apq_gpu_runs++;
            double err = 0, norm = 0;
            for (size_t i = 0; i < got.size(); i++) {
                err += ((double) got[i] - first[i]) * ((double) got[i] - first[i]);
                norm += (double) first[i] * first[i];
            }
            const double bound = c.T <= 8 ? 1e-7 : 5e-4;
            CHECK(err / norm <= bound, "%s: %s NMSE %.3g against the CPU (bound %.0e)", c.name().c_str(),
                  ggml_backend_name(b), err / norm, bound);
        }
    }
    std::printf("APQ: %d runs of %zu cases\n", apq_runs, apq_cases.size());
    if (n_gpu) {
        std::printf("APQ GPU: %d runs of %zu cases\n", apq_gpu_runs, apq_cases.size());
    } else {
        std::printf("APQ GPU: skipped (no GPU device: a build without GGML_EXT_CUDA, or no CUDA device)\n");
    }

    dec_check_buckets_and_refusal(cpu);
    for (ggml_backend_t b : others) {
        dec_check_buckets_and_refusal(b);
    }
    int dec_runs = 0, dec_gpu_runs = 0, dec_cases = 0;
    for (const dec_case & c : k_dec_cases) {
        if (c.gpu_only && n_gpu == 0 && !large) {
            continue;
        }
        dec_cases++;
        const dec_inputs    in = dec_make(c, 7 + c.K * 3 + c.M);
        std::vector<double> ref, mag;
        dec_reference(c, in, ref, mag);
        std::vector<float> first, got;
        for (int nth = 1; nth <= 4; nth++) {
            ggml_backend_cpu_set_n_threads(cpu, nth);
            CHECK(dec_run(c, cpu, in, got), "%s: the CPU backend refuses it", c.name().c_str());
            dec_runs++;
            double worst = 0;
            for (size_t i = 0; i < got.size(); i++) {
                worst = std::fmax(worst, std::fabs(got[i] - ref[i]) / (mag[i] * 1e-6 * (double) (c.K + 1) + 1e-30));
            }
            CHECK(worst <= 1.0, "%s: CPU (%d threads) off the reference by %.3g of the bound", c.name().c_str(), nth,
                  worst);
            same_as_one_thread(c.name(), nth, got, first);
        }
        for (ggml_backend_t b : others) {
            if (ggml_backend_is_rpc(b)) {
                CHECK(dec_run(c, b, in, got), "%s: RPC refuses it", c.name().c_str());
                dec_runs++;
                CHECK(!memcmp(first.data(), got.data(), got.size() * sizeof(float)),
                      "%s: %s differs from the local CPU backend", c.name().c_str(), ggml_backend_name(b));
                continue;
            }
            // GPU (src/cuda/dec_mul_mat.cu): r in GPU memory and in pinned host memory (zero-copy), each with
            // the cooperative (grid.sync) and the two-kernel launch. The residual term alone (dst - y) is
            // compared: a channel selected other than the CPU's shows there, not hidden under y. The sums
            // differ from the CPU's only in order (atomics): test-backend-ops' default bound.
            for (int host_r = 0; host_r <= 1; host_r++) {
                for (const char * launch : { "coop", "split", "onepass" }) {
                    if (!std::strcmp(launch, "onepass") && c.mode == GGML_EXT_QDEC_EXACT) {
                        continue;  // the one-pass kernel takes the approximate selection only
                    }
                    setenv("GGML_EXT_DEC_LAUNCH", launch, 1);
                    const bool ok = dec_run(c, b, in, got, host_r != 0);
                    unsetenv("GGML_EXT_DEC_LAUNCH");
                    CHECK(ok, "%s: %s refuses it", c.name().c_str(), ggml_backend_name(b));
                    if (!ok) {
                        continue;
                    }
                    dec_runs++;
                    dec_gpu_runs++;
                    double err = 0, norm = 0;
                    for (size_t i = 0; i < got.size(); i++) {
                        const double want = (double) first[i] - in.y[i], have = (double) got[i] - in.y[i];
                        err += (have - want) * (have - want);
                        norm += want * want;
                    }
                    const double nmse = norm > 0 ? err / norm : err;
                    CHECK(nmse <= 1e-7, "%s: %s (r in %s memory, %s launch) residual NMSE %.3g against the CPU",
                          c.name().c_str(), ggml_backend_name(b), host_r ? "pinned host" : "GPU", launch, nmse);
                }
            }
        }
    }
    std::printf("DEC: %d runs of %d cases\n", dec_runs, dec_cases);
    if (n_gpu) {
        std::printf("DEC GPU: %d runs of %d cases (r in GPU and pinned host memory, cooperative, two-kernel and "
                    "one-pass launch)\n", dec_gpu_runs, dec_cases);
    } else {
        std::printf("DEC GPU: skipped (no GPU device)%s\n", large ? "" : ", the large shapes with it");
    }

    for (ggml_backend_t b : others) {
        std::printf("backend: %s\n", ggml_backend_name(b));
        ggml_backend_free(b);
    }
    ggml_backend_free(cpu);
    std::printf("%s: %d runs of %zu cases on CPU (1-4 threads)%s%s, %d failures\n", g_fails ? "FAILED" : "OK", runs,
                sizeof(k_cases) / sizeof(k_cases[0]), rpc ? " + RPC" : "", n_gpu ? " + GPU" : "", g_fails);
    return g_fails ? 1 : 0;
}
