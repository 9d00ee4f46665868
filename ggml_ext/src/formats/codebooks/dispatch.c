// Dispatch for the codebooks family (CB2 / CB3 x Q8_K): every compiled-in implementation, best
// last; each kernel runs the best usable one that has it, the scalar reference at worst. The choice
// follows the compiler's target flags (common/simd.h), as the interleaved4 family's does.
#include "common/simd.h"
#include "formats/codebooks/codebooks.h"
#include "common/families.h"

#ifdef GGML_EXT_HAVE_NEON_DOTPROD
extern const struct ggml_ext_codebooks_impl ggml_ext_codebooks_impl_neon_dotprod;
#endif
#ifdef GGML_EXT_HAVE_AVX2
extern const struct ggml_ext_codebooks_impl ggml_ext_codebooks_impl_avx2;
#endif

static const struct ggml_ext_codebooks_impl * const impls[] = {
    &ggml_ext_codebooks_impl_generic,
#ifdef GGML_EXT_HAVE_NEON_DOTPROD
    &ggml_ext_codebooks_impl_neon_dotprod,
#endif
#ifdef GGML_EXT_HAVE_AVX2
    &ggml_ext_codebooks_impl_avx2,
#endif
};

#define N_IMPLS ((int) (sizeof(impls) / sizeof(impls[0])))

int ggml_ext_codebooks_impl_count(void) {
    return N_IMPLS;
}

const struct ggml_ext_codebooks_impl * ggml_ext_codebooks_impl_get(int i) {
    return i >= 0 && i < N_IMPLS ? impls[i] : NULL;
}

static const struct ggml_ext_codebooks_impl * pick(int bits) {
    for (int i = N_IMPLS - 1; i > 0; i--) {
        if (impls[i]->mm[bits - 2] && (!impls[i]->usable || impls[i]->usable())) {
            return impls[i];
        }
    }
    return impls[0];
}

const char * ggml_ext_codebooks_dispatched(int bits) {
    return bits == 2 || bits == 3 ? pick(bits)->name : NULL;
}

void ggml_ext_codebooks_mm(int bits, GGML_EXT_CODEBOOKS_MM_ARGS) {
    pick(bits)->mm[bits - 2](n, s, bs, vx, vy, nr, nc);
}

// One kernel serves GEMV and GEMM (it decodes each weight block once for all activation rows).
const char * ggml_ext_codebooks_dispatched_kernel(int type, int gemm) {
    (void) gemm;
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_CODEBOOKS ? ggml_ext_codebooks_dispatched(t->layout) : NULL;
}
