// What the host-side CUDA checks of the KVQuant cache (kvquant_cuda_check.cu) and of its decode op
// (kvattn_cuda_check.cu) share: the failure count and CHECK, and random tables / per-channel scales of the shape
// `ggml-ext calibrate kv` writes (sorted levels near the uniform grid, values near the levels).
#pragma once

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

static int fails = 0;

#define CHECK(cond, ...)                                                \
    do {                                                                \
        if (!(cond)) {                                                  \
            std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::printf(__VA_ARGS__);                                   \
            std::printf("\n");                                          \
            fails++;                                                    \
        }                                                               \
    } while (0)

// 2^bits sorted levels in [-1, 1] (the end levels exact) and their dequantization values
static void random_table(std::mt19937 & gen, int bits, float * levels, float * values) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int                             n = 1 << bits;
    for (int i = 0; i < n; i++) {
        levels[i] = -1.0f + 2.0f * i / (n - 1) + (i > 0 && i < n - 1 ? 0.2f / n * u(gen) : 0.0f);
    }
    std::sort(levels, levels + n);
    for (int i = 0; i < n; i++) {
        values[i] = levels[i] * (1.0f + 0.05f * u(gen));
    }
}

// per-channel key scales: mid in [-0.3, 0.3], half in [0.3, 0.9]
static void random_scales(std::mt19937 & gen, std::vector<float> & mid, std::vector<float> & half) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t i = 0; i < mid.size(); i++) {
        mid[i]  = 0.3f * u(gen);
        half[i] = 0.6f + 0.3f * u(gen);
    }
}
