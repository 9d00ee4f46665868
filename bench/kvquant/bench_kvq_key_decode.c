// Reproduces docs/RESULTS.md "KVQuant": the key row decode, block-scaled against per-channel.
// usage: cc -O2 bench/kvquant/bench_kvq_key_decode.c -ldl -o /tmp/kdec && LD_LIBRARY_PATH=PREFIX/lib /tmp/kdec PREFIX/lib
// to_float of pre-RoPE key rows (192 channels = 3 blocks, as the decode op reads one cell), per channel vs block-scaled
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*bind_opts_fn)(const void *, size_t, int, int64_t, const float *, const float *, const float *, const float *, int, int, char *, size_t);
typedef int (*kb_fn)(const void *, int);
typedef int (*byname_fn)(const char *);
typedef void (*tf_fn)(const void *, float *, int64_t);
typedef void (*ff_fn)(const float *, void *, int64_t);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char ** argv) {
    char p[4096]; snprintf(p, sizeof p, "%s/libggml-base.so", argv[1]);
    void * base = dlopen(p, RTLD_NOW | RTLD_GLOBAL); snprintf(p, sizeof p, "%s/libggml-cpu.so", argv[1]);
    void * cpu = dlopen(p, RTLD_NOW | RTLD_GLOBAL);
    if (!base || !cpu) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void (*cpu_init)(void) = dlsym(cpu, "ggml_cpu_init"); cpu_init();
    bind_opts_fn bind = dlsym(base, "ggml_ext_kvquant_bind_opts"); kb_fn kb = dlsym(base, "ggml_ext_kvquant_key_blocks");
    byname_fn byname = dlsym(base, "ggml_ext_kv_cache_type_by_name");
    char name[64]; const int type = byname("nuq3");
    snprintf(name, sizeof name, "ggml_ext_to_float_NUQ3"); tf_fn tf = dlsym(base, name);
    snprintf(name, sizeof name, "ggml_ext_from_float_ref_NUQ3"); ff_fn ff = dlsym(base, name);
    if (!tf || !ff) { fprintf(stderr, "no row fns\n"); return 1; }
    const int D = 192, cells = 8192, bs = 32; float lv[8], mid[192], half[192];
    for (int i = 0; i < 8; i++) lv[i] = -1.0f + 2.0f * i / 7;
    for (int c = 0; c < D; c++) { mid[c] = 0.1f * (c % 7); half[c] = 1.0f + 0.01f * c; }
    char * buf = aligned_alloc(64, (size_t) cells * D / 64 * bs); float * x = malloc(sizeof(float) * D), * y = malloc(sizeof(float) * D);
    for (int mode = 0; mode < 2; mode++) {
        char err[256];
        if (bind(buf, (size_t) cells * D / 64 * bs, type, D, lv, lv, mid, half, 1, 0, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        if (mode) kb(buf, 1);
        srand(1);
        for (int r = 0; r < cells; r++) { for (int c = 0; c < D; c++) x[c] = mid[c] + half[c] * (2.0f * rand() / RAND_MAX - 1); ff(x, buf + (size_t) r * D / 64 * bs, D); }
        double best = 1e9; volatile float sink = 0;
        for (int pass = 0; pass < 15; pass++) {
            double t0 = now();
            for (int r = 0; r < cells; r++) { tf(buf + (size_t) r * D / 64 * bs, y, D); sink += y[5]; }
            double t = now() - t0; best = t < best ? t : best;
        }
        printf("%s: %.2f ns per value (best of 15 passes over %d cells x %d)\n", mode ? "block-scaled" : "per channel", 1e9 * best / cells / D, cells, D);
    }
    return 0;
}
