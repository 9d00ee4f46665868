// GGML_OP_COL_SIDECAR, ggml-base side: the graph constructor and the node check every backend runs
// before computing (an RPC server receives nodes that no constructor checked).
//
// dst = y + S . x[idx]. The side-car of a linear layer: y is W.x of the main weight, idx a few input
// columns (channels) and S their [k, M] coefficients, so W.x + S.x[idx] is the layer with those
// columns held apart (kept at higher precision: the static OOC / dense-and-sparse form; picked per
// step from the activation: the dynamic DEC form, which later gives idx a row per token).
#include "ggml-ext-ops.h"

const char * ggml_ext_col_sidecar_check(const struct ggml_tensor * dst) {
    const struct ggml_tensor * y   = dst->src[0];
    const struct ggml_tensor * x   = dst->src[1];
    const struct ggml_tensor * idx = dst->src[2];
    const struct ggml_tensor * s   = dst->src[3];
    if (!y || !x || !idx || !s) {
        return "col_sidecar: needs y, x, idx and s";
    }
    if (dst->type != GGML_TYPE_F32 || y->type != GGML_TYPE_F32 || x->type != GGML_TYPE_F32 ||
        s->type != GGML_TYPE_F32 || idx->type != GGML_TYPE_I32) {
        return "col_sidecar: y, x, s and the result are F32, idx is I32";
    }
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (dst->ne[i] != y->ne[i]) {
            return "col_sidecar: the result has y's shape";
        }
        if (i > 0 && x->ne[i] != y->ne[i]) {
            return "col_sidecar: x and y have the same rows";
        }
    }
    if (ggml_nrows(idx) != 1 || s->ne[0] != idx->ne[0] || s->ne[1] != y->ne[0] || s->ne[2] != 1 || s->ne[3] != 1) {
        return "col_sidecar: idx is [k] and s is [k, M] for y of [M, ...]";
    }
    if (!ggml_is_contiguous(idx) || !ggml_is_contiguous_rows(s) || !ggml_is_contiguous_rows(x) ||
        !ggml_is_contiguous_rows(y) || !ggml_is_contiguous_rows(dst)) {
        return "col_sidecar: rows of y, x, s and the result are contiguous, idx is contiguous";
    }
    return NULL;
}

struct ggml_tensor * ggml_ext_col_sidecar(struct ggml_context * ctx, struct ggml_tensor * y, struct ggml_tensor * x,
                                          struct ggml_tensor * idx, struct ggml_tensor * s) {
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, y->ne);
    result->op     = GGML_OP_COL_SIDECAR;
    result->src[0] = y;
    result->src[1] = x;
    result->src[2] = idx;
    result->src[3] = s;
    const char * err = ggml_ext_col_sidecar_check(result);
    if (err) {
        GGML_ABORT("%s", err);
    }
    return result;
}
