// The machine's read bandwidth, the roofline of CPU decode (docs/RESULTS.md "CPU roofline"): T threads each
// sum their share of a buffer far larger than the caches (default 2 GiB), the best of R passes, in GB/s
// (10^9 bytes). The sum is printed so the loads cannot be dropped; the loop is plain C that the compiler
// vectorises (-O3 -march=native), like STREAM's read kernels.
//
//   cc -O3 -march=native -pthread bench/runtime/read_bandwidth.c -o read_bandwidth
//   ./read_bandwidth THREADS [MiB] [PASSES]      -> "threads 2 MiB 2048 best_GBps 83.4 sum ..."
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint64_t * p;
    size_t           n;
    uint64_t         sum;
    pthread_barrier_t * start;
} part;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void * reader(void * arg) {
    part * w = arg;
    // four independent sums: the adds do not serialise the loads
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    pthread_barrier_wait(w->start);
    for (size_t i = 0; i + 4 <= w->n; i += 4) {
        s0 += w->p[i];
        s1 += w->p[i + 1];
        s2 += w->p[i + 2];
        s3 += w->p[i + 3];
    }
    w->sum = s0 + s1 + s2 + s3;
    return NULL;
}

int main(int argc, char ** argv) {
    const int    threads = argc > 1 ? atoi(argv[1]) : 1;
    const size_t mib     = argc > 2 ? (size_t) atol(argv[2]) : 2048;
    const int    passes  = argc > 3 ? atoi(argv[3]) : 5;
    if (threads < 1 || threads > 1024 || mib < 1 || passes < 1) {
        fprintf(stderr, "usage: %s THREADS [MiB] [PASSES]\n", argv[0]);
        return 2;
    }
    const size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *   buf = aligned_alloc(4096, n * sizeof(uint64_t));
    if (!buf) {
        fprintf(stderr, "cannot allocate %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {  // touch every page (and give the sum something to add)
        buf[i] = i;
    }
    double   best  = 0.0;
    uint64_t total = 0;
    for (int r = 0; r < passes; r++) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned) threads + 1);
        pthread_t th[1024];
        part      w[1024];
        for (int t = 0; t < threads; t++) {
            const size_t a = n * t / threads, b = n * (t + 1) / threads;
            w[t]           = (part) { buf + a, b - a, 0, &start };
            pthread_create(&th[t], NULL, reader, &w[t]);
        }
        const double t0 = now();
        pthread_barrier_wait(&start);
        for (int t = 0; t < threads; t++) {
            pthread_join(th[t], NULL);
            total += w[t].sum;
        }
        const double gbps = n * sizeof(uint64_t) / (now() - t0) / 1e9;
        best              = gbps > best ? gbps : best;
        pthread_barrier_destroy(&start);
    }
    printf("threads %d MiB %zu best_GBps %.2f sum %llu\n", threads, mib, best, (unsigned long long) total);
    free(buf);
    return 0;
}
