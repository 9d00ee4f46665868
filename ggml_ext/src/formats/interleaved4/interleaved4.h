// The interleaved 4-bit family ("interleaved4", ggml-ext-types.def): Q4_0 or IQ4_NL values
// in groups of N = 4 or 8 rows interleaved in chunks of B = 4 or 8 bytes; the types
// Q4_0_4_4/4_8/8_8 (ids 31-33) and IQ4_NL_4_4/4_8/8_8 (ids 36-38). Block structs, layout
// transforms, quantize/dequantize, Q8_0 activation quantization and the GEMV/GEMM kernels.
//
// Byte layout (docs/formats/interleaved4.md; llama.cpp's files of July-December 2024):
// rows are taken in groups of N; for each block column the N Q4_0 blocks of a group
// become one interleaved block: N fp16 deltas in row order, then N*16 quant bytes taken
// round-robin in chunks of B bytes (chunk i = bytes [(i/N)*B, (i/N)*B + B) of row i%N),
// every quant byte XORed with 0x88 for Q4_0 values (IQ4_NL: no XOR; a nibble q stands for
// d * kvalues[q], the fixed IQ4_NL table). Interleaved blocks follow each other by block
// column, then by row group. A tensor has the size of the plain Q4_0 / IQ4_NL tensor.
//
// Kernels take the arguments of ggml's repack kernels so they can sit behind its traits:
//   n  : the shared dimension K (a multiple of 32),
//   s  : output, s[row * bs + col] (GEMV: row < nr; GEMM: row < nr),
//   bs : output row stride in floats,
//   vx : interleaved weights, nc / N row groups of n / 32 interleaved blocks each,
//   vy : activations: GEMV: nr rows of n / 32 Q8_0 blocks;
//        GEMM: nr / 4 groups of n / 32 ggml_ext_block_q8_0x4 (see quantize_mat),
//   nr : activation rows (GEMM: a multiple of 4),
//   nc : output columns = weight rows (a multiple of N).
// s[row][col] = sum over k of weight[col][k] * activation[row][k], both dequantized.
#pragma once

#include "common/blocks.h"
#include "ggml-ext.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif


// ggml's ids of the stock types the family stores (the BASE column of ggml-ext-types.def)
#define GGML_EXT_BASE_Q4_0   2
#define GGML_EXT_BASE_IQ4_NL 20

// N = 4 (Q4_0_4_4 with B = 4, Q4_0_4_8 with B = 8): 72 bytes.
typedef struct {
    ggml_ext_fp16_t d[4];
    uint8_t         qs[4 * GGML_EXT_QK4_0 / 2];
} ggml_ext_block_q4_0x4;

// N = 8 (Q4_0_8_8, B = 8): 144 bytes.
typedef struct {
    ggml_ext_fp16_t d[8];
    uint8_t         qs[8 * GGML_EXT_QK4_0 / 2];
} ggml_ext_block_q4_0x8;


// Four activation rows quantized to Q8_0 and interleaved like the weights (N = 4) in
// chunks of B bytes, without XOR: d[r] is row r's delta; byte j of row r sits at
// qs[((j / B) * 4 + r) * B + j % B]. 136 bytes, the size of four Q8_0 blocks.
typedef struct {
    ggml_ext_fp16_t d[4];
    int8_t          qs[4 * GGML_EXT_QK8_0];
} ggml_ext_block_q8_0x4;

#if defined(__cplusplus)
#    define GGML_EXT_STATIC_ASSERT static_assert
#else
#    define GGML_EXT_STATIC_ASSERT _Static_assert
#endif
GGML_EXT_STATIC_ASSERT(sizeof(ggml_ext_block_q4_0) == 18, "Q4_0 block is 18 bytes");
GGML_EXT_STATIC_ASSERT(sizeof(ggml_ext_block_q8_0) == 34, "Q8_0 block is 34 bytes");
GGML_EXT_STATIC_ASSERT(sizeof(ggml_ext_block_q4_0x4) == 4 * 18, "Q4_0x4 block is 72 bytes");
GGML_EXT_STATIC_ASSERT(sizeof(ggml_ext_block_q4_0x8) == 8 * 18, "Q4_0x8 block is 144 bytes");
GGML_EXT_STATIC_ASSERT(sizeof(ggml_ext_block_q8_0x4) == 4 * 34, "Q8_0x4 block is 136 bytes");

// The LAYOUT column of ggml-ext-types.def.
enum ggml_ext_interleaved4_layout {
    GGML_EXT_INTERLEAVED4_4X4 = 0,  // N = 4, B = 4: Q4_0_4_4 (id 31), IQ4_NL_4_4 (36)
    GGML_EXT_INTERLEAVED4_4X8 = 1,  // N = 4, B = 8: Q4_0_4_8 (32), IQ4_NL_4_8 (37)
    GGML_EXT_INTERLEAVED4_8X8 = 2,  // N = 8, B = 8: Q4_0_8_8 (33), IQ4_NL_8_8 (38)
    GGML_EXT_INTERLEAVED4_N_LAYOUTS
};

