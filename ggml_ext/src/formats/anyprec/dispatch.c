// Which any-precision GEMV runs: decided at compile time from the target's flags (common/simd.h), as
// ggml's own CPU kernels are; every build has the scalar reference.
#include "formats/anyprec/anyprec_impl.h"
#include "common/families.h"

#include <string.h>

int ggml_ext_anyprec_gemv(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr, int64_t n_rows,
                          int64_t n_per_row, int seed_bits, int bits, const float * x, float * y) {
#if defined(GGML_EXT_HAVE_AVX512)
    return ggml_ext_anyprec_gemv_avx512(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, x, y);
#elif defined(GGML_EXT_HAVE_AVX2)
    return ggml_ext_anyprec_gemv_avx2(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, x, y);
#elif defined(GGML_EXT_HAVE_NEON)
    return ggml_ext_anyprec_gemv_neon(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, x, y);
#else
    return ggml_ext_anyprec_gemv_ref(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, x, y);
#endif
}

int ggml_ext_anyprec_gemv_tokens(const uint8_t * planes, const ggml_ext_fp16_t * tables, int64_t r0, int64_t nr,
                                 int64_t n_rows, int64_t n_per_row, int seed_bits, int bits, int n_tok,
                                 const float * const * x, float * const * y) {
#if defined(GGML_EXT_HAVE_AVX512)
    return ggml_ext_anyprec_gemv_tokens_avx512(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, n_tok, x, y);
#elif defined(GGML_EXT_HAVE_AVX2)
    return ggml_ext_anyprec_gemv_tokens_avx2(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, n_tok, x, y);
#elif defined(GGML_EXT_HAVE_NEON)
    return ggml_ext_anyprec_gemv_tokens_neon(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, n_tok, x, y);
#else
    if (!ggml_ext_anyprec_gemv_args_ok(r0, nr, n_rows, n_per_row, seed_bits, bits) || n_tok < 0) {
        return -1;
    }
    for (int t = 0; t < n_tok; t++) {
        ggml_ext_anyprec_gemv(planes, tables, r0, nr, n_rows, n_per_row, seed_bits, bits, x[t], y[t]);
    }
    return 0;
#endif
}

// ggml_ext_dispatched_kernel for the APQ type (formats/dispatch.c): the GEMV above, for any batch size
// (batches over 8 tokens dequantize blocks of rows instead: src/ops/apq_mul_mat_cpu.c).
const char * ggml_ext_anyprec_dispatched_kernel(int type, int gemm) {
    (void) type;
    (void) gemm;
    // the other families' vocabulary (ggml-ext info --build): "generic" for the portable C reference
    return strcmp(ggml_ext_anyprec_gemv_name(), "scalar") == 0 ? "generic" : ggml_ext_anyprec_gemv_name();
}

const char * ggml_ext_anyprec_gemv_name(void) {
#if defined(GGML_EXT_HAVE_AVX512)
    return "avx512";
#elif defined(GGML_EXT_HAVE_AVX2)
    return "avx2";
#elif defined(GGML_EXT_HAVE_NEON)
    return "neon";
#else
    return "scalar";
#endif
}
