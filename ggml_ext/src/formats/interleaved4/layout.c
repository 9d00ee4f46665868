// The interleaved4 family's bytes, in plain C for any CPU: the Q4_0 reference quantizer (bit-identical
// to ggml's), row dequantizers for both value sets, and the layout transforms between plain
// Q4_0 / IQ4_NL tensors and the interleaved layouts (docs/formats/interleaved4.md).
#include "formats/interleaved4/interleaved4_impl.h"

#include <math.h>

#define QK 32

// ---------------------------------------------------------------- Q4_0 / IQ4_NL blocks

// x * id rounded to float, then + 8.5 rounded to float, truncated: as ggml. A compiler
// allowed to contract (GCC's default -ffp-contract=fast outside ISO mode, on any target
// with fma) would fuse the two into one fma and round once, which changes some nibbles:
// contraction is switched off for this function.
GGML_EXT_NO_FP_CONTRACT void ggml_ext_quantize_row_q4_0_ref(const float * x, ggml_ext_block_q4_0 * y, int64_t k) {
#if defined(__clang__)
#    pragma STDC FP_CONTRACT OFF
#endif
    const int64_t nb = k / QK;
    for (int64_t i = 0; i < nb; i++) {
        const float * xb   = x + i * QK;
        float         amax = 0.0f;  // the value of largest magnitude, first one on ties
        float         max  = 0.0f;
        for (int j = 0; j < QK; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max  = xb[j];
            }
        }
        const float d  = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d         = ggml_ext_fp32_to_fp16(d);
        for (int j = 0; j < QK / 2; j++) {
            const float   x0  = xb[j] * id;
            const float   x1  = xb[j + QK / 2] * id;
            const int8_t  t0  = (int8_t) (x0 + 8.5f);
            const int8_t  t1  = (int8_t) (x1 + 8.5f);
            const uint8_t xi0 = (uint8_t) (t0 < 15 ? t0 : 15);
            const uint8_t xi1 = (uint8_t) (t1 < 15 ? t1 : 15);
            y[i].qs[j]        = (uint8_t) (xi0 | (xi1 << 4));
        }
    }
}

