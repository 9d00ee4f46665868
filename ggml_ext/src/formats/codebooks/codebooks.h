// Group-wise codebook types CB2 and CB3 (the Arm paper's fine-grained codebooks; the bytes are
// written down in docs/formats/codebooks.md). A block is 256 weights: one fp16 super-scale d and
// 16 sub-groups of 16 weights, each with a 4-bit local scale l and a 2-bit codebook index c;
// each weight is a 2-bit (CB2) or 3-bit (CB3) code q into the chosen codebook:
//     w = d * (l + 1) * table[c][q]        (table: signed int8, codebooks_tables.h)
//
// Bits are placed so a SIMD kernel forms the table index (c << 2 | q for CB2, c << 3 | q for
// CB3) of 16 weights of one sub-group with shifts, masks and shift-inserts on whole vectors,
// then decodes them with one byte-table lookup (NEON vqtbl1q_s8 / vqtbl2q_s8, x86 pshufb):
//   - qs:    the low 2 bits of the code of weight j of sub-group s sit at bits 2*(s&3) of
//            qs[16*(s>>2) + j]: one 16-byte load holds four sub-groups, one per bit pair;
//   - cb:    sub-group s's codebook index at bits 2*(s&3) of cb[s>>2] (the same bit pair as
//            its codes in qs: one byte per 16-byte qs chunk);
//   - hmask: (CB3) bit 2 of the code of weight j of sub-group s at bit (s&7) of hmask[16*(s>>3) + j];
//   - scales: sub-group s's local scale in the low (s even) / high (s odd) nibble of scales[s>>1].
// GGML types CB2 (id 100) and CB3 (id 101), ggml-ext-types.def; kernels: src/generic/codebooks.c (scalar
// reference), src/x86/codebooks_avx2.c, src/arm/codebooks_neon.c, chosen by formats/codebooks/dispatch.c.
#pragma once

#include "common/blocks.h"  // ggml_ext_fp16_t
#include "ggml-ext.h"       // GGML_EXT_API

#include <stddef.h>
#include <stdint.h>

#define GGML_EXT_QK_CB      256  // weights per block
#define GGML_EXT_CODEBOOKS_GROUP   16   // weights per sub-group
#define GGML_EXT_CODEBOOKS_NGROUPS (GGML_EXT_QK_CB / GGML_EXT_CODEBOOKS_GROUP)

typedef struct {
    ggml_ext_fp16_t d;           // super-scale
    uint8_t         scales[8];   // 4-bit local scales l (value l + 1)
    uint8_t         cb[4];       // 2-bit codebook indices
    uint8_t         qs[64];      // 2-bit codes
} ggml_ext_block_cb2;            // 78 bytes: 2.4375 bits per weight

typedef struct {
    ggml_ext_fp16_t d;
    uint8_t         scales[8];
    uint8_t         cb[4];
    uint8_t         qs[64];      // low 2 bits of the 3-bit codes, placed as CB2's
    uint8_t         hmask[32];   // bit 2 of the codes
} ggml_ext_block_cb3;            // 110 bytes: 3.4375 bits per weight (Q3_K's size)

#ifdef __cplusplus
extern "C" {
#endif

// The version of the built-in tables (codebooks_tables.h), and a copy of them:
// n_codebooks * n_entries int8 values, codebook-major, for bits 2 or 3. Returns the number of
// values written (16 for CB2, 32 for CB3), 0 for other bits or a too small buffer.
GGML_EXT_API int    ggml_ext_codebooks_tables_version(void);
GGML_EXT_API int    ggml_ext_codebooks_tables(int bits, int8_t * out, size_t n);
// Bytes per block (78 or 110; 0 for other bits).
GGML_EXT_API size_t ggml_ext_codebooks_block_size(int bits);

// Float rows (nrows x n_per_row, n_per_row a multiple of 256) -> CB2 (bits 2) or CB3 (bits 3)
// blocks. importance: n_per_row non-negative weights of the input columns (an imatrix row:
// per-input-channel sum x^2 of the activations) or NULL for equal weights. Per sub-group the
// codebook and local scale, and per block the super-scale, minimise
//     sum_j importance[j] * (x_j - d * (l + 1) * table[c][q_j])^2.
// Returns the bytes written; 0 (nothing written) when n_per_row is not a multiple of 256,
// bits is not 2 or 3, or an input or importance value is not finite (or importance < 0).
GGML_EXT_API size_t ggml_ext_codebooks_quantize(int bits, const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                                const float * importance);

// Blocks -> floats (n_blocks * 256). Returns 0, or -1 for bits other than 2 and 3.
GGML_EXT_API int ggml_ext_codebooks_dequantize(int bits, const void * src, float * dst, int64_t n_blocks);

// ---- kernels: weights (CB2 / CB3 rows) times activations quantized to Q8_K ----
// Activations are quantized per 256 values (one weight block) to ggml's Q8_K bytes: an fp32 scale,
// 256 int8, 16 int16 sums of 16 (unused here; kept so ggml-cpu's work-buffer size, planned from the
// vec_dot_type Q8_K, is exact). Q8_K rather than Q8_0: one scale per weight super-block, so a
// block's dot product is one integer sum of 16 sub-group sums times (l + 1), then one float multiply.
typedef struct {
    float   d;
    int8_t  qs[GGML_EXT_QK_CB];
    int16_t bsums[GGML_EXT_QK_CB / 16];
} ggml_ext_block_q8_K;  // 292 bytes, ggml-common.h's block_q8_K

// k floats (k a multiple of 256) -> k / 256 Q8_K blocks: d = max |x| / 127, q = round(x / d).
GGML_EXT_API void ggml_ext_codebooks_quantize_row_q8_K(const float * x, void * y, int64_t k);

// s[r * bs + c] = dot(weight row c, activation row r) for c < nc, r < nr: vx holds nc rows of n
// weights (CB2 or CB3 blocks), vy nr rows of n activations as Q8_K blocks; n a multiple of 256.
#define GGML_EXT_CODEBOOKS_MM_ARGS int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc
typedef void (*ggml_ext_codebooks_mm_fn)(GGML_EXT_CODEBOOKS_MM_ARGS);

// One implementation of the kernels (generic: the scalar reference; avx2; neon-dotprod). mm[0] is
// CB2's, mm[1] CB3's; the scalar reference has both, a SIMD implementation may lack one (NULL).
struct ggml_ext_codebooks_impl {
    const char *      name;
    int (*usable)(void);  // NULL: always usable where compiled
    ggml_ext_codebooks_mm_fn mm[2];
};

// Every implementation compiled in (0: generic ... best last), and the one that runs for bits.
GGML_EXT_API int                              ggml_ext_codebooks_impl_count(void);
GGML_EXT_API const struct ggml_ext_codebooks_impl * ggml_ext_codebooks_impl_get(int i);
GGML_EXT_API const char *                     ggml_ext_codebooks_dispatched(int bits);
// The dispatched kernel for bits 2 or 3 (what ggml-cpu's mul_mat runs).
GGML_EXT_API void ggml_ext_codebooks_mm(int bits, GGML_EXT_CODEBOOKS_MM_ARGS);

GGML_EXT_API extern const struct ggml_ext_codebooks_impl ggml_ext_codebooks_impl_generic;

#ifdef __cplusplus
}
#endif
