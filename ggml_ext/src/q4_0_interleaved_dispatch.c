// Dispatch for the interleaved Q4_0 and IQ4_NL families: every compiled-in implementation, best last;
// each entry point runs the best usable one that has the kernel, the scalar reference at worst
// (an implementation may lack an entry: sve256-i8mm has only Q4_0_8_8, neon-i8mm only the B = 8 GEMMs).
// The choice follows the compiler's target flags (q4_0_interleaved_impl.h), as ggml's
// own CPU variants do: a build for a CPU runs on it, with any layout.
#include "iq4_nl_interleaved.h"
#include "q4_0_interleaved_impl.h"

static const struct ggml_ext_q4_0_impl * const impls[] = {
    &ggml_ext_q4_0_impl_generic,
#ifdef GGML_EXT_Q4_0_NEON_DOTPROD
    &ggml_ext_q4_0_impl_neon_dotprod,
#endif
#ifdef GGML_EXT_Q4_0_NEON_I8MM
    &ggml_ext_q4_0_impl_neon_i8mm,
#endif
#ifdef GGML_EXT_Q4_0_SVE_I8MM
    &ggml_ext_q4_0_impl_sve256_i8mm,
#endif
#ifdef GGML_EXT_Q4_0_AVX2
    &ggml_ext_q4_0_impl_avx2,
#endif
#ifdef GGML_EXT_Q4_0_AVX512VNNI
    &ggml_ext_q4_0_impl_avx512vnni,
#endif
};

#define N_IMPLS ((int) (sizeof(impls) / sizeof(impls[0])))

int ggml_ext_q4_0_impl_count(void) {
    return N_IMPLS;
}

const struct ggml_ext_q4_0_impl * ggml_ext_q4_0_impl_get(int i) {
    return i >= 0 && i < N_IMPLS ? impls[i] : NULL;
}

// The best usable implementation's pointer for one activation quantizer (generic always has it).
#define BEST(expr)                                   \
    do {                                             \
        for (int i = N_IMPLS - 1; i > 0; i--) {      \
            const struct ggml_ext_q4_0_impl * p = impls[i]; \
            if (p->expr && (!p->usable || p->usable())) { \
                return p->expr;                      \
            }                                        \
        }                                            \
        return impls[0]->expr;                       \
    } while (0)

// One GEMV/GEMM entry of one family and layout.
static ggml_ext_q4_0_mm_fn entry(const struct ggml_ext_q4_0_impl * p, int iq4_nl, int layout, int gemm) {
    if (iq4_nl) {
        return gemm ? p->gemm_iq4_nl[layout] : p->gemv_iq4_nl[layout];
    }
    return gemm ? p->gemm[layout] : p->gemv[layout];
}

// The implementation that runs an entry: the best usable one that has it, the scalar
// reference (generic, which has every entry) at worst. The kernels and the reports below
// both ask this one function, so a report names what runs.
static const struct ggml_ext_q4_0_impl * pick(int iq4_nl, int layout, int gemm) {
    for (int i = N_IMPLS - 1; i > 0; i--) {
        const struct ggml_ext_q4_0_impl * p = impls[i];
        if (entry(p, iq4_nl, layout, gemm) && (!p->usable || p->usable())) {
            return p;
        }
    }
    return impls[0];
}

static ggml_ext_q4_0_mm_fn best_gemv(int layout) {
    return pick(0, layout, 0)->gemv[layout];
}

static ggml_ext_q4_0_mm_fn best_gemm(int layout) {
    return pick(0, layout, 1)->gemm[layout];
}

static ggml_ext_q4_0_mm_fn best_gemv_iq4_nl(int layout) {
    return pick(1, layout, 0)->gemv_iq4_nl[layout];
}

static ggml_ext_q4_0_mm_fn best_gemm_iq4_nl(int layout) {
    return pick(1, layout, 1)->gemm_iq4_nl[layout];
}

const char * ggml_ext_q4_0_dispatched(enum ggml_ext_q4_0_layout layout, int gemm) {
    return (unsigned) layout < GGML_EXT_Q4_0_N_LAYOUTS ? pick(0, layout, gemm != 0)->name : NULL;
}

const char * ggml_ext_iq4_nl_dispatched(enum ggml_ext_q4_0_layout layout, int gemm) {
    return (unsigned) layout < GGML_EXT_Q4_0_N_LAYOUTS ? pick(1, layout, gemm != 0)->name : NULL;
}

