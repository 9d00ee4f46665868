// Reproduces docs/RESULTS.md "KVQuant": the kernel timings of bench_kvquant_kernels.py.
// Timing program of bench/kvquant/bench_kvquant_kernels.py: one layer's attention over a cache of T tokens,
// single thread, KVQuant nuq4 kernels (ggml_ext_kvquant_k_scores / v_accumulate with head -1: every KV head
// and its query heads in one call) against llama.cpp's fp16 cache path on the same data: ggml-cpu's own F16 vec_dot
// (ggml_get_type_traits_cpu(GGML_TYPE_F16)), per token over post-RoPE fp16 keys (K . q) and per channel
// over the transposed fp16 values (V^T . w, llama.cpp's non-flash-attention layout), q and w converted
// to fp16 once as its mul_mat does. Prints one line of key=value per measurement.
//   usage: bench n_kv head_dim n_q_per_kv T bits reps [impl]
#include "formats/kvquant/kvquant.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float gauss(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    float u = (float) ((rng >> 11) * (1.0 / 9007199254740992.0)) + 1e-7f;
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    float v = (float) ((rng >> 11) * (1.0 / 9007199254740992.0));
    return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}

int main(int argc, char ** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s n_kv head_dim n_q_per_kv T bits reps [impl]\n", argv[0]);
        return 2;
    }
    const int n_kv = atoi(argv[1]), hd = atoi(argv[2]), G = atoi(argv[3]), T = atoi(argv[4]), bits = atoi(argv[5]),
              reps = atoi(argv[6]);
    if (argc > 7 && ggml_ext_kvquant_force(argv[7]) != 0) {
        fprintf(stderr, "no implementation %s\n", argv[7]);
        return 2;
    }
    const int D = n_kv * hd, n = 1 << bits;
    float *   lo = malloc(4 * D), * hi = malloc(4 * D), lv[16];
    for (int c = 0; c < D; c++) {
        lo[c] = -2.6f;
        hi[c] = 2.6f;
    }
    for (int i = 0; i < n; i++) {
        lv[i] = -1 + 2.0f * i / (n - 1);
    }
    const int vk = D / 200 > 1 ? D / 200 : 1;  // 1% outliers
    const int ks = (int) ceilf(0.03f * D) > 2 ? (int) ceilf(0.03f * D) : 2;
    struct ggml_ext_kvquant_config cfg = { bits, n_kv, hd, ks, 2 * vk, vk, GGML_EXT_KVQUANT_ROPE_NEOX, hd, 10000.0f, 1.0f,
                                       NULL, lo, hi, lv, lv, lv, lv };
    char err[256];
    struct ggml_ext_kvquant_layer * L = ggml_ext_kvquant_layer_new(&cfg, err, sizeof err);
    if (!L) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const size_t kr = ggml_ext_kvquant_k_row_size(L), vr = ggml_ext_kvquant_v_row_size(L);
    uint8_t *    K = malloc(kr * T), * V = malloc(vr * T);
    ggml_fp16_t * K16 = malloc(sizeof(ggml_fp16_t) * (size_t) D * T), * VT16 = malloc(sizeof(ggml_fp16_t) * (size_t) D * T);
    int32_t *     pos = malloc(4 * T);
    float *       x = malloc(4 * D);
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < D; c++) {
            x[c] = gauss();
        }
        ggml_ext_kvquant_quantize_k(L, x, K + kr * t);
        for (int c = 0; c < D; c++) {
            K16[(size_t) t * D + c] = ggml_fp32_to_fp16(x[c]);
        }
        ggml_ext_kvquant_quantize_v(L, x, V + vr * t);
        for (int c = 0; c < D; c++) {
            VT16[(size_t) c * T + t] = ggml_fp32_to_fp16(x[c]);
        }
        pos[t] = t;
    }
    float *       q = malloc(4 * (size_t) D * G), * w = malloc(4 * (size_t) T * G * n_kv), * scores = malloc(4 * (size_t) T * G * n_kv);
    float *       out = malloc(4 * (size_t) D * G);
    ggml_fp16_t * q16 = malloc(2 * (size_t) D * G), * w16 = malloc(2 * (size_t) T * G);
    for (int i = 0; i < D * G; i++) {
        q[i] = gauss();
    }
    for (int i = 0; i < T * G * n_kv; i++) {
        w[i] = 1.0f / T;
    }
    const struct ggml_type_traits_cpu * f16 = ggml_get_type_traits_cpu(GGML_TYPE_F16);
    double best[4] = { 1e30, 1e30, 1e30, 1e30 };
    volatile float sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        ggml_ext_kvquant_k_scores(L, -1, q, G, K, kr, pos, T, scores);  // every KV head in one pass
        double t1 = now();
        ggml_ext_kvquant_v_accumulate(L, -1, w, G, V, vr, T, out);
        double t2 = now();
        for (int h = 0; h < n_kv; h++) {  // fp16: q -> fp16 once, one vec_dot per token (mul_mat's path)
            f16->from_float(q + (size_t) h * G * hd, q16, (int64_t) G * hd);
            for (int g = 0; g < G; g++) {
                for (int t = 0; t < T; t++) {
                    f16->vec_dot(hd, scores + (size_t) g * T + t, 0, K16 + (size_t) t * D + h * hd, 0, q16 + g * hd, 0, 1);
                }
            }
        }
        double t3 = now();
        f16->from_float(w, w16, (int64_t) G * T);
        for (int h = 0; h < n_kv; h++) {  // fp16 V^T: one vec_dot over the tokens per channel
            for (int g = 0; g < G; g++) {
                for (int c = 0; c < hd; c++) {
                    f16->vec_dot(T, out + g * hd + c, 0, VT16 + (size_t) (h * hd + c) * T, 0, w16 + (size_t) g * T, 0, 1);
                }
            }
        }
        double t4 = now();
        sink += scores[0] + out[0];
        double d[4] = { t1 - t0, t2 - t1, t3 - t2, t4 - t3 };
        for (int i = 0; i < 4; i++) {
            best[i] = d[i] < best[i] ? d[i] : best[i];
        }
    }
    printf("impl=%s n_kv=%d head_dim=%d n_q=%d T=%d bits=%d k_row=%zu v_row=%zu fp16_row=%d "
           "kvq_k_ms=%.4f kvq_v_ms=%.4f f16_k_ms=%.4f f16_v_ms=%.4f\n",
           ggml_ext_kvquant_kernel(L), n_kv, hd, G, T, bits, kr, vr, 2 * D, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3,
           best[3] * 1e3);
    return 0;
}
