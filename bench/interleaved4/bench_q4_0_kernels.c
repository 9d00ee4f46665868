// Reproduces docs/RESULTS.md "Interleaved Q4_0" and "IQ4_NL": the kernel timings of bench_q4_0_kernels.py.
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
// --roofline (x86) measures, in the same run, what the kernels are held against: the int8
// multiply-accumulate peak of one core (independent chains of vpdpbusd zmm, the
// instruction of our and upstream's AVX-512 VNNI kernels, and of AVX2's vpmaddubsw +
// vpmaddwd + vpaddd, written in asm so nothing is hoisted) and the read bandwidth of 1 and
// 2 threads (STREAM-like sum), then GEMV on cold weights (copies of the matrix cycled
// through, 8x the last-level cache or more, so every call reads DRAM, as decoding a large
// model does) in GB/s of weights + activations read and % of the measured bandwidth, and
// GEMM (--tokens) in GOPS and % of both peaks, for ours (Q4_0_8_8 dispatched and AVX2) and
// upstream's 8x8. All as best of many short intervals (see the section's comment).
//
// Built and run by bench/interleaved4/bench_q4_0_kernels.py.
#define _GNU_SOURCE  // clock_gettime, posix_memalign, sysconf(_SC_LEVEL3_CACHE_SIZE) under -std=c11

#include "formats/interleaved4/interleaved4_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__AVX2__)
#    include <immintrin.h>
#endif

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
    ggml_ext_interleaved4_mm_fn fn;
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

// ---------------------------------------------------------------- --roofline
//
// Every rate here is the best of many short intervals (about 0.3-1 ms): the project's
// machine is shared, and a run longer than a scheduler slice is diluted by whatever else
// runs; a short interval either runs alone or is visibly slow, and the best is the
// machine's rate. The peaks, the bandwidth and the kernels are measured the same way.

// Int8 MACs per second of one thread: 16 independent vpdpbusd zmm chains (64 MACs each).
static double peak_vnni512(long iters) {
#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512F__)
    long         n  = iters;
    const double t0 = now();
    __asm__ volatile(
        "vpternlogd $0xff, %%zmm0, %%zmm0, %%zmm0\n\t"
        "vpabsb %%zmm0, %%zmm1\n\t"
        "1:\n\t"
        "vpdpbusd %%zmm1, %%zmm0, %%zmm2\n\tvpdpbusd %%zmm1, %%zmm0, %%zmm3\n\t"
        "vpdpbusd %%zmm1, %%zmm0, %%zmm4\n\tvpdpbusd %%zmm1, %%zmm0, %%zmm5\n\t"
        "vpdpbusd %%zmm1, %%zmm0, %%zmm6\n\tvpdpbusd %%zmm1, %%zmm0, %%zmm7\n\t"
        "vpdpbusd %%zmm1, %%zmm0, %%zmm8\n\tvpdpbusd %%zmm1, %%zmm0, %%zmm9\n\t"
        "vpdpbusd %%zmm1, %%zmm0, %%zmm10\n\tvpdpbusd %%zmm1, %%zmm0, %%zmm11\n\t"
        "vpdpbusd %%zmm1, %%zmm0, %%zmm12\n\tvpdpbusd %%zmm1, %%zmm0, %%zmm13\n\t"
        "vpdpbusd %%zmm1, %%zmm0, %%zmm14\n\tvpdpbusd %%zmm1, %%zmm0, %%zmm15\n\t"
        "vpdpbusd %%zmm1, %%zmm0, %%zmm16\n\tvpdpbusd %%zmm1, %%zmm0, %%zmm17\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper\n\t"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
          "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc");
    return 16.0 * 64 * (double) iters / (now() - t0);
#else
    (void) iters;
    return 0;
#endif
}

