// Reproduces docs/RESULTS.md "KVQuant": the NUQ value decode, SIMD against the scalar reference.
// NUQ cache types' to_float as llama.cpp's CPU flash attention calls it (one head of 64 values per
// call, cell after cell) and as the key path's copy does (one 64-block per call): ns per call and per
// value, for the libraries of one install (before / after comparisons run it against each prefix).
//
//   cc -O2 bench/kvquant/bench_nuq_decode.c -ldl -o /tmp/bench_nuq_decode
//   LD_LIBRARY_PATH=PREFIX/lib /tmp/bench_nuq_decode PREFIX/lib [CELLS] [PASSES]
//   (GGML_EXT_KVQ_DECODE=ref: the scalar reference decoder in a build that has the SIMD one)
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*bind_fn)(const void *, size_t, int, const float *, const float *, char *, size_t);
typedef void (*to_float_fn)(const void *, float *, int64_t);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIBDIR [CELLS] [PASSES]\n", argv[0]);
        return 2;
    }
    const int cells = argc > 2 ? atoi(argv[2]) : 8192, passes = argc > 3 ? atoi(argv[3]) : 20;
    char      path[4096];
    snprintf(path, sizeof path, "%s/libggml-base.so", argv[1]);
    void * base = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    snprintf(path, sizeof path, "%s/libggml-cpu.so", argv[1]);
    void * cpu = dlopen(path, RTLD_NOW | RTLD_GLOBAL);  // registers its SIMD decoder, where the build has one
    if (!base || !cpu) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    bind_fn bind = (bind_fn) dlsym(base, "ggml_ext_kvquant_bind");
    const char * (*decoder)(void) = (const char * (*) (void)) dlsym(base, "ggml_ext_kvquant_block_decoder");
    static const struct { const char * name; int id, bytes; } types[] = { { "NUQ4", 103, 40 }, { "NUQ3", 104, 32 },
                                                                        { "NUQ2", 105, 24 } };
    printf("decoder: %s; %d cells x 3 heads x 64 values, %d passes\n", decoder ? decoder() : "(scalar, no hook)",
           cells, passes);
    for (int ti = 0; ti < 3; ti++) {
        char name[64];
        snprintf(name, sizeof name, "ggml_ext_to_float_%s", types[ti].name);
        to_float_fn to_float = (to_float_fn) dlsym(base, name);
        const int   bits = 4 - ti, n = 1 << bits, nb = cells * 3;
        uint8_t *   buf  = malloc((size_t) nb * types[ti].bytes);
        float       lv[16], y[64];
        for (int i = 0; i < n; i++) {
            lv[i] = -1.0f + 2.0f * i / (n - 1);
        }
        srand(1);
        for (size_t i = 0; i < (size_t) nb * types[ti].bytes; i++) {
            buf[i] = (uint8_t) rand();
        }
        for (int b = 0; b < nb; b++) {  // finite scales (fp16 0.5, 1.0), no outliers
            const uint16_t s[4] = { 0x3800, 0x3c00, 0, 0 };
            memcpy(buf + (size_t) b * types[ti].bytes + types[ti].bytes - 8, s, sizeof s);
        }
        char err[256];
        if (bind(buf, (size_t) nb * types[ti].bytes, types[ti].id, lv, lv, err, sizeof err) != 0) {
            fprintf(stderr, "bind: %s\n", err);
            return 1;
        }
        double sink = 0, best = 1e30;
        for (int p = 0; p < passes; p++) {
            const double t0 = now();
            for (int b = 0; b < nb; b++) {
                to_float(buf + (size_t) b * types[ti].bytes, y, 64);
                sink += y[b & 63];
            }
            const double dt = now() - t0;
            best = dt < best ? dt : best;
        }
        printf("%s: %.1f ns per 64-value call, %.3f ns per value (best of %d; checksum %g)\n", types[ti].name,
               1e9 * best / nb, 1e9 * best / nb / 64, passes, sink);
        free(buf);
    }
    return 0;
}
