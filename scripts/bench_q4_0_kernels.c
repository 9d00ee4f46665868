// Microbenchmark of the interleaved Q4_0 kernels (--family iq4_nl: the interleaved
// IQ4_NL kernels, against ggml's plain and runtime-repacked IQ4_NL), one thread: GEMV (one token) and GEMM
// (--tokens, default 512) on Llama-like weight shapes, for every compiled-in
// implementation and layout of ours, and, built with -DWITH_GGML against our installed
// ggml, for ggml's own paths through the public graph API: plain Q4_0 (vec_dot) and the
// CPU_REPACK buffer (runtime repack to the interleaved layout its CPU prefers).
//
// GEMV: GB/s of weight bytes (M*K*18/32) per kernel call; GEMM: GOPS = 2*M*K*T / time.
// Ours time the kernel alone; ggml's time the whole mul_mat node, which also quantizes
// the activations to Q8_0 (about K*T floats: small next to the weights for GEMV, a few
// percent for GEMM). The scalar reference's GEMM runs on 4 tokens (its rate does not
// depend on the token count). Reported time: the best of --reps runs after a warm-up (the
// machines this runs on are shared; the minimum is the least disturbed run).
//
// Built with -DWITH_UPSTREAM and linked with the pinned llama.cpp tree's own
// ggml/src/ggml-cpu/arch/x86/repack.cpp (compiled unmodified, same -march), it also times
// upstream's Q4_0_8_8 (or IQ4_NL 8x8) kernels on the very same interleaved bytes (x86
// upstream has no 4x4/4x8 kernels) and checks that their outputs agree with ours.
//
// Built and run by scripts/bench_q4_0_kernels.py.
#define _POSIX_C_SOURCE 199309L  // clock_gettime under -std=c11
#include "iq4_nl_interleaved.h"
#include "q4_0_interleaved_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef WITH_GGML
#    include "ggml-alloc.h"
#    include "ggml-backend.h"
#    include "ggml-cpu.h"
#    include "ggml.h"
#endif

#ifdef WITH_UPSTREAM
// from the pinned tree's arch/x86/repack.cpp, and the fp16 tables its object refers to
void  ggml_gemv_q4_0_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void  ggml_gemm_q4_0_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void  ggml_gemv_iq4_nl_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void  ggml_gemm_iq4_nl_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[1 << 8];
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static uint64_t rng = 88172645463325252ull;

static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void * xmalloc(size_t n) {
    void * p = malloc(n);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

typedef void (*bench_fn)(void * ctx);

// max |a - b| over max |b|
static double max_rel_diff(const float * a, const float * b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double) a[i] - b[i]));
        mb = fmax(mb, fabs((double) b[i]));
    }
    return mb > 0 ? md / mb : md;
}

static double best_time(bench_fn fn, void * ctx, int reps) {
    double t[64];
    if (reps > 64) {
        reps = 64;
    }
    fn(ctx);  // warm-up
    for (int i = 0; i < reps; i++) {
        const double t0 = now();
        fn(ctx);
        t[i] = now() - t0;
    }
    qsort(t, (size_t) reps, sizeof(double), cmp_double);
    return t[0];
}

typedef struct {
    ggml_ext_q4_0_mm_fn fn;
    int                 K, M, T;
    float *             out;
    const void *        w, *a;
} ours_ctx;

static void run_ours(void * p) {
    ours_ctx * c = (ours_ctx *) p;
    c->fn(c->K, c->out, (size_t) c->M, c->w, c->a, c->T, c->M);
}

static void print_row(const char * shape, const char * what, double gemv_s, double bytes, double gemm_s, double ops) {
    printf("| %s | %s | %.3f | %.1f | ", shape, what, gemv_s * 1e3, bytes / gemv_s * 1e-9);
    if (gemm_s > 0) {
        printf("%.1f | %.1f |\n", gemm_s * 1e3, ops / gemm_s * 1e-9);
    } else {
        printf("- | - |\n");
    }
    fflush(stdout);
}

#ifdef WITH_GGML
typedef struct {
    ggml_backend_t       backend;
    struct ggml_cgraph * graph;
} ggml_ctx;

static void run_ggml(void * p) {
    ggml_ctx * c = (ggml_ctx *) p;
    ggml_backend_graph_compute(c->backend, c->graph);
}

static ggml_backend_buffer_type_t repack_buft(void) {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get ? get(dev) : NULL; b && *b; b++) {
        if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK")) {
            return *b;
        }
    }
    return NULL;
}

