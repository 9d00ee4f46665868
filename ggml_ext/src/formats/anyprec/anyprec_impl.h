// The any-precision GEMV kernels (same contract as ggml_ext_anyprec_gemv_ref in anyprec.h): the scalar
// reference in generic/anyprec.c, SIMD twins in x86/anyprec_avx2.c, x86/anyprec_avx512.c and arm/anyprec_neon.c (each defined
// only where its instruction set is compiled in: common/simd.h), and ggml_ext_anyprec_gemv in dispatch.c,
// which runs the best one this build has. All of them read the first b planes and precision b's table.
#pragma once

#include "common/simd.h"
#include "formats/anyprec/anyprec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int (*ggml_ext_anyprec_gemv_fn)(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                        int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x,
                                        float * y);
typedef int (*ggml_ext_anyprec_gemv_tokens_fn)(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0,
                                               int64_t nr, int64_t n_rows, int64_t n_per_row, int seed_bits, int bits,
                                               int n_tok, const float * const * x, float * const * y);

#if defined(GGML_EXT_HAVE_AVX2)
int ggml_ext_anyprec_gemv_avx2(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                               int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x, float * y);
int ggml_ext_anyprec_gemv_tokens_avx2(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                      int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                      const float * const * x, float * const * y);
#endif
#if defined(GGML_EXT_HAVE_AVX512)
int ggml_ext_anyprec_gemv_avx512(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                 int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x, float * y);
int ggml_ext_anyprec_gemv_tokens_avx512(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                        int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                        const float * const * x, float * const * y);
#endif
#if defined(GGML_EXT_HAVE_NEON)
int ggml_ext_anyprec_gemv_neon(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                               int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, const float * x, float * y);
int ggml_ext_anyprec_gemv_tokens_neon(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                      int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                      const float * const * x, float * const * y);
#endif

// The best kernel of this build and its name ("avx512", "avx2", "neon", "scalar").
GGML_EXT_API int          ggml_ext_anyprec_gemv(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0,
                                                int64_t nr, int64_t n_rows, int64_t n_per_row, int seed_bits, int bits,
                                                const float * x, float * y);
GGML_EXT_API const char * ggml_ext_anyprec_gemv_name(void);
// The GEMV of n_tok activation rows: y[t][0 .. nr) from x[t], t < n_tok, each equal bit for bit to
// ggml_ext_anyprec_gemv(..., x[t], y[t]). The AVX-512 kernel decodes each block of weights once for up to four
// rows, the AVX2 one for two, the NEON one for four; the scalar build calls its GEMV once per row.
GGML_EXT_API int ggml_ext_anyprec_gemv_tokens(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0,
                                              int64_t nr, int64_t n_rows, int64_t n_per_row, int seed_bits, int bits,
                                              int n_tok, const float * const * x, float * const * y);

static inline int ggml_ext_anyprec_gemv_args_ok(int64_t r0, int64_t nr, int64_t n_rows, int64_t n_per_row, int seed_bits,
                                                int bits) {
    return bits >= seed_bits && bits >= 1 && bits <= GGML_EXT_ANYPREC_MAX_BITS && n_per_row % GGML_EXT_ANYPREC_QK == 0 &&
           r0 >= 0 && nr >= 0 && r0 + nr <= n_rows;
}

// What every kernel derives from its arguments: the bytes of a row in one plane, of one plane, and where precision
// b's tables start. 0 if the arguments are refused (ggml_ext_anyprec_gemv_args_ok, or a negative token count).
struct ggml_ext_anyprec_gemv_geo {
    int64_t                 row_bytes;
    size_t                  plane_bytes;
    const ggml_ext_fp16_t * tab;
};

static inline int ggml_ext_anyprec_gemv_geo_of(const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr, int64_t n_rows,
                                               int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                               struct ggml_ext_anyprec_gemv_geo * g) {
    if (!ggml_ext_anyprec_gemv_args_ok(r0, nr, n_rows, n_per_row, seed_bits, bits) || n_tok < 0) {
        return 0;
    }
    g->row_bytes   = n_per_row / 8;
    g->plane_bytes = (size_t) n_rows * (size_t) g->row_bytes;
    g->tab         = tables + ggml_ext_anyprec_table_offset(n_rows, seed_bits, bits);
    return 1;
}

// One pass of a kernel over rows r0 .. r0 + nr for G activation rows x[0..G) into y[0..G), G <= its pass width.
typedef void (*ggml_ext_anyprec_rows_fn)(const uint8_t * planes, const struct ggml_ext_anyprec_gemv_geo * g, int64_t r0,
                                         int64_t nr, int bits, const float * const * x, float * const * y, int G);

// The several-token GEMV of every kernel: the arguments checked once, then passes of `width` tokens (the last one
// shorter) through the kernel's `rows`.
static inline int ggml_ext_anyprec_gemv_tokens_by(ggml_ext_anyprec_rows_fn rows, int width, const uint8_t * planes,
                                                  const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr, int64_t n_rows,
                                                  int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                                  const float * const * x, float * const * y) {
    struct ggml_ext_anyprec_gemv_geo g;
    if (!ggml_ext_anyprec_gemv_geo_of(tables, r0, nr, n_rows, n_per_row, seed_bits, bits, n_tok, &g)) {
        return -1;
    }
    for (int t0 = 0; t0 < n_tok; t0 += width) {
        rows(planes, &g, r0, nr, bits, x + t0, y + t0, n_tok - t0 < width ? n_tok - t0 : width);
    }
    return 0;
}

#ifdef __cplusplus
}
#endif