// AVX2: 6 independent vpmaddubsw (u8 x s8 pairs -> s16) + vpmaddwd (-> s32) + vpaddd
// sequences, 32 MACs each, the inner step of AVX2 int8 dot products.
static double peak_avx2(long iters) {
#if defined(__x86_64__) && defined(__AVX2__)
    long         n  = iters;
    const double t0 = now();
    __asm__ volatile(
        "vpcmpeqb %%ymm0, %%ymm0, %%ymm0\n\t"
        "vpabsb %%ymm0, %%ymm1\n\t"
        "vpabsw %%ymm0, %%ymm2\n\t"
        "1:\n\t"
        "vpmaddubsw %%ymm1, %%ymm0, %%ymm4\n\tvpmaddubsw %%ymm1, %%ymm0, %%ymm5\n\t"
        "vpmaddubsw %%ymm1, %%ymm0, %%ymm6\n\tvpmaddubsw %%ymm1, %%ymm0, %%ymm7\n\t"
        "vpmaddubsw %%ymm1, %%ymm0, %%ymm8\n\tvpmaddubsw %%ymm1, %%ymm0, %%ymm9\n\t"
        "vpmaddwd %%ymm2, %%ymm4, %%ymm4\n\tvpmaddwd %%ymm2, %%ymm5, %%ymm5\n\t"
        "vpmaddwd %%ymm2, %%ymm6, %%ymm6\n\tvpmaddwd %%ymm2, %%ymm7, %%ymm7\n\t"
        "vpmaddwd %%ymm2, %%ymm8, %%ymm8\n\tvpmaddwd %%ymm2, %%ymm9, %%ymm9\n\t"
        "vpaddd %%ymm4, %%ymm10, %%ymm10\n\tvpaddd %%ymm5, %%ymm11, %%ymm11\n\t"
        "vpaddd %%ymm6, %%ymm12, %%ymm12\n\tvpaddd %%ymm7, %%ymm13, %%ymm13\n\t"
        "vpaddd %%ymm8, %%ymm14, %%ymm14\n\tvpaddd %%ymm9, %%ymm15, %%ymm15\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper\n\t"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",
          "xmm14", "xmm15", "cc");
    return 6.0 * 32 * (double) iters / (now() - t0);
#else
    (void) iters;
    return 0;
#endif
}

// Best of 400 runs of about 0.3 ms each (calibrated on a short run).
static double best_peak(double (*fn)(long)) {
    double r0 = 0;
    for (int i = 0; i < 20; i++) {
        r0 = fmax(r0, fn(2000));
    }
    if (r0 <= 0) {
        return 0;
    }
    const long iters = (long) (r0 * 3e-4 / 1024) + 1;
    double     best  = 0;
    for (int i = 0; i < 400; i++) {
        best = fmax(best, fn(iters));
    }
    return best;
}

static void * xmalloc_aligned(size_t n) {
    void * p = NULL;
    if (posix_memalign(&p, 64, n) != 0) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

// A second thread that runs one job per round: both threads start a round together
// (barrier), and the round ends when both are done.
typedef void (*job_fn)(void * arg);

typedef struct {
    pthread_barrier_t start, done;
    job_fn            fn;
    void *            arg;
    int               quit;
    pthread_t         th;
} helper;

static void * helper_main(void * v) {
    helper * h = (helper *) v;
    for (;;) {
        pthread_barrier_wait(&h->start);
        if (h->quit) {
            return NULL;
        }
        h->fn(h->arg);
        pthread_barrier_wait(&h->done);
    }
}

static void helper_init(helper * h) {
    pthread_barrier_init(&h->start, NULL, 2);
    pthread_barrier_init(&h->done, NULL, 2);
    h->quit = 0;
    pthread_create(&h->th, NULL, helper_main, h);
}

static void helper_free(helper * h) {
    h->quit = 1;
    pthread_barrier_wait(&h->start);
    pthread_join(h->th, NULL);
    pthread_barrier_destroy(&h->start);
    pthread_barrier_destroy(&h->done);
}

// Seconds of one round: fn(a0) here and, with h, fn(a1) on the helper at the same time.
static double timed_round(helper * h, job_fn fn, void * a0, void * a1) {
    if (h) {
        h->fn  = fn;
        h->arg = a1;
    }
    const double t0 = now();
    if (h) {
        pthread_barrier_wait(&h->start);
    }
    fn(a0);
    if (h) {
        pthread_barrier_wait(&h->done);
    }
    return now() - t0;
}

typedef struct {
    const uint8_t * p;
    size_t          n;
    uint64_t        sum;
} bw_arg;

static void bw_read(void * v) {  // sums n bytes (a multiple of 128) as 64-bit words
    bw_arg *        a = (bw_arg *) v;
    const uint8_t * p = a->p;
#if defined(__AVX2__)
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < a->n; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *) (p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *) (p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *) (p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *) (p + i + 96)));
    }
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *) t, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    a->sum += t[0] + t[1] + t[2] + t[3];
#else
    uint64_t s[4] = { 0 };
    for (size_t i = 0; i < a->n; i += 32) {
        for (int k = 0; k < 4; k++) {
            uint64_t x;
            memcpy(&x, p + i + 8 * k, 8);
            s[k] += x;
        }
    }
    a->sum += s[0] + s[1] + s[2] + s[3];