// Time of ggml_mul_mat(W (type, M x K, in buft), X (f32, T x K)) on one CPU thread.
static double time_ggml(enum ggml_type type, ggml_backend_buffer_type_t buft, const ggml_ext_block_q4_0 * w, const float * x, int K, int M,
                        int T, int reps) {
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, 1);
    struct ggml_init_params ip = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), NULL, true };
    struct ggml_context *   cw = ggml_init(ip);
    struct ggml_context *   cx = ggml_init(ip);
    struct ggml_tensor *    W  = ggml_new_tensor_2d(cw, type, K, M);
    struct ggml_tensor *    X  = ggml_new_tensor_2d(cx, GGML_TYPE_F32, K, T);
    struct ggml_tensor *    Y  = ggml_mul_mat(cx, W, X);
    struct ggml_cgraph *    gf = ggml_new_graph(cx);
    ggml_build_forward_expand(gf, Y);
    ggml_backend_buffer_t bw = ggml_backend_alloc_ctx_tensors_from_buft(cw, buft);
    ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, backend);
    ggml_backend_buffer_set_usage(bw, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_tensor_set(W, w, 0, ggml_nbytes(W));  // CPU_REPACK repacks here
    ggml_backend_tensor_set(X, x, 0, ggml_nbytes(X));
    ggml_ctx     c = { backend, gf };
    const double t = best_time(run_ggml, &c, reps);
    ggml_backend_buffer_free(bw);
    ggml_backend_buffer_free(bx);
    ggml_free(cw);
    ggml_free(cx);
    ggml_backend_free(backend);
    return t;
}
#endif

int main(int argc, char ** argv) {
    int tokens = 512, reps = 7, gemm_reps = 3;
    int shapes[8][2] = { { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 }, { 14336, 4096 } };  // M (rows) x K
    int n_shapes     = 4;
    int fam0 = 0, fam1 = 0;  // --family: q4_0 (0), iq4_nl (1) or both (0 and 1, same run)
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            tokens = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--family") && i + 1 < argc) {
            i++;
            fam0 = !strcmp(argv[i], "iq4_nl");
            fam1 = strcmp(argv[i], "q4_0") != 0;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--gemm-reps") && i + 1 < argc) {
            gemm_reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {  // MxK, repeatable, replaces the defaults
            static int custom = 0;
            if (!custom) {
                n_shapes = 0;
                custom   = 1;
            }
            if (n_shapes < 8 && sscanf(argv[++i], "%dx%d", &shapes[n_shapes][0], &shapes[n_shapes][1]) == 2) {
                n_shapes++;
            }
        } else {
            fprintf(stderr, "usage: %s [--family q4_0|iq4_nl|both] [--tokens T] [--reps R] [--gemm-reps R] [--shape MxK ...]\n", argv[0]);
            return 2;
        }
    }
    tokens = (tokens + 3) / 4 * 4;
#ifdef WITH_UPSTREAM
    for (int h = 0; h < (1 << 16); h++) {
        ggml_table_f32_f16[h] = ggml_ext_fp16_to_fp32((ggml_ext_fp16_t) h);
    }
