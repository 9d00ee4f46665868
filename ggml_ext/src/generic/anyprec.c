// Scalar reference GEMV of the any-precision bitplanes (formats/anyprec/anyprec.h): the twin the
// SIMD kernels (x86/anyprec_avx2.c, arm/anyprec_neon.c) are tested against. Reads the first b
// planes and precision b's fp16 table only. Plain C11, any CPU.
#include "formats/anyprec/anyprec.h"

#include "common/fp16.h"

int ggml_ext_anyprec_gemv_ref(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                              int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x, float * y) {
    if (bits < seed_bits || bits < 1 || bits > GGML_EXT_ANYPREC_MAX_BITS || n_per_row % GGML_EXT_ANYPREC_QK || r0 < 0 ||
        r0 + nr > n_rows) {
        return -1;
    }
    const int64_t row_bytes   = n_per_row / 8;
    const size_t  plane_bytes = (size_t) n_rows * (size_t) row_bytes;
    float         lut[256];
    for (int64_t r = 0; r < nr; r++) {
        const ggml_ext_fp16_t * t = tables + ggml_ext_anyprec_table_offset(n_rows, seed_bits, bits) + (r0 + r) * (1 << bits);
        for (int c = 0; c < (1 << bits); c++) {
            lut[c] = ggml_ext_fp16_to_fp32(t[c]);
        }
        const uint8_t * row = planes + (size_t) (r0 + r) * (size_t) row_bytes;
        float           acc[8] = { 0 };
        for (int64_t i = 0; i < row_bytes; i++) {  // 8 weights: bit l of byte i of each plane
            uint8_t pb[GGML_EXT_ANYPREC_MAX_BITS];
            for (int k = 0; k < bits; k++) {
                pb[k] = row[(size_t) k * plane_bytes + (size_t) i];
            }
            for (int l = 0; l < 8; l++) {
                int code = 0;
                for (int k = 0; k < bits; k++) {
                    code = (code << 1) | ((pb[k] >> l) & 1);
                }
                acc[l] += lut[code] * x[8 * i + l];
            }
        }
        y[r] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
    return 0;
}
