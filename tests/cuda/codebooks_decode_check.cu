// The codebook types' CUDA bit reading (ggml_ext/src/cuda/codebooks_decode.cuh) run on the host against the
// C reference: for CB2 and CB3 rows quantized by ggml_quantize_chunk, every weight as the dequantize kernel
// reads it (cb_code_index, cb_mult) and as each mat-vec lane reads it (cb_lane_load + cb_lane_unpack: 32 lanes x 4
// sub-groups x 2 weights, every weight of the block exactly once), and as each lane quarter of the integer
// (q8_1 / dp4a) mat-vec decodes it to int8 (cb_q8_load + cb_q8_unpack: 4 quarters x 4 sub-groups x 16 weights,
// byte permutes of the packed tables) must equal ggml's to_float of the type bit
// for bit (the kernels compute d * (l + 1) * T[c][q] in the reference's order). Host code only: built with
// nvcc and run without a GPU by tests/cuda/test_codebooks_cuda_decode.py.
#include "codebooks_decode.cuh"
#include "ggml.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static int fails = 0;

template <int BITS> static void check(ggml_type type) {
    using block      = typename cb_traits<BITS>::block;
    const int64_t K = 1024, N = 24;  // 4 blocks per row
    std::mt19937 gen(BITS);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<float> w(K * N), ref(K * N);
    for (auto & v : w) {
        v = dist(gen);
    }
    for (int64_t i = 0; i < N; i++) {  // rows with outliers, an all-zero sub-group and a constant one
        w[i * K + 7] *= 40.0f;
    }
    std::fill(w.begin() + 3 * K + 32, w.begin() + 3 * K + 48, 0.0f);
    std::fill(w.begin() + 5 * K + 64, w.begin() + 5 * K + 80, -0.05f);
    std::vector<uint8_t> q(ggml_row_size(type, K) * N);
    ggml_quantize_chunk(type, w.data(), q.data(), 0, N, K, nullptr);
    ggml_get_type_traits(type)->to_float(q.data(), ref.data(), K * N);
    const cb_tables tab = cb_make_tables<BITS>();
    const cb_qtables qtab = cb_make_qtables<BITS>();
    const block *   blocks = (const block *) q.data();
    for (int64_t ib = 0; ib < K * N / GGML_EXT_QK_CB; ib++) {
        const block * b = blocks + ib;
        ggml_fp16_t   dh;
        std::memcpy(&dh, &b->d, sizeof(dh));
        const float   d   = ggml_fp16_to_fp32(dh);
        const float * r   = ref.data() + ib * GGML_EXT_QK_CB;
        for (int s = 0; s < GGML_EXT_CODEBOOKS_NGROUPS; s++) {  // the dequantize kernel's reading
            const float dm = d * (float) cb_mult<BITS>(b, s);
            for (int jj = 0; jj < GGML_EXT_CODEBOOKS_GROUP; jj++) {
                const float v = dm * (float) tab.t[cb_code_index<BITS>(b, s, jj)];
                if (v != r[16 * s + jj] && fails++ < 10) {
                    std::printf("FAIL CB%d dequantize block %lld weight %d: %g != %g\n", BITS, (long long) ib,
                                16 * s + jj, v, r[16 * s + jj]);
                }
            }
        }
        int seen[GGML_EXT_QK_CB] = {};
        for (int lane = 0; lane < 32; lane++) {  // the mat-vec's reading
            int               idx[4][2], mult[4];
            const cb_lane_raw raw = cb_lane_load<BITS>(b, lane);  // as the mat-vec: load, then unpack
            cb_lane_unpack<BITS>(raw, lane, idx, mult);
            const float dl = ggml_fp16_to_fp32((ggml_fp16_t) raw.d);
            for (int p = 0; p < 4; p++) {
                for (int u = 0; u < 2; u++) {
                    const int   j = 16 * (4 * (lane >> 3) + p) + ((2 * lane) & 15) + u;
                    const float v = dl * (float) mult[p] * (float) tab.t[idx[p][u]];
                    seen[j]++;
                    if (v != r[j] && fails++ < 10) {
                        std::printf("FAIL CB%d mat-vec lane %d block %lld weight %d: %g != %g\n", BITS, lane,
                                    (long long) ib, j, v, r[j]);
                    }
                }
            }
        }
        for (int j = 0; j < GGML_EXT_QK_CB; j++) {
            if (seen[j] != 1 && fails++ < 10) {
                std::printf("FAIL CB%d mat-vec: weight %d read %d times\n", BITS, j, seen[j]);
            }
        }
        int seen8[GGML_EXT_QK_CB] = {};
        for (int t = 0; t < 4; t++) {  // the integer mat-vec's reading: lane quarter t, 4 sub-groups x 16 weights
            uint32_t        w8[4][4];
            int             mult[4];
            const cb_q8_raw raw = cb_q8_load<BITS>(b, t);
            cb_q8_unpack<BITS>(raw, t, qtab, w8, mult);
            const float dl = ggml_fp16_to_fp32((ggml_fp16_t) raw.d);
            for (int p = 0; p < 4; p++) {
                for (int i = 0; i < 4; i++) {
                    for (int k = 0; k < 4; k++) {
                        const int   j = 16 * (4 * t + p) + 4 * i + k;
                        const float v = dl * (float) mult[p] * (float) (int8_t) (w8[p][i] >> (8 * k));
                        seen8[j]++;
                        if (v != r[j] && fails++ < 10) {
                            std::printf("FAIL CB%d integer mat-vec quarter %d block %lld weight %d: %g != %g\n", BITS,
                                        t, (long long) ib, j, v, r[j]);
                        }
                    }
                }
            }
        }
        for (int j = 0; j < GGML_EXT_QK_CB; j++) {
            if (seen8[j] != 1 && fails++ < 10) {
                std::printf("FAIL CB%d integer mat-vec: weight %d read %d times\n", BITS, j, seen8[j]);
            }
        }
    }
    std::printf("CB%d: %lld blocks checked\n", BITS, (long long) (K * N / GGML_EXT_QK_CB));
}

int main() {
    check<2>(GGML_TYPE_CB2);
    check<3>(GGML_TYPE_CB3);
    std::printf("%s: %d failures\n", fails ? "FAILED" : "OK", fails);
    return fails ? 1 : 0;
}