#endif

    printf("| shape (M x K) | kernel | GEMV ms | GEMV GB/s | GEMM ms (%d tok) | GEMM GOPS |\n", tokens);
    printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
    for (int si = 0; si < n_shapes; si++) {
        const int M = shapes[si][0], K = shapes[si][1], nb = K / 32;
        char      shape[32];
        snprintf(shape, sizeof(shape), "%d x %d", M, K);
        const size_t          nblk = (size_t) M * nb;
        ggml_ext_block_q4_0 * w    = xmalloc(nblk * sizeof(*w));
        uint8_t *             wi   = xmalloc(nblk * sizeof(*w));
        for (size_t i = 0; i < nblk; i++) {
            w[i].d = ggml_ext_fp32_to_fp16((float) (rnd() % 1000 + 1) * 1e-5f);
            for (int j = 0; j < 16; j++) {
                w[i].qs[j] = (uint8_t) rnd();
            }
        }
        float * x = xmalloc((size_t) tokens * K * sizeof(float));
        for (size_t i = 0; i < (size_t) tokens * K; i++) {
            x[i] = (float) ((int) (rnd() % 2001) - 1000) * 1e-3f;
        }
        ggml_ext_block_q8_0 *   a1  = xmalloc((size_t) nb * sizeof(*a1));
        ggml_ext_block_q8_0x4 * ax  = xmalloc((size_t) tokens / 4 * nb * sizeof(*ax));
        float *                 out = xmalloc((size_t) tokens * M * sizeof(float));
        ggml_ext_quantize_row_q8_0(x, a1, K);
        const double bytes = (double) nblk * sizeof(*w);

        for (int iq4 = fam0; iq4 <= fam1; iq4++)
        for (int L = 0; L < GGML_EXT_Q4_0_N_LAYOUTS; L++) {
            const struct ggml_ext_q4_0_layout_traits * tr = iq4 ? ggml_ext_iq4_nl_layout_traits((enum ggml_ext_q4_0_layout) L)
                                                                : ggml_ext_q4_0_layout_traits((enum ggml_ext_q4_0_layout) L);
            if (M % tr->nrows) {
                continue;
            }
            if (iq4) {  // random bytes are valid IQ4_NL blocks too
                ggml_ext_repack_iq4_nl((enum ggml_ext_q4_0_layout) L, wi, w, M, K);
            } else {
                ggml_ext_repack_q4_0((enum ggml_ext_q4_0_layout) L, wi, w, M, K);
            }
            for (int t = 0; t < tokens / 4; t++) {
                tr->quantize_mat(x + (size_t) 4 * t * K, ax + (size_t) t * nb, K);
            }
            for (int i = 0; i < ggml_ext_q4_0_impl_count(); i++) {
                const struct ggml_ext_q4_0_impl * im = ggml_ext_q4_0_impl_get(i);
                const ggml_ext_q4_0_mm_fn gemv = iq4 ? im->gemv_iq4_nl[L] : im->gemv[L];
                const ggml_ext_q4_0_mm_fn gemm = iq4 ? im->gemm_iq4_nl[L] : im->gemm[L];
                if (!gemv && !gemm) {
                    continue;
                }
                char what[64];
                snprintf(what, sizeof(what), "ours %s %s", tr->name, im->name);
                double   tv = 0, tm = 0;
                ours_ctx c  = { gemv, K, M, 1, out, wi, a1 };
                if (c.fn) {
                    tv = best_time(run_ours, &c, i == 0 ? 3 : reps);
                }
                const int tm_tokens = i == 0 ? 4 : tokens;
                if (gemm) {
                    ours_ctx g = { gemm, K, M, tm_tokens, out, wi, ax };
                    tm         = best_time(run_ours, &g, i == 0 ? 1 : gemm_reps);
                }
                if (i == 0) {  // the scalar GEMM ran on 4 tokens: scale its time to all of them
                    tm *= (double) tokens / tm_tokens;
                }
                if (tv > 0) {
                    print_row(shape, what, tv, bytes, tm, 2.0 * M * K * tokens);
                } else {
                    printf("| %s | %s (GEMM only) | - | - | %.1f | %.1f |\n", shape, what, tm * 1e3,
                           2.0 * M * K * tokens / tm * 1e-9);
                }
            }
#ifdef WITH_UPSTREAM
            if (L == GGML_EXT_Q4_0_8_8) {
                float *  ref = xmalloc((size_t) tokens * M * sizeof(float));
                ours_ctx v   = { iq4 ? ggml_gemv_iq4_nl_8x8_q8_0 : ggml_gemv_q4_0_8x8_q8_0, K, M, 1, out, wi, a1 };
                ours_ctx g   = { iq4 ? ggml_gemm_iq4_nl_8x8_q8_0 : ggml_gemm_q4_0_8x8_q8_0, K, M, tokens, out, wi, ax };
                const double tv = best_time(run_ours, &v, reps);
                tr->gemv(K, ref, (size_t) M, wi, a1, 1, M);
                const double dv = max_rel_diff(out, ref, M);
                const double tm = best_time(run_ours, &g, gemm_reps);
                tr->gemm(K, ref, (size_t) M, wi, ax, tokens, M);
                const double dm = max_rel_diff(out, ref, (size_t) tokens * M);
                print_row(shape, iq4 ? "upstream iq4_nl_8x8 kernels (pinned tree)" : "upstream q4_0_8x8 kernels (pinned tree)",
                          tv, bytes, tm, 2.0 * M * K * tokens);
                if (dv > 1e-5 || dm > 1e-5) {
                    fprintf(stderr, "upstream and ours differ on %s: GEMV %.3g, GEMM %.3g of the largest output\n", shape,
                            dv, dm);
                    return 1;
                }
                free(ref);
            }
#endif
        }
#ifdef WITH_GGML
        for (int iq4 = fam0; iq4 <= fam1; iq4++) {
            const enum ggml_type gt = iq4 ? GGML_TYPE_IQ4_NL : GGML_TYPE_Q4_0;
            const double tv = time_ggml(gt, ggml_backend_cpu_buffer_type(), w, x, K, M, 1, reps);
            const double tm = time_ggml(gt, ggml_backend_cpu_buffer_type(), w, x, K, M, tokens, gemm_reps);
            print_row(shape, iq4 ? "ggml IQ4_NL (vec_dot, mul_mat node)" : "ggml Q4_0 (vec_dot, mul_mat node)", tv, bytes, tm,
                      2.0 * M * K * tokens);
            ggml_backend_buffer_type_t rb = repack_buft();
            if (rb) {
                const double rv = time_ggml(gt, rb, w, x, K, M, 1, reps);
                const double rm = time_ggml(gt, rb, w, x, K, M, tokens, gemm_reps);
                print_row(shape, iq4 ? "ggml CPU_REPACK IQ4_NL (mul_mat node)" : "ggml CPU_REPACK Q4_0 (mul_mat node)", rv,
                          bytes, rm, 2.0 * M * K * tokens);
            }
        }
#endif
        free(w);
        free(wi);
        free(x);
        free(a1);
        free(ax);
        free(out);
    }
    return 0;
}
