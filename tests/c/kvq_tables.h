// What the GPU tests of the KVQuant cache (test_kvquant_cuda.cpp) and of its decode op (test_kvattn_cuda.cpp)
// share: a random NUQ table of the shape `ggml-ext calibrate kv` writes. Include after backend_test.h (its rng).
#pragma once

#include <algorithm>
#include <cstdint>

struct tables {
    float levels[16], values[16];
};

// a random ascending table of 2^bits levels in [-1, 1] (ends at -1 / 1), values a little off the levels; the
// entries past 2^bits stay 0
static tables make_table(int bits, uint64_t seed) {
    rng       r{ seed };
    tables    t{};
    const int n = 1 << bits;
    for (int i = 0; i < n; i++) {
        t.levels[i] = -1.0f + 2.0f * (float) i / (float) (n - 1) + (i > 0 && i < n - 1 ? 0.2f / n * r.next() : 0.0f);
    }
    std::sort(t.levels, t.levels + n);
    for (int i = 0; i < n; i++) {
        t.values[i] = t.levels[i] * (1.0f + 0.05f * r.next());
    }
    return t;
}
