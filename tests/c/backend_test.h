// What the backend test programs (test_ext_ops.cpp, test_types_backends.cpp) share: the failure count
// and CHECK, the random numbers, and the backends to compare with the CPU (an RPC server given by
// --rpc HOST:PORT, every GPU in the ggml registry).
#pragma once

#include "ggml-backend.h"
#include "ggml-rpc.h"

#include <cstdint>
#include <cstdio>
#include <vector>

static int g_fails = 0;

#define CHECK(cond, ...)                                                \
    do {                                                                \
        if (!(cond)) {                                                  \
            std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::printf(__VA_ARGS__);                                   \
            std::printf("\n");                                          \
            g_fails++;                                                  \
        }                                                               \
    } while (0)

struct rng {
    uint64_t s;

    float next() {  // uniform in [-1, 1)
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (float) ((s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    }
};

// The backends other than the CPU: the RPC server at `rpc` (when not null) first, then every GPU;
// *n_gpu counts the GPUs.
static std::vector<ggml_backend_t> other_backends(const char * rpc, int * n_gpu) {
    std::vector<ggml_backend_t> others;
    if (rpc) {
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(rpc);
        CHECK(reg && ggml_backend_reg_dev_count(reg) > 0, "no device at rpc server %s", rpc);
        if (reg && ggml_backend_reg_dev_count(reg) > 0) {
            others.push_back(ggml_backend_dev_init(ggml_backend_reg_dev_get(reg, 0), nullptr));
        }
    }
    *n_gpu = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU) {
            others.push_back(ggml_backend_dev_init(dev, nullptr));
            (*n_gpu)++;
        }
    }
    return others;
}
