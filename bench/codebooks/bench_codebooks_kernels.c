// Reproduces docs/RESULTS.md "Codebooks (CB2/CB3)": the kernel timings of bench_codebooks_kernels.py.
// Single-thread GEMV microbenchmark of the codebook kernels (CB2 / CB3 x Q8_K, ggml_ext/src/*/codebooks*.c)
// against ggml's own Q2_K / Q3_K vec_dot (x Q8_K) on the same machine in the same run: the 1-token decode
// product of one weight matrix. Kernels are timed interleaved (rep after rep, each kernel once per rep)
// and the minimum is reported, so a shared, busy machine slows them alike and the best rep of each is what
// the kernel can do. Built and run by bench/codebooks/bench_codebooks_kernels.py (speed only: the weights are
// random bytes with a sane fp16 scale, not a quantized matrix).
//
//   bench_codebooks_kernels [--rows M] [--cols K] [--reps R] [--act-rows N]   (defaults: 4096 x 4096, 30 reps, N = 1)
//
// --act-rows N > 1 times the product with N activation rows (a prompt's GEMM): our kernels take all N rows
// in one call, ggml's stock types run their vec_dot once per (activation row, weight row), as ggml-cpu's
// mul_mat does for them on AVX2.
#define _GNU_SOURCE
#include "formats/codebooks/codebooks.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "common/families.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef BENCH_OLD_AVX2
extern const struct ggml_ext_codebooks_impl ggml_ext_codebooks_impl_avx2_old;  // the kernel of an older commit, renamed
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void fill(uint8_t * p, size_t n, unsigned * seed) {
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t) (rand_r(seed) >> 7);
    }
}

// Random blocks whose fp16 fields at the given offsets are set to a small finite scale.
static uint8_t * blocks(size_t n_blocks, size_t bsize, const int * d_off, int n_d, unsigned * seed) {
    uint8_t * p = malloc(n_blocks * bsize);
    fill(p, n_blocks * bsize, seed);
    const ggml_fp16_t d = ggml_fp32_to_fp16(0.001f);
    for (size_t b = 0; b < n_blocks; b++) {
        for (int k = 0; k < n_d; k++) {
            memcpy(p + b * bsize + d_off[k], &d, sizeof(d));
        }
    }
    return p;
}

struct kernel {
    const char * name;
    int          kind;  // 0: a codebooks implementation, 1: ggml's vec_dot of a stock type
    const struct ggml_ext_codebooks_impl * impl;
    int          bits;
    enum ggml_type type;
    const uint8_t * w;
    double       best, bytes;
};

int main(int argc, char ** argv) {
    int M = 4096, K = 4096, R = 30, N = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) M = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) K = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) R = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--act-rows")) N = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    if (K % 256 || M < 1 || R < 1 || N < 1) {
        fprintf(stderr, "--cols must be a multiple of 256\n");
        return 2;
    }
    ggml_cpu_init();
    unsigned seed = 1;
    const size_t nb = (size_t) M * (K / 256);
    const int d0[] = { 0 }, dq2[] = { 80, 82 }, dq3[] = { 108 };
    uint8_t * cb2 = blocks(nb, ggml_ext_codebooks_block_size(2), d0, 1, &seed);
    uint8_t * cb3 = blocks(nb, ggml_ext_codebooks_block_size(3), d0, 1, &seed);
    uint8_t * q2 = blocks(nb, ggml_type_size(GGML_TYPE_Q2_K), dq2, 2, &seed);
    uint8_t * q3 = blocks(nb, ggml_type_size(GGML_TYPE_Q3_K), dq3, 1, &seed);

    float * x = malloc(sizeof(float) * K * N);
    for (int i = 0; i < K * N; i++) {
        x[i] = (float) (rand_r(&seed) % 2001 - 1000) / 1000.0f;
    }
    const size_t arow = ggml_row_size(GGML_TYPE_Q8_K, K);
    char *       a    = malloc(arow * N);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float(x, a, (int64_t) K * N);
    float * y = malloc(sizeof(float) * M * N);

    struct kernel ks[8];
    int n = 0;
    for (int i = 1; i < ggml_ext_codebooks_impl_count(); i++) {  // the SIMD implementations compiled in
        const struct ggml_ext_codebooks_impl * im = ggml_ext_codebooks_impl_get(i);
        ks[n++] = (struct kernel) { "", 0, im, 2, 0, cb2, 0, (double) nb * ggml_ext_codebooks_block_size(2) };
        ks[n++] = (struct kernel) { "", 0, im, 3, 0, cb3, 0, (double) nb * ggml_ext_codebooks_block_size(3) };
    }
#ifdef BENCH_OLD_AVX2
    ks[n++] = (struct kernel) { "", 0, &ggml_ext_codebooks_impl_avx2_old, 2, 0, cb2, 0, (double) nb * ggml_ext_codebooks_block_size(2) };
    ks[n++] = (struct kernel) { "", 0, &ggml_ext_codebooks_impl_avx2_old, 3, 0, cb3, 0, (double) nb * ggml_ext_codebooks_block_size(3) };
#endif
    ks[n++] = (struct kernel) { "ggml Q2_K vec_dot", 1, NULL, 0, GGML_TYPE_Q2_K, q2, 0, (double) nb * ggml_type_size(GGML_TYPE_Q2_K) };
    ks[n++] = (struct kernel) { "ggml Q3_K vec_dot", 1, NULL, 0, GGML_TYPE_Q3_K, q3, 0, (double) nb * ggml_type_size(GGML_TYPE_Q3_K) };

    for (int k = 0; k < n; k++) {
        ks[k].best = 1e30;
    }
    for (int r = 0; r < R; r++) {
        for (int k = 0; k < n; k++) {
            const double t0 = now();
            if (ks[k].kind == 0) {
                ks[k].impl->mm[ks[k].bits - 2](K, y, M, ks[k].w, a, N, M);
            } else {
                const ggml_vec_dot_t vd = ggml_get_type_traits_cpu(ks[k].type)->vec_dot;
                const size_t         rs = ggml_row_size(ks[k].type, K);
                for (int r = 0; r < N; r++) {
                    for (int m = 0; m < M; m++) {
                        vd(K, y + (size_t) r * M + m, 0, ks[k].w + m * rs, 0, a + r * arow, 0, 1);
                    }
                }
            }
            const double dt = now() - t0;
            ks[k].best = dt < ks[k].best ? dt : ks[k].best;
        }
    }
    const double q2best = ks[n - 2].best;
    printf("| kernel | %d x %d x %d activation row(s), 1 thread: best ms | GB/s of weights | weights/ns | vs Q2_K |\n", M, K, N);
    printf("| --- | --- | --- | --- | --- |\n");
    for (int k = 0; k < n; k++) {
        char name[64];
        if (ks[k].kind == 0) {
            snprintf(name, sizeof(name), "CB%d %s", ks[k].bits, ks[k].impl->name);
        } else {
            snprintf(name, sizeof(name), "%s", ks[k].name);
        }
        printf("| %s | %.3f | %.2f | %.2f | %.2fx |\n", name, 1e3 * ks[k].best, ks[k].bytes / ks[k].best / 1e9,
               (double) M * K * N / ks[k].best / 1e9, q2best / ks[k].best);
    }
    return 0;
}
