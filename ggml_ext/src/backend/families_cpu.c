// The ggml-cpu family table (common/families.h) and the hooks it answers: patches 0110 / 0111 (mul_mat,
// supports_op) for every registered type. The kernel report (ggml_ext_dispatched_kernel) has a table of its own
// in formats/families.c, which the standalone kernel libraries compile too. ggml_ext_cpu_proc_address (patch 0113):
// the functions other libraries find through the CPU backend's registry entry.
#include "ggml-cpu-impl.h"
#include "common/families.h"
#include "ggml-ext-kvquant.h"

#include <string.h>

static const struct ggml_ext_family_cpu families[GGML_EXT_FAMILY_COUNT] = {
    [GGML_EXT_FAMILY_INTERLEAVED4] = { ggml_ext_interleaved4_cpu_supports_op, ggml_ext_interleaved4_cpu_mul_mat },
    [GGML_EXT_FAMILY_CODEBOOKS]    = { ggml_ext_codebooks_cpu_supports_op, ggml_ext_codebooks_cpu_mul_mat },
    [GGML_EXT_FAMILY_ANYPREC]      = { ggml_ext_anyprec_cpu_supports_op, ggml_ext_anyprec_cpu_mul_mat },
    [GGML_EXT_FAMILY_KVQUANT]      = { ggml_ext_kvquant_cpu_supports_op, ggml_ext_kvquant_cpu_mul_mat },
};

const struct ggml_ext_family_cpu * ggml_ext_family_cpu_of(int type) {
    const int family = ggml_ext_type_family(type);
    return family ? &families[family] : NULL;
}

// The family of the first registered type among the op's sources, else of its result (NULL: none involved).
static const struct ggml_ext_family_cpu * family_of_op(const struct ggml_tensor * op) {
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        if (op->src[i] && ggml_ext_is_type((int) op->src[i]->type)) {
            return ggml_ext_family_cpu_of((int) op->src[i]->type);
        }
    }
    return ggml_ext_family_cpu_of((int) op->type);
}

int ggml_ext_cpu_supports_op(const struct ggml_tensor * op) {
    const struct ggml_ext_family_cpu * f = family_of_op(op);
    if (!f) {
        return -1;  // no registered type involved: ggml-cpu decides
    }
    return f->supports_op ? f->supports_op(op) : 0;
}

bool ggml_ext_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_ext_family_cpu * f = ggml_ext_family_cpu_of((int) dst->src[0]->type);
    return f && f->mul_mat ? f->mul_mat(params, dst) : false;
}

void * ggml_ext_cpu_proc_address(const char * name) {
    // a function pointer as the registry's void * (memcpy: ISO C has no cast between the two)
    void * p = NULL;
    if (strcmp(name, "ggml_ext_kvquant_attn") == 0) {
        struct ggml_tensor * (*fn)(struct ggml_context *, struct ggml_tensor *, struct ggml_tensor *, struct ggml_tensor *,
                                   struct ggml_tensor *, struct ggml_tensor *, struct ggml_tensor *,
                                   const struct ggml_ext_kvquant_rope *, struct ggml_tensor *, float, float, int, char *,
                                   size_t) = ggml_ext_kvquant_attn;
        memcpy(&p, &fn, sizeof(p));
    }
    return p;
}
