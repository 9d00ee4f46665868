// Dispatch for the interleaved4 family (Q4_0 and IQ4_NL values): every compiled-in implementation,
// best last; each entry point runs the best usable one that has the kernel, the scalar reference
// at worst (an implementation may lack an entry: sve256-i8mm has only Q4_0_8_8, neon-i8mm only
// the B = 8 GEMMs). The choice follows the compiler's target flags (common/simd.h), as ggml's own
// CPU variants do: a build for a CPU runs on it, with any layout.
#include "formats/interleaved4/interleaved4_impl.h"

static const struct ggml_ext_interleaved4_impl * const impls[] = {
    &ggml_ext_interleaved4_impl_generic,
#ifdef GGML_EXT_HAVE_NEON_DOTPROD
    &ggml_ext_interleaved4_impl_neon_dotprod,
#endif
#ifdef GGML_EXT_HAVE_NEON_I8MM
    &ggml_ext_interleaved4_impl_neon_i8mm,
#endif
#ifdef GGML_EXT_HAVE_SVE_I8MM
    &ggml_ext_interleaved4_impl_sve256_i8mm,
#endif
#ifdef GGML_EXT_HAVE_AVX2
    &ggml_ext_interleaved4_impl_avx2,
#endif
#ifdef GGML_EXT_HAVE_AVX512VNNI
    &ggml_ext_interleaved4_impl_avx512vnni,
#endif
};

#define N_IMPLS ((int) (sizeof(impls) / sizeof(impls[0])))

int ggml_ext_interleaved4_impl_count(void) {
    return N_IMPLS;
}

const struct ggml_ext_interleaved4_impl * ggml_ext_interleaved4_impl_get(int i) {
    return i >= 0 && i < N_IMPLS ? impls[i] : NULL;
}

static int usable(const struct ggml_ext_interleaved4_impl * p) {
    return !p->usable || p->usable();
}

// The best usable implementation's pointer for one activation quantizer (generic always has it).
#define BEST(field)                                  \
    do {                                             \
        for (int i = N_IMPLS - 1; i > 0; i--) {      \
            if (impls[i]->field && usable(impls[i])) { \
                return impls[i]->field;              \
            }                                        \
        }                                            \
        return impls[0]->field;                      \
    } while (0)

static ggml_ext_interleaved4_mm_fn entry(const struct ggml_ext_interleaved4_impl * p, int values, int layout, int gemm) {
    return gemm ? p->gemm[values][layout] : p->gemv[values][layout];
}

// The implementation that runs an entry: the best usable one that has it, the scalar
// reference (generic, which has every entry) at worst. The kernels and the reports below
// both ask this one function, so a report names what runs.
static const struct ggml_ext_interleaved4_impl * pick(int values, int layout, int gemm) {
    for (int i = N_IMPLS - 1; i > 0; i--) {
        if (entry(impls[i], values, layout, gemm) && usable(impls[i])) {
            return impls[i];
        }
    }
    return impls[0];
}

const char * ggml_ext_interleaved4_dispatched(enum ggml_ext_interleaved4_values values, enum ggml_ext_interleaved4_layout layout, int gemm) {
    if ((unsigned) values >= GGML_EXT_INTERLEAVED4_N_VALUES || (unsigned) layout >= GGML_EXT_INTERLEAVED4_N_LAYOUTS) {
        return NULL;
    }
    return pick(values, layout, gemm != 0)->name;
}

// The values of a registry row of this family (its BASE column).
static int values_of(const struct ggml_ext_type_info * t) {
    return t->base_type == GGML_EXT_BASE_IQ4_NL ? GGML_EXT_INTERLEAVED4_IQ4_NL : GGML_EXT_INTERLEAVED4_Q4_0;
}

const char * ggml_ext_interleaved4_dispatched_kernel(int type, int gemm) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    if (!t || t->family != GGML_EXT_FAMILY_INTERLEAVED4) {
        return NULL;
    }
    return ggml_ext_interleaved4_dispatched(values_of(t), t->layout, gemm);
}

static ggml_ext_q8_0_row_fn best_quantize_row(void) {
    BEST(quantize_row_q8_0);
}

static ggml_ext_q8_0_x4_fn best_quantize_mat_4x4(void) {
    BEST(quantize_mat_q8_0_4x4);
}

static ggml_ext_q8_0_x4_fn best_quantize_mat_4x8(void) {
    BEST(quantize_mat_q8_0_4x8);
}

void ggml_ext_quantize_row_q8_0(const float * x, void * vy, int64_t k) {
    best_quantize_row()(x, vy, k);
}

