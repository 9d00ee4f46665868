// The KVQuant cache types' CUDA block functions (ggml_ext/src/cuda/kvquant_decode.cuh: what the SET_ROWS / CPY /
// GET_ROWS / flash-attention kernels of kvquant_cuda.cu run per block and per value) on the host against the CPU
// row functions (ggml's from_float_ref / to_float of NUQ4 / NUQ3 / NUQ2, ggml/kvquant_base.c): for each type, value
// and pre-RoPE key caches, without and with outlier slots, without and with the float sink, and memory outside every
// binding (uniform levels), rows of random values (some far outside the key ranges, a NaN, an infinity) quantized by
// both must give the same bytes, and every value read back the same bits (NaN where the CPU has NaN). The kernel
// arguments come from ggml-base's view of the binding (ggml_ext_kvq_binding_find / _sinks, kvquant_device.h), as
// kvquant_cuda.cu builds them. Host code only: built with nvcc and run without a GPU by
// tests/cuda/test_kvquant_cuda.py. The kernels on a GPU against the CPU: tests/c/test_kvquant_cuda.cpp.
#include "ggml-cpu.h"
#include "ggml-ext-kvq.h"
#include "ggml-ext.h"
#include "ggml.h"
#include "ggml/kvquant_device.h"
#include "kvquant_decode.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static int fails = 0;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
            std::printf(__VA_ARGS__);                                        \
            std::printf("\n");                                               \
            fails++;                                                         \
        }                                                                    \
    } while (0)

static const int N_ROWS = 9;

