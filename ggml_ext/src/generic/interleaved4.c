// Scalar reference kernels of the interleaved4 family: Q8_0 activation quantizers and the twin of
// every SIMD GEMV/GEMM. Plain C11, any CPU. The two value sets share everything but the weight
// decode: Q4_0 stores bytes XOR 0x88 (nibble - 8 as two's complement), IQ4_NL stores plain
// nibbles that index kvalues.
#include "formats/interleaved4/interleaved4_impl.h"

#include <math.h>

#define QK 32

// ---------------------------------------------------------------- Q8_0 activations

// One Q8_0 block: d = amax / 127, q = round(x / d) with ties away from zero (roundf).
static void quantize_block_q8_0(const float * x, ggml_ext_fp16_t * d_out, int8_t q[QK]) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
    }
    const float d  = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    *d_out         = ggml_ext_fp32_to_fp16(d);
    for (int j = 0; j < QK; j++) {
        q[j] = (int8_t) roundf(x[j] * id);
    }
}

void ggml_ext_quantize_row_q8_0_ref(const float * x, ggml_ext_block_q8_0 * y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) {
        quantize_block_q8_0(x + i * QK, &y[i].d, y[i].qs);
    }
}

static void quantize_row_q8_0_generic(const float * x, void * vy, int64_t k) {
    ggml_ext_quantize_row_q8_0_ref(x, (ggml_ext_block_q8_0 *) vy, k);
}

// Four rows, interleaved in chunks of B bytes: byte j of row r -> qs[((j/B)*4 + r)*B + j%B].
static void quantize_mat_q8_0_x4(const float * x, ggml_ext_block_q8_0x4 * y, int64_t k, int B) {
    for (int64_t i = 0; i < k / QK; i++) {
        for (int r = 0; r < 4; r++) {
            int8_t q[QK];
            quantize_block_q8_0(x + r * k + i * QK, &y[i].d[r], q);
            for (int j = 0; j < QK; j++) {
                y[i].qs[((j / B) * 4 + r) * B + j % B] = q[j];
            }
        }
    }
}

static void quantize_mat_q8_0_4x4_generic(const float * x, void * vy, int64_t k) {
    quantize_mat_q8_0_x4(x, (ggml_ext_block_q8_0x4 *) vy, k, 4);
}

static void quantize_mat_q8_0_4x8_generic(const float * x, void * vy, int64_t k) {
    quantize_mat_q8_0_x4(x, (ggml_ext_block_q8_0x4 *) vy, k, 8);
}

// ---------------------------------------------------------------- kernels

// Activation byte k of row r: a plain Q8_0 row (AB = 0), or row r of four rows
// interleaved in chunks of AB bytes.
static inline int8_t act_byte(const int8_t * a, int AB, int r, int k) {
    return AB ? a[((k / AB) * 4 + r) * AB + k % AB] : a[k];
}

// Integer dot product of weight row j of an interleaved block with activation row r.
// Q4_0 (kv NULL): the XORed nibble is q - 8 in two's complement: (byte << 4) and
// (byte & 0xF0), read as int8, are the two weights times 16; divide once at the end.
// IQ4_NL: the nibbles index kv.
static inline int32_t dot_interleaved(const uint8_t * qs, int N, int B, int j, const int8_t * a, int AB, int r,
                                      const int8_t * kv) {
    int32_t sum = 0;
    for (int k = 0; k < QK / 2; k++) {
        const uint8_t byte = qs[((k / B) * N + j) * B + k % B];  // weights k and k + 16 of row j
        const int     lo   = kv ? kv[byte & 0x0f] : (int8_t) (uint8_t) (byte << 4);
        const int     hi   = kv ? kv[byte >> 4] : (int8_t) (byte & 0xf0);
        sum += lo * act_byte(a, AB, r, k) + hi * act_byte(a, AB, r, k + QK / 2);
    }
    return kv ? sum : sum / 16;  // Q4_0: exact, every term is a multiple of 16
}