void ggml_ext_quantize_mat_q8_0_4x4(const float * x, void * vy, int64_t k) {
    best_quantize_mat_4x4()(x, vy, k);
}

void ggml_ext_quantize_mat_q8_0_4x8(const float * x, void * vy, int64_t k) {
    best_quantize_mat_4x8()(x, vy, k);
}

// The public kernels (interleaved4.h): the best usable implementation's entry for each type.
#define PUBLIC(values, V, NxB, L)                                             \
    void ggml_ext_gemv_##values##_##NxB##_q8_0(GGML_EXT_INTERLEAVED4_MM_ARGS) {         \
        entry(pick(V, L, 0), V, L, 0)(n, s, bs, vx, vy, nr, nc);              \
    }                                                                         \
    void ggml_ext_gemm_##values##_##NxB##_q8_0(GGML_EXT_INTERLEAVED4_MM_ARGS) {         \
        entry(pick(V, L, 1), V, L, 1)(n, s, bs, vx, vy, nr, nc);              \
    }
PUBLIC(q4_0, GGML_EXT_INTERLEAVED4_Q4_0, 4x4, GGML_EXT_INTERLEAVED4_4X4)
PUBLIC(q4_0, GGML_EXT_INTERLEAVED4_Q4_0, 4x8, GGML_EXT_INTERLEAVED4_4X8)
PUBLIC(q4_0, GGML_EXT_INTERLEAVED4_Q4_0, 8x8, GGML_EXT_INTERLEAVED4_8X8)
PUBLIC(iq4_nl, GGML_EXT_INTERLEAVED4_IQ4_NL, 4x4, GGML_EXT_INTERLEAVED4_4X4)
PUBLIC(iq4_nl, GGML_EXT_INTERLEAVED4_IQ4_NL, 4x8, GGML_EXT_INTERLEAVED4_4X8)
PUBLIC(iq4_nl, GGML_EXT_INTERLEAVED4_IQ4_NL, 8x8, GGML_EXT_INTERLEAVED4_8X8)

// One traits entry per registry row of the family, in [values][layout] order.
static const struct ggml_ext_interleaved4_layout_traits traits[GGML_EXT_INTERLEAVED4_N_VALUES][GGML_EXT_INTERLEAVED4_N_LAYOUTS] = {
    { { "Q4_0_4_4", 31, 4, 4, sizeof(ggml_ext_block_q4_0x4), ggml_ext_quantize_mat_q8_0_4x4, ggml_ext_gemv_q4_0_4x4_q8_0,
        ggml_ext_gemm_q4_0_4x4_q8_0 },
      { "Q4_0_4_8", 32, 4, 8, sizeof(ggml_ext_block_q4_0x4), ggml_ext_quantize_mat_q8_0_4x8, ggml_ext_gemv_q4_0_4x8_q8_0,
        ggml_ext_gemm_q4_0_4x8_q8_0 },
      { "Q4_0_8_8", 33, 8, 8, sizeof(ggml_ext_block_q4_0x8), ggml_ext_quantize_mat_q8_0_4x8, ggml_ext_gemv_q4_0_8x8_q8_0,
        ggml_ext_gemm_q4_0_8x8_q8_0 } },
    { { "IQ4_NL_4_4", 36, 4, 4, sizeof(ggml_ext_block_q4_0x4), ggml_ext_quantize_mat_q8_0_4x4,
        ggml_ext_gemv_iq4_nl_4x4_q8_0, ggml_ext_gemm_iq4_nl_4x4_q8_0 },
      { "IQ4_NL_4_8", 37, 4, 8, sizeof(ggml_ext_block_q4_0x4), ggml_ext_quantize_mat_q8_0_4x8,
        ggml_ext_gemv_iq4_nl_4x8_q8_0, ggml_ext_gemm_iq4_nl_4x8_q8_0 },
      { "IQ4_NL_8_8", 38, 8, 8, sizeof(ggml_ext_block_q4_0x8), ggml_ext_quantize_mat_q8_0_4x8,
        ggml_ext_gemv_iq4_nl_8x8_q8_0, ggml_ext_gemm_iq4_nl_8x8_q8_0 } },
};

const struct ggml_ext_interleaved4_layout_traits * ggml_ext_interleaved4_layout_traits(enum ggml_ext_interleaved4_values values,
                                                                  enum ggml_ext_interleaved4_layout layout) {
    if ((unsigned) values >= GGML_EXT_INTERLEAVED4_N_VALUES || (unsigned) layout >= GGML_EXT_INTERLEAVED4_N_LAYOUTS) {
        return NULL;
    }
    return &traits[values][layout];
}