static void check(int type, bool key, bool outliers, int n_sink, bool bound, int * n_slots) {
    const ggml_ext_type_info * ti   = ggml_ext_type_info_by_id(type);
    const int                  bits = ti->layout;
    const int                  D    = key ? 192 : 128;
    const size_t               bs = ti->type_size, row_bytes = (size_t) D / 64 * bs;
    std::mt19937               gen(1000 * type + 100 * key + 10 * outliers + n_sink + 5 * bound);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int                  n = 1 << bits;
    float                      levels[16] = {}, values[16] = {};
    for (int i = 0; i < n; i++) {
        levels[i] = -1.0f + 2.0f * i / (n - 1) + (i > 0 && i < n - 1 ? 0.2f / n * u(gen) : 0.0f);
    }
    std::sort(levels, levels + n);
    for (int i = 0; i < n; i++) {
        values[i] = levels[i] * (1.0f + 0.05f * u(gen));
    }
    std::vector<float> mid(D), half(D);
    for (int c = 0; c < D; c++) {
        mid[c]  = 0.3f * u(gen);
        half[c] = 0.6f + 0.3f * u(gen);
    }
    std::vector<float> x((size_t) N_ROWS * D);
    for (int r = 0; r < N_ROWS; r++) {
        for (int c = 0; c < D; c++) {
            const float v = u(gen);
            x[(size_t) r * D + c] = key ? mid[c] + half[c] * (std::fabs(v) > 0.96f ? 3.0f * v : 0.9f * v) : 2.0f * v + 0.3f;
        }
    }
    x[3 * D + 70] = NAN;
    x[5 * D + 1]  = INFINITY;
    x[6 * D + 2]  = 30.0f;
    std::vector<uint8_t> ref(N_ROWS * row_bytes + 8), mine(ref.size());
    char                 err[256] = "";
    if (bound) {
        const int rc = ggml_ext_kvq_bind_opts(ref.data(), N_ROWS * row_bytes, type, D, levels, values,
                                              key ? mid.data() : nullptr, key ? half.data() : nullptr, outliers, n_sink,
                                              err, sizeof(err));
        CHECK(rc == 0, "bind: %s", err);
        std::vector<uint32_t> cells(N_ROWS);
        std::vector<int32_t>  pos(N_ROWS);
        for (int r = 0; r < N_ROWS; r++) {
            cells[r] = (uint32_t) r, pos[r] = r == 4 ? 0 : 10 + r;  // row 4 holds position 0: a sink row
        }
        ggml_ext_kvq_rows_written(ref.data(), row_bytes, cells.data(), pos.data(), N_ROWS);
    }
    // the kernels' arguments, as kvquant_cuda.cu's args_for makes them, on host memory
    ggml_ext_kvq_binding_desc d;
    CHECK(ggml_ext_kvq_binding_find(ref.data(), type, &d), "find");
    kvq::kvq_args a = {};
    a.bits = d.bits, a.block_bytes = (int) d.block_bytes, a.dense_bytes = 64 * d.bits / 8;
    std::memcpy(a.values, d.values, sizeof(a.values));
    std::memcpy(a.mids, d.mids, sizeof(a.mids));
    std::vector<int64_t> sink(1 + (d.sink_cap > 0 ? d.sink_cap : 0), 0);
    std::vector<float>   sink_data((size_t) (d.sink_cap > 0 ? d.sink_cap : 0) * D);
    if (d.lo) {
        a.lo = (const char *) mine.data();  // the shadow's own addresses: channels and rows follow from offsets
        a.row_blocks = d.row_blocks, a.k_mid = d.k_mid, a.k_half = d.k_half, a.outliers = d.outliers;
        a.row_values = d.row_values;
        if (d.n_sink > 0) {
            sink[0]     = ggml_ext_kvq_binding_sinks(d.lo, d.serial, sink.data() + 1, d.sink_cap);
            a.sink      = sink.data();
            a.sink_data = sink_data.data();
            a.row_bytes = (int64_t) row_bytes;
            CHECK(sink[0] >= 1, "the sink row is not marked (%lld slots)", (long long) sink[0]);
        }
    }
    CHECK((d.lo != nullptr) == bound, "binding found %d", d.lo != nullptr);
    // quantize: the CPU's from_float_ref per row, the kernel's per block (sink floats first, as k_quantize)
    const ggml_type_traits * tr = ggml_get_type_traits((ggml_type) type);
    for (int r = 0; r < N_ROWS; r++) {
        tr->from_float_ref(&x[(size_t) r * D], ref.data() + r * row_bytes, D);
        for (int b = 0; b < D / 64; b++) {
            uint8_t * blk = mine.data() + r * row_bytes + b * bs;
            int64_t   off;
            const int s = kvq::sink_slot(a, (const char *) blk, &off);
            if (s >= 0) {
                std::memcpy(&sink_data[(size_t) s * D + off], &x[(size_t) r * D + b * 64], 64 * sizeof(float));
            }
            kvq::quantize_block(a, &x[(size_t) r * D + b * 64], blk);
        }
    }
    int64_t diff = 0;
    for (size_t i = 0; i < N_ROWS * row_bytes; i++) {
        diff += ref[i] != mine[i];
    }
    const char * what = key ? "keys" : "values";
    CHECK(diff == 0, "%s %s outliers %d sink %d bound %d: %lld bytes differ", ti->ggml_name, what, outliers, n_sink,
          bound, (long long) diff);
    for (size_t o = 0; o < N_ROWS * row_bytes; o += bs) {
        uint16_t w[4];
        std::memcpy(w, &ref[o + 64 * bits / 8], sizeof(w));
        *n_slots += ((w[0] & 0xffc0) == 0x8000) + ((w[2] & 0xffc0) == 0x8000);
    }
    // dequantize every value: the CPU's to_float per row, the kernel's per value
    int64_t vdiff = 0, exact_sink = 0;
    std::vector<float> y(D);
    for (int r = 0; r < N_ROWS; r++) {
        tr->to_float(ref.data() + r * row_bytes, y.data(), D);
        for (int c = 0; c < D; c++) {
            const float g = kvq::dequantize_value(a, (const char *) mine.data() + r * row_bytes + c / 64 * bs, c % 64);
            vdiff += !(std::isnan(g) && std::isnan(y[c])) && std::memcmp(&g, &y[c], 4) != 0;
            exact_sink += r == 4 && g == x[(size_t) r * D + c];
        }
    }
    CHECK(vdiff == 0, "%s %s outliers %d sink %d bound %d: %lld values differ", ti->ggml_name, what, outliers, n_sink,
          bound, (long long) vdiff);
    CHECK((n_sink && bound) ? exact_sink == D : exact_sink < D, "sink row: %lld of %d exact", (long long) exact_sink, D);
    if (bound) {
        ggml_ext_kvq_unbind(ref.data());
    }
}

int main() {
    ggml_cpu_init();
    for (const char * name : { "nuq4", "nuq3", "nuq2" }) {
        const int type    = ggml_ext_kv_cache_type_by_name(name);
        int       n_slots = 0, cases = 0;
        for (int key = 0; key < 2; key++) {
            for (int outliers = 0; outliers < 2; outliers++) {
                for (int sink = 0; sink < 2; sink++) {
                    check(type, key, outliers, sink, true, &n_slots);
                    cases++;
                }
            }
        }
        check(type, false, false, 0, false, &n_slots);  // outside every binding: uniform levels
        cases++;
        CHECK(n_slots > 0, "%s: no outlier slot written", name);
        std::printf("%s: %d cases checked (%d outlier slots)\n", name, cases, n_slots);
    }
    std::printf("%s: %d failures\n", fails ? "FAIL" : "OK", fails);
    return fails ? 1 : 0;
}
