// Dispatch of the KVQuant kernels: the best compiled-in implementation (common/simd.h decides from
// the target flags, as for every family) that takes the layer, else the scalar reference.
#include "formats/kvquant/kvquant.h"

#include <string.h>

static const struct ggml_ext_kvquant_impl * const impls[] = {
    &ggml_ext_kvquant_impl_generic,
#ifdef GGML_EXT_HAVE_NEON
    &ggml_ext_kvquant_impl_neon,
#endif
#ifdef GGML_EXT_HAVE_AVX2
    &ggml_ext_kvquant_impl_avx2,
#endif
};

#define N_IMPLS ((int) (sizeof(impls) / sizeof(impls[0])))

static const struct ggml_ext_kvquant_impl * forced;  // tests and benchmarks only (ggml_ext_kvquant_force)

int ggml_ext_kvquant_force(const char * name) {
    if (!name) {
        forced = NULL;
        return 0;
    }
    for (int i = 0; i < N_IMPLS; i++) {
        if (!strcmp(impls[i]->name, name)) {
            forced = impls[i];
            return 0;
        }
    }
    return -1;
}

// SIMD kernels take 4-bit layers with head_dim a multiple of 16 (8 pairs per step)
static int simd_takes(const struct ggml_ext_kvquant_layer * L) {
    return L->bits == 4 && L->head_dim % 16 == 0;
}

static const struct ggml_ext_kvquant_impl * pick(const struct ggml_ext_kvquant_layer * L) {
    if (forced) {
        return forced == impls[0] || simd_takes(L) ? forced : impls[0];
    }
    return simd_takes(L) ? impls[N_IMPLS - 1] : impls[0];
}

const char * ggml_ext_kvquant_kernel(const struct ggml_ext_kvquant_layer * L) {
    return pick(L)->name;
}

static void k_scores(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * q, int n_q, const void * k_rows,
                     size_t stride, const int32_t * pos, int n_tokens, float * scores) {
    if (!pick(L)->k_scores(L, h0, nh, q, n_q, k_rows, stride, pos, n_tokens, scores)) {
        impls[0]->k_scores(L, h0, nh, q, n_q, k_rows, stride, pos, n_tokens, scores);
    }
}

static void v_accumulate(const struct ggml_ext_kvquant_layer * L, int h0, int nh, const float * w, int n_q,
                         const void * v_rows, size_t stride, int n_tokens, float * out) {
    if (!pick(L)->v_accumulate(L, h0, nh, w, n_q, v_rows, stride, n_tokens, out)) {
        impls[0]->v_accumulate(L, h0, nh, w, n_q, v_rows, stride, n_tokens, out);
    }
}

void ggml_ext_kvquant_k_scores(const struct ggml_ext_kvquant_layer * L, int head, const float * q, int n_q, const void * k_rows,
                               size_t stride, const int32_t * pos, int n_tokens, float * scores) {
    if (head < 0) {
        k_scores(L, 0, L->n_kv_heads, q, n_q, k_rows, stride, pos, n_tokens, scores);
    } else if (head < L->n_kv_heads) {
        k_scores(L, head, 1, q, n_q, k_rows, stride, pos, n_tokens, scores);
    }
}

void ggml_ext_kvquant_v_accumulate(const struct ggml_ext_kvquant_layer * L, int head, const float * w, int n_q,
                                   const void * v_rows, size_t stride, int n_tokens, float * out) {
    if (head < 0) {
        v_accumulate(L, 0, L->n_kv_heads, w, n_q, v_rows, stride, n_tokens, out);
    } else if (head < L->n_kv_heads) {
        v_accumulate(L, head, 1, w, n_q, v_rows, stride, n_tokens, out);
    }
}