static void gemv_generic(const int8_t * kv, int N, int B, int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    const int    nb        = n / QK;
    const size_t blk_bytes = (size_t) N * sizeof(ggml_ext_block_q4_0);
    for (int y = 0; y < nr; y++) {
        const ggml_ext_block_q8_0 * a = (const ggml_ext_block_q8_0 *) vy + (size_t) y * nb;
        for (int g = 0; g < nc / N; g++) {
            float sumf[8] = { 0 };
            for (int b = 0; b < nb; b++) {
                const uint8_t *         blk = (const uint8_t *) vx + ((size_t) g * nb + b) * blk_bytes;
                const ggml_ext_fp16_t * d   = (const ggml_ext_fp16_t *) blk;
                const float             da  = ggml_ext_fp16_to_fp32(a[b].d);
                for (int j = 0; j < N; j++) {
                    const int32_t sumi = dot_interleaved(blk + N * 2, N, B, j, a[b].qs, 0, 0, kv);
                    sumf[j] += (float) sumi * (ggml_ext_fp16_to_fp32(d[j]) * da);
                }
            }
            for (int j = 0; j < N; j++) {
                s[(size_t) y * bs + g * N + j] = sumf[j];
            }
        }
    }
}

// Activations: nr/4 groups of nb ggml_ext_block_q8_0x4 interleaved with chunk AB.
static void gemm_generic(const int8_t * kv, int N, int B, int AB, int n, float * s, size_t bs, const void * vx, const void * vy, int nr,
                         int nc) {
    const int    nb        = n / QK;
    const size_t blk_bytes = (size_t) N * sizeof(ggml_ext_block_q4_0);
    for (int t = 0; t < nr / 4; t++) {
        const ggml_ext_block_q8_0x4 * a = (const ggml_ext_block_q8_0x4 *) vy + (size_t) t * nb;
        for (int g = 0; g < nc / N; g++) {
            float sumf[4][8] = { { 0 } };
            for (int b = 0; b < nb; b++) {
                const uint8_t *         blk = (const uint8_t *) vx + ((size_t) g * nb + b) * blk_bytes;
                const ggml_ext_fp16_t * d   = (const ggml_ext_fp16_t *) blk;
                for (int r = 0; r < 4; r++) {
                    const float da = ggml_ext_fp16_to_fp32(a[b].d[r]);
                    for (int j = 0; j < N; j++) {
                        const int32_t sumi = dot_interleaved(blk + N * 2, N, B, j, a[b].qs, AB, r, kv);
                        sumf[r][j] += (float) sumi * (ggml_ext_fp16_to_fp32(d[j]) * da);
                    }
                }
            }
            for (int r = 0; r < 4; r++) {
                for (int j = 0; j < N; j++) {
                    s[(size_t) (4 * t + r) * bs + g * N + j] = sumf[r][j];
                }
            }
        }
    }
}

// One GEMV and one GEMM per (values, layout): the bodies above with their constants bound.
#define KERNELS(values, KV, N, B, AB)                                      \
    static void gemv_##values##_##N##x##B##_generic(GGML_EXT_INTERLEAVED4_MM_ARGS) { \
        gemv_generic(KV, N, B, n, s, bs, vx, vy, nr, nc);                 \
    }                                                                     \
    static void gemm_##values##_##N##x##B##_generic(GGML_EXT_INTERLEAVED4_MM_ARGS) { \
        gemm_generic(KV, N, B, AB, n, s, bs, vx, vy, nr, nc);             \
    }
KERNELS(q4_0, NULL, 4, 4, 4)
KERNELS(q4_0, NULL, 4, 8, 8)
KERNELS(q4_0, NULL, 8, 8, 8)
KERNELS(iq4_nl, ggml_ext_kvalues_iq4nl, 4, 4, 4)
KERNELS(iq4_nl, ggml_ext_kvalues_iq4nl, 4, 8, 8)
KERNELS(iq4_nl, ggml_ext_kvalues_iq4nl, 8, 8, 8)

const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_generic = {
    .name                  = "generic",
    .quantize_row_q8_0     = quantize_row_q8_0_generic,
    .quantize_mat_q8_0_4x4 = quantize_mat_q8_0_4x4_generic,
    .quantize_mat_q8_0_4x8 = quantize_mat_q8_0_4x8_generic,
    .gemv                  = GGML_EXT_INTERLEAVED4_TABLE(gemv, generic),
    .gemm                  = GGML_EXT_INTERLEAVED4_TABLE(gemm, generic),
};
