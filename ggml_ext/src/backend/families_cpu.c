// The ggml-cpu hooks (patches 0110 / 0111: mul_mat, supports_op) for every
// registered type: the registry says the family, the family's code answers (common/families.h).
// The kernel report (ggml_ext_dispatched_kernel) is in formats/dispatch.c, which the standalone kernel
// library compiles too.
#include "ggml-cpu-impl.h"
#include "ggml-ext.h"
#include "common/families.h"

// The family of the first registered type among the op's result and sources (0: none involved).
static int family_of_op(const struct ggml_tensor * op) {
    const struct ggml_ext_type_info * t = NULL;
    for (int i = 0; i < GGML_MAX_SRC && !t; i++) {
        t = op->src[i] ? ggml_ext_type_info_by_id((int) op->src[i]->type) : NULL;
    }
    if (!t) {
        t = ggml_ext_type_info_by_id((int) op->type);
    }
    return t ? t->family : 0;
}

int ggml_ext_cpu_supports_op(const struct ggml_tensor * op) {
    switch (family_of_op(op)) {
        case 0:
            return -1;
        case GGML_EXT_FAMILY_INTERLEAVED4:
            return ggml_ext_interleaved4_cpu_supports_op(op);
        case GGML_EXT_FAMILY_CODEBOOKS:
            return ggml_ext_codebooks_cpu_supports_op(op);
        case GGML_EXT_FAMILY_ANYPREC:
            return ggml_ext_anyprec_cpu_supports_op(op);
        case GGML_EXT_FAMILY_KVQUANT:
            return ggml_ext_kvquant_cpu_supports_op(op);
        default:
            return 0;
    }
}

bool ggml_ext_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id((int) dst->src[0]->type);
    switch (t ? t->family : 0) {
        case GGML_EXT_FAMILY_INTERLEAVED4:
            return ggml_ext_interleaved4_cpu_mul_mat(params, dst);
        case GGML_EXT_FAMILY_CODEBOOKS:
            return ggml_ext_codebooks_cpu_mul_mat(params, dst);
        case GGML_EXT_FAMILY_ANYPREC:
            return ggml_ext_anyprec_cpu_mul_mat(params, dst);
        case GGML_EXT_FAMILY_KVQUANT:
            return ggml_ext_kvquant_cpu_mul_mat(params, dst);
        default:
            return false;
    }
}