// The values a nibble stands for (the BASE column of ggml-ext-types.def).
enum ggml_ext_interleaved4_values {
    GGML_EXT_INTERLEAVED4_Q4_0   = 0,  // (q - 8) * d, bytes stored XOR 0x88
    GGML_EXT_INTERLEAVED4_IQ4_NL = 1,  // kvalues[q] * d
    GGML_EXT_INTERLEAVED4_N_VALUES
};

// The codebook as an array (the scalar kernels' and the tests'); its values: common/blocks.h.
GGML_EXT_API extern const int8_t ggml_ext_kvalues_iq4nl[16];

// Error returns (0 is success).
#define GGML_EXT_INTERLEAVED4_ERR_LAYOUT (-1)  // not one of enum ggml_ext_interleaved4_layout
#define GGML_EXT_INTERLEAVED4_ERR_ROWS   (-2)  // row count not a positive multiple of N
#define GGML_EXT_INTERLEAVED4_ERR_COLS   (-3)  // row length not a positive multiple of 32

typedef void (*ggml_ext_interleaved4_mm_fn)(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
// Quantizes 4 rows x[r * k .. r * k + k) into k / 32 ggml_ext_block_q8_0x4.
typedef void (*ggml_ext_q8_0_x4_fn)(const float * x, void * vy, int64_t k);
typedef void (*ggml_ext_q8_0_row_fn)(const float * x, void * vy, int64_t k);

// One table of traits per type (values x layout); the kernel pointers are the best compiled in.
struct ggml_ext_interleaved4_layout_traits {
    const char *        name;        // "Q4_0_4_4" .. "IQ4_NL_8_8"
    int                 type_id;     // 31 .. 33, 36 .. 38
    int                 nrows;       // N: rows interleaved per group
    int                 chunk;       // B: bytes per round-robin chunk
    size_t              block_size;  // bytes of one interleaved block (N * 18)
    ggml_ext_q8_0_x4_fn quantize_mat;  // activations for gemm (interleaved with chunk B)
    ggml_ext_interleaved4_mm_fn gemv;
    ggml_ext_interleaved4_mm_fn gemm;
};

// NULL for unknown values or layout.
GGML_EXT_API const struct ggml_ext_interleaved4_layout_traits * ggml_ext_interleaved4_layout_traits(enum ggml_ext_interleaved4_values values,
                                                                               enum ggml_ext_interleaved4_layout layout);

// --- Q4_0 and Q8_0 reference (bit-identical to ggml's quantize_row_q4_0_ref / q8_0_ref) ---
// k must be a multiple of 32.
GGML_EXT_API void ggml_ext_quantize_row_q4_0_ref(const float * x, ggml_ext_block_q4_0 * y, int64_t k);
GGML_EXT_API void ggml_ext_dequantize_row_q4_0(const ggml_ext_block_q4_0 * x, float * y, int64_t k);
GGML_EXT_API void ggml_ext_dequantize_row_iq4_nl(const ggml_ext_block_iq4_nl * x, float * y, int64_t k);
GGML_EXT_API void ggml_ext_quantize_row_q8_0_ref(const float * x, ggml_ext_block_q8_0 * y, int64_t k);

// --- layout transforms (formats/interleaved4/layout.c); src and dst must not overlap ---
// Q4_0 / IQ4_NL tensor of nrows x ncols (row-major blocks) -> interleaved, and back (lossless).
GGML_EXT_API int ggml_ext_repack_q4_0(enum ggml_ext_interleaved4_layout layout, void * dst, const ggml_ext_block_q4_0 * src,
                                      int64_t nrows, int64_t ncols);
GGML_EXT_API int ggml_ext_unpack_q4_0(enum ggml_ext_interleaved4_layout layout, ggml_ext_block_q4_0 * dst, const void * src,
                                      int64_t nrows, int64_t ncols);
GGML_EXT_API int ggml_ext_repack_iq4_nl(enum ggml_ext_interleaved4_layout layout, void * dst, const ggml_ext_block_iq4_nl * src,
                                        int64_t nrows, int64_t ncols);
GGML_EXT_API int ggml_ext_unpack_iq4_nl(enum ggml_ext_interleaved4_layout layout, ggml_ext_block_iq4_nl * dst, const void * src,
                                        int64_t nrows, int64_t ncols);
// float rows -> interleaved Q4_0, through the Q4_0 reference rounding (== quantize then repack).
GGML_EXT_API int ggml_ext_quantize_q4_0_interleaved(enum ggml_ext_interleaved4_layout layout, const float * x, void * dst,
                                                    int64_t nrows, int64_t ncols);
GGML_EXT_API int ggml_ext_dequantize_q4_0_interleaved(enum ggml_ext_interleaved4_layout layout, const void * src, float * y,
                                                      int64_t nrows, int64_t ncols);
GGML_EXT_API int ggml_ext_dequantize_iq4_nl_interleaved(enum ggml_ext_interleaved4_layout layout, const void * src, float * y,
                                                        int64_t nrows, int64_t ncols);

// --- activations (best compiled-in implementation); same values as the _ref quantizer ---
GGML_EXT_API void ggml_ext_quantize_row_q8_0(const float * x, void * vy, int64_t k);
GGML_EXT_API void ggml_ext_quantize_mat_q8_0_4x4(const float * x, void * vy, int64_t k);  // chunk B = 4
GGML_EXT_API void ggml_ext_quantize_mat_q8_0_4x8(const float * x, void * vy, int64_t k);  // chunk B = 8

// --- kernels (best compiled-in implementation), named as upstream's repack kernels ---
#define GGML_EXT_INTERLEAVED4_MM_ARGS int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc
#define GGML_EXT_INTERLEAVED4_DECLARE(values, NxB)                                  \
    GGML_EXT_API void ggml_ext_gemv_##values##_##NxB##_q8_0(GGML_EXT_INTERLEAVED4_MM_ARGS); \
    GGML_EXT_API void ggml_ext_gemm_##values##_##NxB##_q8_0(GGML_EXT_INTERLEAVED4_MM_ARGS);
GGML_EXT_INTERLEAVED4_DECLARE(q4_0, 4x4)
GGML_EXT_INTERLEAVED4_DECLARE(q4_0, 4x8)
GGML_EXT_INTERLEAVED4_DECLARE(q4_0, 8x8)
GGML_EXT_INTERLEAVED4_DECLARE(iq4_nl, 4x4)
GGML_EXT_INTERLEAVED4_DECLARE(iq4_nl, 4x8)
GGML_EXT_INTERLEAVED4_DECLARE(iq4_nl, 8x8)
#undef GGML_EXT_INTERLEAVED4_DECLARE

// --- every compiled-in implementation, for tests and benchmarks ---
// Index 0 is the scalar reference ("generic"), which has every entry; later entries
// are SIMD ("neon-dotprod", "neon-i8mm", "sve256-i8mm", "avx2", "avx512-vnni") and may leave an entry
// NULL, in which case the dispatcher uses the best earlier one.
struct ggml_ext_interleaved4_impl {
    const char *         name;
    ggml_ext_q8_0_row_fn quantize_row_q8_0;
    ggml_ext_q8_0_x4_fn  quantize_mat_q8_0_4x4;
    ggml_ext_q8_0_x4_fn  quantize_mat_q8_0_4x8;
    ggml_ext_interleaved4_mm_fn    gemv[GGML_EXT_INTERLEAVED4_N_VALUES][GGML_EXT_INTERLEAVED4_N_LAYOUTS];  // [enum ggml_ext_interleaved4_values][layout]
    ggml_ext_interleaved4_mm_fn    gemm[GGML_EXT_INTERLEAVED4_N_VALUES][GGML_EXT_INTERLEAVED4_N_LAYOUTS];
    // NULL: always usable where compiled in; otherwise asked at run time (SVE: the vector
    // length), and the dispatcher skips the implementation when it returns 0.
    int (*usable)(void);
};

// The kernel table of one kind (gemv or gemm) of an implementation whose static kernels are
// named <kind>_<values>_<N>x<B>_<isa> (q4_0 / iq4_nl; 4x4, 4x8, 8x8; generic, avx2, dotprod, ...):
// one name per kernel and implementation, which profiles and the qemu tests' traces read.
#define GGML_EXT_INTERLEAVED4_TABLE(kind, isa)                                                           \
    {                                                                                          \
        { kind##_q4_0_4x4_##isa, kind##_q4_0_4x8_##isa, kind##_q4_0_8x8_##isa },               \
        { kind##_iq4_nl_4x4_##isa, kind##_iq4_nl_4x8_##isa, kind##_iq4_nl_8x8_##isa }          \
    }

GGML_EXT_API int                           ggml_ext_interleaved4_impl_count(void);
GGML_EXT_API const struct ggml_ext_interleaved4_impl * ggml_ext_interleaved4_impl_get(int i);  // NULL out of range
// Name of the implementation the dispatcher runs on this CPU for a type's GEMV (gemm = 0)
// or GEMM ("generic" is the scalar reference); NULL for unknown values or layout.
// ggml_ext_dispatched_kernel (ggml-ext.h) answers the same by type id.
GGML_EXT_API const char * ggml_ext_interleaved4_dispatched(enum ggml_ext_interleaved4_values values, enum ggml_ext_interleaved4_layout layout, int gemm);

#ifdef __cplusplus
}
#endif
