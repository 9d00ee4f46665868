// The codebooks family's scalar reference kernels (the twin every SIMD kernel is tested against):
// Q8_K activation quantization and CB2 / CB3 x Q8_K dot products, written as the format reads
// (docs/formats/codebooks.md): per sub-group s of 16 weights, codebook c_s, multiplier m_s = l_s + 1,
//     dot(block) = d_w * d_a * sum_s m_s * sum_j T[c_s][q_j] * a_j      (integer inner sums).
#include "common/fp16.h"
#include "formats/codebooks/codebooks.h"
#include "formats/codebooks/codebooks_tables.h"

#include <math.h>

_Static_assert(sizeof(ggml_ext_block_q8_K) == 292, "ggml's block_q8_K: fp32 d, 256 int8, 16 int16 sums");

void ggml_ext_codebooks_quantize_row_q8_K(const float * x, void * vy, int64_t k) {
    ggml_ext_block_q8_K * y = (ggml_ext_block_q8_K *) vy;
    for (int64_t b = 0; b < k / GGML_EXT_QK_CB; b++, x += GGML_EXT_QK_CB) {
        float amax = 0.0f;
        for (int j = 0; j < GGML_EXT_QK_CB; j++) {
            amax = fmaxf(amax, fabsf(x[j]));
        }
        const float d  = amax / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        y[b].d         = d;
        for (int g = 0; g < GGML_EXT_QK_CB / 16; g++) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                int q = (int) lrintf(x[j] * id);
                q     = q > 127 ? 127 : q < -127 ? -127 : q;
                y[b].qs[j] = (int8_t) q;
                sum += q;
            }
            y[b].bsums[g] = (int16_t) sum;
        }
    }
}

// One block's integer sum_s m_s * sum_j T[c_s][q_j] * a_j.
static int32_t block_dot(int bits, const uint8_t * w, const int8_t * a) {
    const ggml_ext_block_cb3 * y = (const ggml_ext_block_cb3 *) w;  // CB2's fields are CB3's first ones
    int32_t                    sum = 0;
    for (int s = 0; s < GGML_EXT_CODEBOOKS_NGROUPS; s++) {
        const int m = ((y->scales[s >> 1] >> (4 * (s & 1))) & 15) + 1;
        const int c = (y->cb[s >> 2] >> (2 * (s & 3))) & 3;
        int32_t   g = 0;
        for (int j = 0; j < GGML_EXT_CODEBOOKS_GROUP; j++) {
            int q = (y->qs[16 * (s >> 2) + j] >> (2 * (s & 3))) & 3;
            if (bits == 3) {
                q |= ((y->hmask[16 * (s >> 3) + j] >> (s & 7)) & 1) << 2;
            }
            const int t = bits == 2 ? ggml_ext_cb2_tables[c][q] : ggml_ext_cb3_tables[c][q];
            g += t * a[s * GGML_EXT_CODEBOOKS_GROUP + j];
        }
        sum += m * g;
    }
    return sum;
}

static void mm(int bits, GGML_EXT_CODEBOOKS_MM_ARGS) {
    const int     nb    = n / GGML_EXT_QK_CB;
    const size_t  wbs   = ggml_ext_codebooks_block_size(bits);
    const uint8_t * wx  = (const uint8_t *) vx;
    const ggml_ext_block_q8_K * ay = (const ggml_ext_block_q8_K *) vy;
    for (int r = 0; r < nr; r++) {
        for (int c = 0; c < nc; c++) {
            const uint8_t * w   = wx + (size_t) c * nb * wbs;
            float           sum = 0.0f;
            for (int b = 0; b < nb; b++) {
                ggml_ext_fp16_t dh;
                memcpy(&dh, w + b * wbs, sizeof(dh));
                const ggml_ext_block_q8_K * a = &ay[(size_t) r * nb + b];
                sum += ggml_ext_fp16_to_fp32(dh) * a->d * (float) block_dot(bits, w + b * wbs, a->qs);
            }
            s[(size_t) r * bs + c] = sum;
        }
    }
}

static void mm_cb2(GGML_EXT_CODEBOOKS_MM_ARGS) {
    mm(2, n, s, bs, vx, vy, nr, nc);
}

static void mm_cb3(GGML_EXT_CODEBOOKS_MM_ARGS) {
    mm(3, n, s, bs, vx, vy, nr, nc);
}

const struct ggml_ext_codebooks_impl ggml_ext_codebooks_impl_generic = { "generic", NULL, { mm_cb2, mm_cb3 } };