void ggml_ext_dequantize_row_q4_0(const ggml_ext_block_q4_0 * x, float * y, int64_t k) {
    const int64_t nb = k / QK;
    for (int64_t i = 0; i < nb; i++) {
        const float d = ggml_ext_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j]          = (float) ((x[i].qs[j] & 0x0f) - 8) * d;
            y[i * QK + j + QK / 2] = (float) ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

const int8_t ggml_ext_kvalues_iq4nl[16] = { GGML_EXT_IQ4_NL_VALUES };

void ggml_ext_dequantize_row_iq4_nl(const ggml_ext_block_iq4_nl * x, float * y, int64_t k) {
    const int64_t nb = k / QK;
    for (int64_t i = 0; i < nb; i++) {
        const float d = ggml_ext_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j]          = d * ggml_ext_kvalues_iq4nl[x[i].qs[j] & 0x0f];
            y[i * QK + j + QK / 2] = d * ggml_ext_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

// ---------------------------------------------------------------- layout transforms

static const int layout_n[GGML_EXT_INTERLEAVED4_N_LAYOUTS] = { 4, 4, 8 };
static const int layout_b[GGML_EXT_INTERLEAVED4_N_LAYOUTS] = { 4, 8, 8 };

static int check_shape(enum ggml_ext_interleaved4_layout layout, int64_t nrows, int64_t ncols) {
    if ((unsigned) layout >= GGML_EXT_INTERLEAVED4_N_LAYOUTS) {
        return GGML_EXT_INTERLEAVED4_ERR_LAYOUT;
    }
    if (nrows <= 0 || nrows % layout_n[layout] != 0) {
        return GGML_EXT_INTERLEAVED4_ERR_ROWS;
    }
    if (ncols <= 0 || ncols % QK != 0) {
        return GGML_EXT_INTERLEAVED4_ERR_COLS;
    }
    return 0;
}

// XOR applied to stored quant bytes: Q4_0 0x88, IQ4_NL none.
#define XOR_Q4_0   0x88
#define XOR_IQ4_NL 0x00

// N blocks (one per row of a group, same block column) -> one interleaved block:
// N deltas, then chunk i = bytes [(i/N)*B, +B) of row i%N, XOR x.
static void interleave_blocks(const ggml_ext_block_q4_0 * const * in, int N, int B, uint8_t x, uint8_t * out) {
    ggml_ext_fp16_t * d  = (ggml_ext_fp16_t *) out;
    uint8_t *         qs = out + N * sizeof(ggml_ext_fp16_t);
    for (int r = 0; r < N; r++) {
        d[r] = in[r]->d;
    }
    // whole chunks as one word (B is 4 or 8): the runtime repack of every Q4_0 weight at load runs this
    for (int i = 0; i < N * 16 / B; i++) {
        const uint8_t * src = in[i % N]->qs + (i / N) * B;
        if (B == 8) {
            uint64_t v;
            memcpy(&v, src, 8);
            v ^= 0x0101010101010101ull * x;
            memcpy(qs + i * 8, &v, 8);
        } else {
            uint32_t v;
            memcpy(&v, src, 4);
            v ^= 0x01010101u * x;
            memcpy(qs + i * 4, &v, 4);
        }
    }
}

static void deinterleave_block(const uint8_t * in, int N, int B, uint8_t x, ggml_ext_block_q4_0 * const * out) {
    const ggml_ext_fp16_t * d  = (const ggml_ext_fp16_t *) in;
    const uint8_t *         qs = in + N * sizeof(ggml_ext_fp16_t);
    for (int r = 0; r < N; r++) {
        out[r]->d = d[r];
    }
    for (int i = 0; i < N * 16 / B; i++) {
        uint8_t * dst = out[i % N]->qs + (i / N) * B;
        for (int j = 0; j < B; j++) {
            dst[j] = qs[i * B + j] ^ x;
        }
    }
}

static int repack_blocks(enum ggml_ext_interleaved4_layout layout, uint8_t x, void * dst, const ggml_ext_block_q4_0 * src,
                         int64_t nrows, int64_t ncols) {
    const int err = check_shape(layout, nrows, ncols);
    if (err) {
        return err;
    }
    const int     N  = layout_n[layout];
    const int     B  = layout_b[layout];
    const int64_t nb = ncols / QK;
    uint8_t *     out = (uint8_t *) dst;
    for (int64_t g = 0; g < nrows / N; g++) {
        for (int64_t b = 0; b < nb; b++) {
            const ggml_ext_block_q4_0 * in[8];
            for (int r = 0; r < N; r++) {
                in[r] = src + (g * N + r) * nb + b;
            }
            interleave_blocks(in, N, B, x, out);
            out += (size_t) N * sizeof(ggml_ext_block_q4_0);
        }
    }
    return 0;
}

static int unpack_blocks(enum ggml_ext_interleaved4_layout layout, uint8_t x, ggml_ext_block_q4_0 * dst, const void * src,
                         int64_t nrows, int64_t ncols) {
    const int err = check_shape(layout, nrows, ncols);
    if (err) {
        return err;
    }
    const int       N  = layout_n[layout];
    const int       B  = layout_b[layout];
    const int64_t   nb = ncols / QK;
    const uint8_t * in = (const uint8_t *) src;
    for (int64_t g = 0; g < nrows / N; g++) {
        for (int64_t b = 0; b < nb; b++) {
            ggml_ext_block_q4_0 * out[8];
            for (int r = 0; r < N; r++) {
                out[r] = dst + (g * N + r) * nb + b;
            }
            deinterleave_block(in, N, B, x, out);
            in += (size_t) N * sizeof(ggml_ext_block_q4_0);
        }
    }
    return 0;
}

int ggml_ext_repack_q4_0(enum ggml_ext_interleaved4_layout layout, void * dst, const ggml_ext_block_q4_0 * src, int64_t nrows,
                         int64_t ncols) {
    return repack_blocks(layout, XOR_Q4_0, dst, src, nrows, ncols);
}

int ggml_ext_unpack_q4_0(enum ggml_ext_interleaved4_layout layout, ggml_ext_block_q4_0 * dst, const void * src, int64_t nrows,
                         int64_t ncols) {
    return unpack_blocks(layout, XOR_Q4_0, dst, src, nrows, ncols);
}

int ggml_ext_repack_iq4_nl(enum ggml_ext_interleaved4_layout layout, void * dst, const ggml_ext_block_iq4_nl * src, int64_t nrows,
                           int64_t ncols) {
    return repack_blocks(layout, XOR_IQ4_NL, dst, src, nrows, ncols);
}

int ggml_ext_unpack_iq4_nl(enum ggml_ext_interleaved4_layout layout, ggml_ext_block_iq4_nl * dst, const void * src, int64_t nrows,
                           int64_t ncols) {
    return unpack_blocks(layout, XOR_IQ4_NL, dst, src, nrows, ncols);
}

int ggml_ext_quantize_q4_0_interleaved(enum ggml_ext_interleaved4_layout layout, const float * x, void * dst, int64_t nrows,
                                       int64_t ncols) {
    const int err = check_shape(layout, nrows, ncols);
    if (err) {
        return err;
    }
    const int     N   = layout_n[layout];
    const int     B   = layout_b[layout];
    const int64_t nb  = ncols / QK;
    uint8_t *     out = (uint8_t *) dst;
    for (int64_t g = 0; g < nrows / N; g++) {
        for (int64_t b = 0; b < nb; b++) {
            ggml_ext_block_q4_0         blocks[8];
            const ggml_ext_block_q4_0 * in[8];
            for (int r = 0; r < N; r++) {
                ggml_ext_quantize_row_q4_0_ref(x + (g * N + r) * ncols + b * QK, &blocks[r], QK);
                in[r] = &blocks[r];
            }
            interleave_blocks(in, N, B, XOR_Q4_0, out);
            out += (size_t) N * sizeof(ggml_ext_block_q4_0);
        }
    }
    return 0;
}

static int dequantize_interleaved(enum ggml_ext_interleaved4_layout layout, uint8_t x, const void * src, float * y, int64_t nrows,
                                  int64_t ncols) {
    const int err = check_shape(layout, nrows, ncols);
    if (err) {
        return err;
    }
    const int       N  = layout_n[layout];
    const int       B  = layout_b[layout];
    const int64_t   nb = ncols / QK;
    const uint8_t * in = (const uint8_t *) src;
    for (int64_t g = 0; g < nrows / N; g++) {
        for (int64_t b = 0; b < nb; b++) {
            ggml_ext_block_q4_0   blocks[8];
            ggml_ext_block_q4_0 * out[8];
            for (int r = 0; r < N; r++) {
                out[r] = &blocks[r];
            }
            deinterleave_block(in, N, B, x, out);
            for (int r = 0; r < N; r++) {
                if (x == XOR_Q4_0) {
                    ggml_ext_dequantize_row_q4_0(&blocks[r], y + (g * N + r) * ncols + b * QK, QK);
                } else {
                    ggml_ext_dequantize_row_iq4_nl(&blocks[r], y + (g * N + r) * ncols + b * QK, QK);
                }
            }
            in += (size_t) N * sizeof(ggml_ext_block_q4_0);
        }
    }
    return 0;
}

int ggml_ext_dequantize_q4_0_interleaved(enum ggml_ext_interleaved4_layout layout, const void * src, float * y, int64_t nrows,
                                         int64_t ncols) {
    return dequantize_interleaved(layout, XOR_Q4_0, src, y, nrows, ncols);
}

int ggml_ext_dequantize_iq4_nl_interleaved(enum ggml_ext_interleaved4_layout layout, const void * src, float * y, int64_t nrows,
                                           int64_t ncols) {
    return dequantize_interleaved(layout, XOR_IQ4_NL, src, y, nrows, ncols);
}

