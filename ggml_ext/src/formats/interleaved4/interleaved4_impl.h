// Internal to the interleaved4 family: the implementation tables the dispatcher chooses from
// (one per compiled-in SIMD level, common/simd.h) and the helpers its kernels share.
#pragma once

#include "common/fp16.h"
#include "common/simd.h"
#include "formats/interleaved4/interleaved4.h"

#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

GGML_EXT_API extern const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_generic;
#ifdef GGML_EXT_HAVE_NEON_DOTPROD
GGML_EXT_API extern const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_neon_dotprod;
#endif
#ifdef GGML_EXT_HAVE_NEON_I8MM
GGML_EXT_API extern const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_neon_i8mm;
#endif
#ifdef GGML_EXT_HAVE_SVE_I8MM
GGML_EXT_API extern const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_sve256_i8mm;
#endif
#ifdef GGML_EXT_HAVE_AVX2
GGML_EXT_API extern const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_avx2;
#endif
#ifdef GGML_EXT_HAVE_AVX512VNNI
GGML_EXT_API extern const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_avx512vnni;
#endif

#ifdef __cplusplus
}
#endif

