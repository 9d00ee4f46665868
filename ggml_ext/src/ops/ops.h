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

// Row-wise ops "dst[., r] = y[., r] + f(x[., r])" (COL_SIDECAR, DEC_MUL_MAT): the rows x M outputs split into
// equal contiguous ranges over the node's threads, so one token (decode) still spreads over every thread and
// each output is computed by exactly one thread, the same way whatever their number. A thread walks its range
// as pieces: one row's outputs [m0, m1) with that row's x, y and dst.
struct ggml_ext_row_piece {
    int64_t       row, m0, m1;
    const float * x;
    const float * y;
    float *       dst;
};

struct ggml_ext_row_split {
    int64_t                    e, end, M;
    const struct ggml_tensor * x;
    const struct ggml_tensor * y;
    struct ggml_tensor *       dst;
};

static inline struct ggml_ext_row_split ggml_ext_row_split(int ith, int nth, const struct ggml_tensor * y,
                                                           const struct ggml_tensor * x, struct ggml_tensor * dst) {
    const int64_t M = y->ne[0], n = ggml_nrows(y) * M, per = (n + nth - 1) / nth, start = per * ith;
    struct ggml_ext_row_split s = { start, start + per < n ? start + per : n, M, x, y, dst };
    return s;
}

// the next piece of the thread's range; 0 when it is done
static inline int ggml_ext_row_split_next(struct ggml_ext_row_split * s, struct ggml_ext_row_piece * p) {
    if (s->e >= s->end) {
        return 0;
    }
    const int64_t M = s->M, ne1 = s->y->ne[1], ne2 = s->y->ne[2];
    const int64_t r = s->e / M, m0 = s->e % M, m1 = M - m0 < s->end - s->e ? M : m0 + (s->end - s->e);
    const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    p->row = r;
    p->m0  = m0;
    p->m1  = m1;
    p->x   = (const float *) ((const char *) s->x->data + i1 * s->x->nb[1] + i2 * s->x->nb[2] + i3 * s->x->nb[3]);
    p->y   = (const float *) ((const char *) s->y->data + i1 * s->y->nb[1] + i2 * s->y->nb[2] + i3 * s->y->nb[3]);
    p->dst = (float *) ((char *) s->dst->data + i1 * s->dst->nb[1] + i2 * s->dst->nb[2] + i3 * s->dst->nb[3]);
    s->e += m1 - m0;
    return 1;
}

#define GGML_EXT_OP(NAME, name, symbol, cuda) extern const struct ggml_ext_cpu_op ggml_ext_cpu_op_##name;
#include "ggml-ext-ops.def"
#undef GGML_EXT_OP
