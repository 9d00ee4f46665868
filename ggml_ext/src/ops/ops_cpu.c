// ggml-ext's ops in ggml-cpu: patch 0200 sends every op past upstream's here (forward, n_tasks, work
// size, supports_op); this file finds the op's table by its GGML_OP id, from ggml-ext-ops.def.
#include "ops.h"

static const struct ggml_ext_cpu_op * cpu_op(int op) {
    switch (op) {
#define GGML_EXT_OP(NAME, name, symbol, cuda) \
    case GGML_OP_##NAME:                      \
        return &ggml_ext_cpu_op_##name;
#include "ggml-ext-ops.def"
#undef GGML_EXT_OP
        default:
            return NULL;
    }
}

bool ggml_ext_cpu_forward(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_ext_cpu_op * o = cpu_op(dst->op);
    if (o == NULL) {
        return false;
    }
    o->forward(params, dst);
    return true;
}

int ggml_ext_cpu_n_tasks(const struct ggml_tensor * op, int n_threads) {
    const struct ggml_ext_cpu_op * o = cpu_op(op->op);
    if (o == NULL) {
        return 0;
    }
    const int n = o->n_tasks ? o->n_tasks(op, n_threads) : n_threads;
    return n < 1 ? 1 : n > n_threads ? n_threads : n;
}

size_t ggml_ext_cpu_work_size(const struct ggml_tensor * op, int n_tasks) {
    const struct ggml_ext_cpu_op * o = cpu_op(op->op);
    return o && o->work_size ? o->work_size(op, n_tasks) : 0;
}

int ggml_ext_cpu_supports_ext_op(const struct ggml_tensor * op) {
    const struct ggml_ext_cpu_op * o = cpu_op(op->op);
    return o == NULL ? -1 : o->supports(op) ? 1 : 0;
}
