// ggml-ext's ops inside ggml-cpu: the table each op's <name>_cpu.c fills (ggml-ext-ops.def says which).
#pragma once

#include "ggml-ext-ops.h"

struct ggml_compute_params;

struct ggml_ext_cpu_op {
    // 1 when the CPU backend runs this node, 0 when it cannot (types, shapes)
    int (*supports)(const struct ggml_tensor * op);
    // threads of n_threads the op takes; NULL: all of them
    int (*n_tasks)(const struct ggml_tensor * op, int n_threads);
    // bytes of ggml's shared work buffer with n_tasks threads; NULL: none
    size_t (*work_size)(const struct ggml_tensor * op, int n_tasks);
    // called by every thread of the node (params->ith of params->nth)
    void (*forward)(const struct ggml_compute_params * params, struct ggml_tensor * dst);
};

#define GGML_EXT_OP(NAME, name, symbol, cuda) extern const struct ggml_ext_cpu_op ggml_ext_cpu_op_##name;
#include "ggml-ext-ops.def"
#undef GGML_EXT_OP
