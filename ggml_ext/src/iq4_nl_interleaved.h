// Interleaved IQ4_NL (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8; ggml type ids 36, 37, 38).
//
// The byte layout is the interleaved Q4_0 one (q4_0_interleaved.h, FORMATS.md) without
// the XOR: N fp16 deltas in row order, then N*16 quant bytes round-robin in chunks of B
// bytes. A nibble q stands for d * kvalues[q] (the fixed IQ4_NL table), so the kernels
// decode by table lookup (NEON vqtbl1q_s8, x86 pshufb) where Q4_0 shifts nibbles; the
// activation side (Q8_0, four rows interleaved in chunks of B) is the Q4_0 family's,
// and so are the kernel arguments, the implementation tables and the dispatcher.
#pragma once

#include "q4_0_interleaved.h"

#ifdef __cplusplus
extern "C" {
#endif

// ggml_ext_block_iq4_nl and the codebook GGML_EXT_IQ4_NL_VALUES: common/blocks.h.
// The codebook as an array (the scalar kernels' and the tests').
GGML_EXT_API extern const int8_t ggml_ext_kvalues_iq4nl[16];

// Layouts are enum ggml_ext_q4_0_layout (0: N = 4, B = 4; 1: N = 4, B = 8; 2: N = 8, B = 8);
// traits name "IQ4_NL_4_4" .. and type ids 36 .. 38. NULL for an unknown layout.
GGML_EXT_API const struct ggml_ext_q4_0_layout_traits * ggml_ext_iq4_nl_layout_traits(enum ggml_ext_q4_0_layout layout);

// k a multiple of 32.
GGML_EXT_API void ggml_ext_dequantize_row_iq4_nl(const ggml_ext_block_iq4_nl * x, float * y, int64_t k);

// --- layout transforms (errors as the Q4_0 ones); src and dst must not overlap ---
GGML_EXT_API int ggml_ext_repack_iq4_nl(enum ggml_ext_q4_0_layout layout, void * dst, const ggml_ext_block_iq4_nl * src,
                                        int64_t nrows, int64_t ncols);
GGML_EXT_API int ggml_ext_unpack_iq4_nl(enum ggml_ext_q4_0_layout layout, ggml_ext_block_iq4_nl * dst, const void * src,
                                        int64_t nrows, int64_t ncols);
GGML_EXT_API int ggml_ext_dequantize_iq4_nl_interleaved(enum ggml_ext_q4_0_layout layout, const void * src, float * y,
                                                        int64_t nrows, int64_t ncols);

// --- kernels (best compiled-in implementation); arguments as the Q4_0 kernels ---
GGML_EXT_API void ggml_ext_gemv_iq4_nl_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
GGML_EXT_API void ggml_ext_gemv_iq4_nl_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
GGML_EXT_API void ggml_ext_gemv_iq4_nl_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
GGML_EXT_API void ggml_ext_gemm_iq4_nl_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
GGML_EXT_API void ggml_ext_gemm_iq4_nl_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
GGML_EXT_API void ggml_ext_gemm_iq4_nl_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);

// Name of the implementation the dispatcher runs on this CPU for a layout's GEMV (gemm = 0)
// or GEMM of interleaved IQ4_NL ("generic" is the scalar reference); NULL for an unknown layout.
GGML_EXT_API const char * ggml_ext_iq4_nl_dispatched(enum ggml_ext_q4_0_layout layout, int gemm);

#ifdef __cplusplus
}
#endif