const char * ggml_ext_dispatched_kernel(int type, int gemm) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    if (!t || t->family != GGML_EXT_FAMILY_INTERLEAVED4 || (unsigned) t->layout >= GGML_EXT_Q4_0_N_LAYOUTS) {
        return NULL;
    }
    return pick(t->base_type == GGML_EXT_BASE_IQ4_NL, t->layout, gemm != 0)->name;
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

void ggml_ext_gemv_q4_0_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemv(GGML_EXT_Q4_0_4_4)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemv_q4_0_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemv(GGML_EXT_Q4_0_4_8)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemv_q4_0_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemv(GGML_EXT_Q4_0_8_8)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemm_q4_0_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemm(GGML_EXT_Q4_0_4_4)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemm_q4_0_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemm(GGML_EXT_Q4_0_4_8)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemm_q4_0_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemm(GGML_EXT_Q4_0_8_8)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemv_iq4_nl_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemv_iq4_nl(GGML_EXT_Q4_0_4_4)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemm_iq4_nl_4x4_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemm_iq4_nl(GGML_EXT_Q4_0_4_4)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemv_iq4_nl_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemv_iq4_nl(GGML_EXT_Q4_0_4_8)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemm_iq4_nl_4x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemm_iq4_nl(GGML_EXT_Q4_0_4_8)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemv_iq4_nl_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemv_iq4_nl(GGML_EXT_Q4_0_8_8)(n, s, bs, vx, vy, nr, nc);
}

void ggml_ext_gemm_iq4_nl_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    best_gemm_iq4_nl(GGML_EXT_Q4_0_8_8)(n, s, bs, vx, vy, nr, nc);
}

static const struct ggml_ext_q4_0_layout_traits traits[GGML_EXT_Q4_0_N_LAYOUTS] = {
    { "Q4_0_4_4", 31, 4, 4, sizeof(ggml_ext_block_q4_0x4), ggml_ext_quantize_mat_q8_0_4x4, ggml_ext_gemv_q4_0_4x4_q8_0,
      ggml_ext_gemm_q4_0_4x4_q8_0 },
    { "Q4_0_4_8", 32, 4, 8, sizeof(ggml_ext_block_q4_0x4), ggml_ext_quantize_mat_q8_0_4x8, ggml_ext_gemv_q4_0_4x8_q8_0,
      ggml_ext_gemm_q4_0_4x8_q8_0 },
    { "Q4_0_8_8", 33, 8, 8, sizeof(ggml_ext_block_q4_0x8), ggml_ext_quantize_mat_q8_0_4x8, ggml_ext_gemv_q4_0_8x8_q8_0,
      ggml_ext_gemm_q4_0_8x8_q8_0 },
};

const struct ggml_ext_q4_0_layout_traits * ggml_ext_q4_0_layout_traits(enum ggml_ext_q4_0_layout layout) {
    return (unsigned) layout < GGML_EXT_Q4_0_N_LAYOUTS ? &traits[layout] : NULL;
}

static const struct ggml_ext_q4_0_layout_traits traits_iq4_nl[GGML_EXT_Q4_0_N_LAYOUTS] = {
    { "IQ4_NL_4_4", 36, 4, 4, sizeof(ggml_ext_block_q4_0x4), ggml_ext_quantize_mat_q8_0_4x4, ggml_ext_gemv_iq4_nl_4x4_q8_0,
      ggml_ext_gemm_iq4_nl_4x4_q8_0 },
    { "IQ4_NL_4_8", 37, 4, 8, sizeof(ggml_ext_block_q4_0x4), ggml_ext_quantize_mat_q8_0_4x8, ggml_ext_gemv_iq4_nl_4x8_q8_0,
      ggml_ext_gemm_iq4_nl_4x8_q8_0 },
    { "IQ4_NL_8_8", 38, 8, 8, sizeof(ggml_ext_block_q4_0x8), ggml_ext_quantize_mat_q8_0_4x8, ggml_ext_gemv_iq4_nl_8x8_q8_0,
      ggml_ext_gemm_iq4_nl_8x8_q8_0 },
};

const struct ggml_ext_q4_0_layout_traits * ggml_ext_iq4_nl_layout_traits(enum ggml_ext_q4_0_layout layout) {
    return (unsigned) layout < GGML_EXT_Q4_0_N_LAYOUTS ? &traits_iq4_nl[layout] : NULL;
}