#endif
}

// Read GB/s of 1 or 2 threads: passes over a buffer of n bytes (far larger than the caches)
// in segments of seg bytes, each thread reading its half of a segment; best segment.
static double read_bandwidth(const uint8_t * buf, size_t n, size_t seg, helper * h, int passes) {
    const int nt   = h ? 2 : 1;
    double    best = 0;
    bw_arg    a[2] = { { 0 } };
    for (int p = 0; p < passes; p++) {
        for (size_t off = 0; off + seg <= n; off += seg) {
            for (int t = 0; t < nt; t++) {
                a[t].p = buf + off + t * (seg / nt);
                a[t].n = seg / nt;
            }
            best = fmax(best, (double) seg / timed_round(h, bw_read, &a[0], &a[1]) * 1e-9);
        }
    }
    if (a[0].sum + a[1].sum == 42) {  // keep the sums alive
        printf(" ");
    }
    return best;
}

// One call of a kernel on columns [c0, c1) of one weight copy.
typedef struct {
    ggml_ext_interleaved4_mm_fn fn;
    int                 K, T, c0, c1, N;
    const uint8_t *     w;
    const void *        a;
    float *             out;
    size_t              bs;
} call_arg;

static void run_call(void * v) {
    const call_arg * c   = (const call_arg *) v;
    const size_t     grp = (size_t) c->K / 32 * c->N * sizeof(ggml_ext_block_q4_0);  // bytes of a row group
    c->fn(c->K, c->out + c->c0, c->bs, c->w + (size_t) c->c0 / c->N * grp, c->a, c->T, c->c1 - c->c0);
}

// GEMV on cold weights: seconds of the best call, each call on the next copy (1 or 2
// threads, each taking half of the row groups).
static double time_gemv_cold(ggml_ext_interleaved4_mm_fn fn, int K, int M, uint8_t * const * copies, int ncopies,
                             const void * a, float * out, helper * h, int passes) {
    const int ng   = M / 8;
    double    best = 1e30;
    for (int p = 0; p < passes; p++) {
        for (int i = 0; i < ncopies; i++) {
            call_arg c0 = { fn, K, 1, 0, h ? ng / 2 * 8 : M, 8, copies[i], a, out, 0 };
            call_arg c1 = { fn, K, 1, ng / 2 * 8, M, 8, copies[i], a, out, 0 };
            best        = fmin(best, timed_round(h, run_call, &c0, &c1));
        }
    }
    return best;
}

// GEMM of all tokens on slabs of 64 weight rows across the matrix, one thread: seconds of
// the best slab, scaled to the whole matrix.
static double time_gemm_slabs(ggml_ext_interleaved4_mm_fn fn, int K, int M, int tokens, const uint8_t * w, const void * ax,
                              float * out, int rounds) {
    const int slab = M < 64 ? M : 64, nslabs = M / slab;
    double    best = 1e30;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nslabs; i += 1 + nslabs / 16) {
            call_arg c = { fn, K, tokens, i * slab, (i + 1) * slab, 8, w, ax, out, (size_t) M };
            best       = fmin(best, timed_round(NULL, run_call, &c, NULL));
        }
    }
    return best * M / slab;
}

typedef struct {
    const char *        name;
    ggml_ext_interleaved4_mm_fn gemv, gemm;
} roof_kernel;

static int roofline(int (*shapes)[2], int n_shapes, int tokens) {
    helper h;
    helper_init(&h);
    const double vnni = best_peak(peak_vnni512) * 2e-9, avx2 = best_peak(peak_avx2) * 2e-9;  // GOPS
    printf("int8 multiply-accumulate peak, one thread (GOPS = 2 x MACs/s; best of 400 runs of 0.3 ms):\n\n");
    printf("| instruction sequence | MACs each | peak GOPS |\n| --- | ---: | ---: |\n");
    if (vnni > 0) {
        printf("| vpdpbusd zmm (AVX-512 VNNI), 16 chains | 64 | %.0f |\n", vnni);
    }
    printf("| vpmaddubsw + vpmaddwd + vpaddd ymm (AVX2), 6 chains | 32 | %.0f |\n\n", avx2);

    // cold weights: 8 times the last-level cache, at least 256 MiB, at most 1 GiB
    size_t cold_bytes = (size_t) 256 << 20;
#    if defined(_SC_LEVEL3_CACHE_SIZE)
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0 && (size_t) l3 * 8 > cold_bytes) {
        cold_bytes = (size_t) l3 * 8 < ((size_t) 1 << 30) ? (size_t) l3 * 8 : (size_t) 1 << 30;
    }
