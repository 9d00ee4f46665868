// ggml-cpu side of the any-precision family (APQ): which nodes the CPU backend takes. An APQ weight is
// computed only by GGML_OP_APQ_MUL_MAT (with its tables and a precision: src/ops/apq_mul_mat_cpu.c).
// The CPU answers yes to a plain mul_mat of it too, because llama.cpp's loader picks a weight's buffer
// by asking about the mul_mat it would build; the linear hook (llama/hooks.c) then replaces that
// mul_mat before any graph runs, and one that still reaches the CPU (a graph that did not go through the
// hook) stops with a message rather than computing without tables.
#include "ggml-cpu-impl.h"

#include "ggml-ext-ops.h"
#include "common/families.h"

static bool is_apq(const struct ggml_tensor * t) {
    return t && ggml_ext_anyprec_parent_bits((int) t->type) > 0;
}

bool ggml_ext_anyprec_cpu_supports_op(const struct ggml_tensor * op) {
    if (op->op == GGML_OP_APQ_MUL_MAT) {
        return ggml_ext_apq_mul_mat_check(op) == NULL;
    }
    return op->op == GGML_OP_MUL_MAT && is_apq(op->src[0]) && op->src[0]->ne[2] == 1 && op->src[0]->ne[3] == 1 &&
           op->src[1] && op->src[1]->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32;
}

bool ggml_ext_anyprec_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    (void) params;
    if (!is_apq(dst->src[0])) {
        return false;
    }
    GGML_ABORT("%s is an any-precision (APQ) weight: it runs through ggml_ext_apq_mul_mat with its tables and a "
               "precision (llama.cpp's linear hook does this), not through a plain mul_mat",
               dst->src[0]->name);
}
