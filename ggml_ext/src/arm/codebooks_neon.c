// NEON (dotprod) kernels of the codebooks family (CB2 / CB3 x Q8_K). For each sub-group s of 16
// weights the table index of all 16 codes is formed with bit operations on one vector: the 16 code
// bytes shifted down to s's bit pair, then shift-inserted (vsli) under the codebook index, which keeps
// the code's low bits and puts the codebook above them:
//   CB2: idx = c << 2 | q          one vqtbl1q_s8 into the 4 codebooks x 4 entries (16 bytes);
//   CB3: q = hbit << 2 | q2 (vsli), idx = c << 3 | q, one vqtbl2q_s8 into 4 x 8 entries (32 bytes).
// The decoded int8 weights meet the Q8_K activations in SDOT (vdotq_s32), multiplied by the
// sub-group's l + 1 (vmlaq_n_s32), summed over the block and scaled once by d_w * d_a. Each weight
// block is decoded once for up to 8 activation rows.
#include "common/simd.h"
#include "formats/codebooks/codebooks.h"

#ifdef GGML_EXT_HAVE_NEON_DOTPROD

#    include "common/fp16.h"
#    include "formats/codebooks/codebooks_tables.h"

#    include <arm_neon.h>

#    define ROWS 8

GGML_EXT_INLINE void mm(const int bits, GGML_EXT_CODEBOOKS_MM_ARGS) {
    const int8x16_t   t2 = vld1q_s8(&ggml_ext_cb2_tables[0][0]);
    const int8x16x2_t t3 = { { vld1q_s8(&ggml_ext_cb3_tables[0][0]), vld1q_s8(&ggml_ext_cb3_tables[2][0]) } };
    const int         nb  = n / GGML_EXT_QK_CB;
    const size_t      wbs = bits == 2 ? sizeof(ggml_ext_block_cb2) : sizeof(ggml_ext_block_cb3);
    const ggml_ext_block_q8_K * ay = (const ggml_ext_block_q8_K *) vy;

    for (int r0 = 0; r0 < nr; r0 += ROWS) {
        const int rn = nr - r0 < ROWS ? nr - r0 : ROWS;
        for (int c = 0; c < nc; c++) {
            const uint8_t * wrow = (const uint8_t *) vx + (size_t) c * nb * wbs;
            float           acc[ROWS] = { 0 };
            for (int b = 0; b < nb; b++) {
                const ggml_ext_block_cb3 * y = (const ggml_ext_block_cb3 *) (wrow + b * wbs);
                int8x16_t                  w[16];
                int32_t                    m[16];
                GGML_EXT_UNROLL
                for (int s = 0; s < 16; s++) {
                    const uint8x16_t q  = vshlq_u8(vld1q_u8(y->qs + 16 * (s >> 2)), vdupq_n_s8((int8_t) (-2 * (s & 3))));
                    const uint8x16_t cb = vdupq_n_u8((uint8_t) ((y->cb[s >> 2] >> (2 * (s & 3))) & 3));
                    if (bits == 2) {
                        w[s] = vqtbl1q_s8(t2, vsliq_n_u8(q, cb, 2));
                    } else {
                        const uint8x16_t h = vshlq_u8(vld1q_u8(y->hmask + 16 * (s >> 3)), vdupq_n_s8((int8_t) (-(s & 7))));
                        w[s] = vqtbl2q_s8(t3, vsliq_n_u8(vsliq_n_u8(q, h, 2), cb, 3));
                    }
                    m[s] = ((y->scales[s >> 1] >> (4 * (s & 1))) & 15) + 1;
                }
                ggml_ext_fp16_t dh;
                memcpy(&dh, &y->d, sizeof(dh));
                const float dw = ggml_ext_fp16_to_fp32(dh);
                for (int r = 0; r < rn; r++) {
                    const ggml_ext_block_q8_K * a    = &ay[(size_t) (r0 + r) * nb + b];
                    int32x4_t                   isum = vdupq_n_s32(0);
                    GGML_EXT_UNROLL
                    for (int s = 0; s < 16; s++) {
                        const int32x4_t d = vdotq_s32(vdupq_n_s32(0), w[s], vld1q_s8(a->qs + 16 * s));
                        isum              = vmlaq_n_s32(isum, d, m[s]);
                    }
                    acc[r] += dw * a->d * (float) vaddvq_s32(isum);
                }
            }
            for (int r = 0; r < rn; r++) {
                s[(size_t) (r0 + r) * bs + c] = acc[r];
            }
        }
    }
}

static void mm_cb2(GGML_EXT_CODEBOOKS_MM_ARGS) {
    mm(2, n, s, bs, vx, vy, nr, nc);
}

static void mm_cb3(GGML_EXT_CODEBOOKS_MM_ARGS) {
    mm(3, n, s, bs, vx, vy, nr, nc);
}

const struct ggml_ext_codebooks_impl ggml_ext_codebooks_impl_neon_dotprod = { "neon-dotprod", NULL, { mm_cb2, mm_cb3 } };

#endif