#    endif
    const size_t bw_n = cold_bytes, seg = (size_t) 8 << 20;
    uint8_t *    buf  = xmalloc_aligned(bw_n);
    for (size_t i = 0; i < bw_n; i++) {
        buf[i] = (uint8_t) i;
    }
    const double bw1 = read_bandwidth(buf, bw_n, seg, NULL, 2), bw2 = read_bandwidth(buf, bw_n, seg, &h, 2);
    free(buf);
    printf("read bandwidth (8 MiB segments of a %zu MiB buffer, best segment of 2 passes): 1 thread %.1f GB/s, "
           "2 threads %.1f GB/s\n\n", bw_n >> 20, bw1, bw2);
    printf("GEMV: weights cold (copies totalling %zu MiB, each call on the next), GB/s of weights + Q8_0 activation "
           "row read, best call of 2 passes; GEMM: %d tokens, one thread, best slab of 64 weight rows.\n\n",
           cold_bytes >> 20, tokens);
    printf("| shape (M x K) | kernel | GEMV GB/s, 1 thread | %% of 1-thread bandwidth | GEMV GB/s, 2 threads | "
           "%% of 2-thread bandwidth | GEMM GOPS | %% of vpdpbusd peak | %% of AVX2 peak |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const enum ggml_ext_interleaved4_layout            L  = GGML_EXT_INTERLEAVED4_8X8;
    const struct ggml_ext_interleaved4_layout_traits * tr = ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, L);
    for (int si = 0; si < n_shapes; si++) {
        const int M = shapes[si][0], K = shapes[si][1], nb = K / 32;
        if (M % 8 || K % 32) {
            continue;
        }
        const size_t          wbytes = (size_t) M * nb * sizeof(ggml_ext_block_q4_0);
        ggml_ext_block_q4_0 * w      = xmalloc(wbytes);
        for (size_t i = 0; i < (size_t) M * nb; i++) {
            w[i].d = ggml_ext_fp32_to_fp16((float) (rnd() % 1000 + 1) * 1e-5f);
            for (int j = 0; j < 16; j++) {
                w[i].qs[j] = (uint8_t) rnd();
            }
        }
        const int  ncopies = (int) (cold_bytes / wbytes) + 1;
        uint8_t ** copies  = xmalloc((size_t) ncopies * sizeof(*copies));
        for (int c = 0; c < ncopies; c++) {
            copies[c] = xmalloc_aligned(wbytes);
            ggml_ext_repack_q4_0(L, copies[c], w, M, K);
        }
        float * x = xmalloc((size_t) tokens * K * sizeof(float));
        for (size_t i = 0; i < (size_t) tokens * K; i++) {
            x[i] = (float) ((int) (rnd() % 2001) - 1000) * 1e-3f;
        }
        ggml_ext_block_q8_0 *   a1  = xmalloc((size_t) nb * sizeof(*a1));
        ggml_ext_block_q8_0x4 * ax  = xmalloc((size_t) tokens / 4 * nb * sizeof(*ax));
        float *                 out = xmalloc((size_t) tokens * M * sizeof(float));
        ggml_ext_quantize_row_q8_0(x, a1, K);
        for (int t = 0; t < tokens / 4; t++) {
            tr->quantize_mat(x + (size_t) 4 * t * K, ax + (size_t) t * nb, K);
        }
        // read per GEMV call: the weights and the Q8_0 activation row
        const double bytes = (double) wbytes + (double) nb * sizeof(ggml_ext_block_q8_0);
        const double ops   = 2.0 * M * K * tokens;
        roof_kernel  ks[3];
        int          nk = 0;
        char         disp[64];
        snprintf(disp, sizeof(disp), "ours Q4_0_8_8 %s", ggml_ext_interleaved4_dispatched(GGML_EXT_INTERLEAVED4_Q4_0, L, 1));
        ks[nk++] = (roof_kernel) { disp, tr->gemv, tr->gemm };
#    ifdef GGML_EXT_HAVE_AVX512VNNI
        ks[nk++] = (roof_kernel) { "ours Q4_0_8_8 avx2", ggml_ext_interleaved4_impl_avx2.gemv[0][L], ggml_ext_interleaved4_impl_avx2.gemm[0][L] };
#    endif
#    ifdef WITH_UPSTREAM
        ks[nk++] = (roof_kernel) { "upstream q4_0_8x8 (pinned tree)", ggml_gemv_q4_0_8x8_q8_0, ggml_gemm_q4_0_8x8_q8_0 };
#    endif
        for (int k = 0; k < nk; k++) {
            const double t1 = time_gemv_cold(ks[k].gemv, K, M, copies, ncopies, a1, out, NULL, 2);
            const double t2 = time_gemv_cold(ks[k].gemv, K, M, copies, ncopies, a1, out, &h, 2);
            const double tm = time_gemm_slabs(ks[k].gemm, K, M, tokens, copies[0], ax, out, 3);
            const double g1 = bytes / t1 * 1e-9, g2 = bytes / t2 * 1e-9, gops = ops / tm * 1e-9;
            printf("| %d x %d | %s | %.1f | %.0f%% | %.1f | %.0f%% | %.0f | ", M, K, ks[k].name, g1, 100 * g1 / bw1, g2,
                   100 * g2 / bw2, gops);
            if (vnni > 0) {
                printf("%.0f%% | ", 100 * gops / vnni);
            } else {
                printf("- | ");
            }
            printf("%.0f%% |\n", 100 * gops / avx2);
            fflush(stdout);
        }
        for (int c = 0; c < ncopies; c++) {
            free(copies[c]);
        }
        free(copies);
        free(w);
        free(x);
        free(a1);
        free(ax);
        free(out);
    }
    helper_free(&h);
    return 0;
}

