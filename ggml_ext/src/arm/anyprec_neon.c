// NEON GEMV of the any-precision bitplanes (formats/anyprec/anyprec_impl.h). Per 32 weights: one 32-bit
// word of each of the first b planes; each plane byte is duplicated over 8 lanes and tested against the
// lane's bit (vtst: the bit-transpose as 16 byte lanes, twice), the results AND-ed with the plane's weight
// 2^(b-1-k) and OR-ed into the codes; the codes index the row's float table (NEON has no gather: 32 loads)
// and multiply-accumulate with x in two 4-lane accumulators (weights j mod 8 in 0..3 and 4..7, the
// scalar twin's lanes). Several tokens (ggml_ext_anyprec_gemv_tokens): the codes and loads of each 32 weights
// serve up to four activation rows, each row summed in the one-row order.
#include "formats/anyprec/anyprec_impl.h"

#if defined(GGML_EXT_HAVE_NEON)
#    include "common/fp16.h"

#    include <arm_neon.h>

// rows r0 .. r0 + nr for G activation rows x[0..G) into y[0..G) (G constant once inlined): each 32 weights' codes
// and table loads done once and multiplied into every row's two accumulators, in the one-row order (each row's
// result is the one-row call's, bit for bit)
GGML_EXT_INLINE void apq_rows(const uint8_t * planes, const ggml_ext_fp16_t * tab, int64_t r0, int64_t nr,
                              int64_t row_bytes, size_t plane_bytes, int bits, const float * const * x,
                              float * const * y, const int G) {
    static const uint8_t bitsel_b[16] = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
    const uint8x16_t bitsel          = vld1q_u8(bitsel_b);
    float            lut[256];
    for (int64_t r = 0; r < nr; r++) {
        const ggml_ext_fp16_t * t = tab + (r0 + r) * (1 << bits);
        for (int c = 0; c < (1 << bits); c++) {
            lut[c] = ggml_ext_fp16_to_fp32(t[c]);
        }
        const uint8_t * row = planes + (size_t) (r0 + r) * (size_t) row_bytes;
        float32x4_t     a0[4], a1[4];
        for (int q = 0; q < G; q++) {
            a0[q] = vdupq_n_f32(0.0f);
            a1[q] = vdupq_n_f32(0.0f);
        }
        for (int64_t i = 0; i < row_bytes; i += 4) {
            uint8x16_t c0 = vdupq_n_u8(0), c1 = vdupq_n_u8(0);
            for (int k = 0; k < bits; k++) {
                const uint8_t *  p  = row + (size_t) k * plane_bytes + (size_t) i;
                const uint8x16_t wk = vdupq_n_u8((uint8_t) (1 << (bits - 1 - k)));
                const uint8x16_t v0 = vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1]));
                const uint8x16_t v1 = vcombine_u8(vdup_n_u8(p[2]), vdup_n_u8(p[3]));
                c0 = vorrq_u8(c0, vandq_u8(vtstq_u8(v0, bitsel), wk));
                c1 = vorrq_u8(c1, vandq_u8(vtstq_u8(v1, bitsel), wk));
            }
            uint8_t codes[32];
            vst1q_u8(codes, c0);
            vst1q_u8(codes + 16, c1);
            for (int g = 0; g < 4; g++) {
                const uint8_t *   cg    = codes + 8 * g;
                const float       lo[4] = { lut[cg[0]], lut[cg[1]], lut[cg[2]], lut[cg[3]] };
                const float       hi[4] = { lut[cg[4]], lut[cg[5]], lut[cg[6]], lut[cg[7]] };
                const float32x4_t vlo = vld1q_f32(lo), vhi = vld1q_f32(hi);
                for (int q = 0; q < G; q++) {
                    const float * xi = x[q] + 8 * i;
                    a0[q]            = vfmaq_f32(a0[q], vlo, vld1q_f32(xi + 8 * g));
                    a1[q]            = vfmaq_f32(a1[q], vhi, vld1q_f32(xi + 8 * g + 4));
                }
            }
        }
        for (int q = 0; q < G; q++) {
            const float32x4_t s  = vaddq_f32(a0[q], a1[q]);                       // a0+a4, a1+a5, a2+a6, a3+a7
            const float32x2_t s2 = vadd_f32(vget_low_f32(s), vget_high_f32(s));  // (a0+a4)+(a2+a6), (a1+a5)+(a3+a7)
            y[q][r]              = vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
        }
    }
}

// a pass of up to four rows: 8 accumulators of the 32 registers
static void rows_neon(const uint8_t * planes, const struct ggml_ext_anyprec_gemv_geo * g, int64_t r0, int64_t nr,
                      int bits, const float * const * x, float * const * y, int G) {
    switch (G) {
        case 1: apq_rows(planes, g->tab, r0, nr, g->row_bytes, g->plane_bytes, bits, x, y, 1); break;
        case 2: apq_rows(planes, g->tab, r0, nr, g->row_bytes, g->plane_bytes, bits, x, y, 2); break;
        case 3: apq_rows(planes, g->tab, r0, nr, g->row_bytes, g->plane_bytes, bits, x, y, 3); break;
        default: apq_rows(planes, g->tab, r0, nr, g->row_bytes, g->plane_bytes, bits, x, y, 4); break;
    }
}

int ggml_ext_anyprec_gemv_tokens_neon(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                      int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                      const float * const * x, float * const * y) {
    return ggml_ext_anyprec_gemv_tokens_by(rows_neon, 4, planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits,
                                           n_tok, x, y);
}

// (the one-row loop inlined here, not called through the several-row entry: bench/arm_instruction_counts.py counts
// this function's loop)
int ggml_ext_anyprec_gemv_neon(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                               int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x, float * y) {
    struct ggml_ext_anyprec_gemv_geo g;
    if (!ggml_ext_anyprec_gemv_geo_of(tables, r0, nr, n_rows, n_per_row, seed_bits, bits, 1, &g)) {
        return -1;
    }
    apq_rows(planes, g.tab, r0, nr, g.row_bytes, g.plane_bytes, bits, &x, &y, 1);
    return 0;
}
#endif