int main(int argc, char ** argv) {
    int tokens = 512, reps = 7, gemm_reps = 3;
    int shapes[16][2] = { { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 }, { 14336, 4096 } };  // M (rows) x K
    int n_shapes      = 4;
    int do_roofline   = 0;
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
            if (n_shapes < 16 && sscanf(argv[++i], "%dx%d", &shapes[n_shapes][0], &shapes[n_shapes][1]) == 2) {
                n_shapes++;
            }
        } else if (!strcmp(argv[i], "--roofline")) {
            do_roofline = 1;
        } else {
            fprintf(stderr, "usage: %s [--family q4_0|iq4_nl|both] [--tokens T] [--reps R] [--gemm-reps R] [--shape MxK ...] [--roofline]\n", argv[0]);
            return 2;
        }
    }
    tokens = (tokens + 3) / 4 * 4;
#ifdef WITH_UPSTREAM
    for (int h = 0; h < (1 << 16); h++) {
        ggml_table_f32_f16[h] = ggml_ext_fp16_to_fp32((ggml_ext_fp16_t) h);
    }
#endif
    if (do_roofline) {
        return roofline(shapes, n_shapes, tokens);
    }

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
        for (int L = 0; L < GGML_EXT_INTERLEAVED4_N_LAYOUTS; L++) {
            const struct ggml_ext_interleaved4_layout_traits * tr = iq4 ? ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_IQ4_NL, (enum ggml_ext_interleaved4_layout) L)
                                                                : ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, (enum ggml_ext_interleaved4_layout) L);
            if (M % tr->nrows) {
                continue;
            }
            if (iq4) {  // random bytes are valid IQ4_NL blocks too
                ggml_ext_repack_iq4_nl((enum ggml_ext_interleaved4_layout) L, wi, w, M, K);
            } else {
                ggml_ext_repack_q4_0((enum ggml_ext_interleaved4_layout) L, wi, w, M, K);
            }
            for (int t = 0; t < tokens / 4; t++) {
                tr->quantize_mat(x + (size_t) 4 * t * K, ax + (size_t) t * nb, K);
            }
            for (int i = 0; i < ggml_ext_interleaved4_impl_count(); i++) {
                const struct ggml_ext_interleaved4_impl * im = ggml_ext_interleaved4_impl_get(i);
                const ggml_ext_interleaved4_mm_fn gemv = im->gemv[iq4][L];
                const ggml_ext_interleaved4_mm_fn gemm = im->gemm[iq4][L];
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
            if (L == GGML_EXT_INTERLEAVED4_8X8) {
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
