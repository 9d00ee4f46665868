// GGML_OP_APQ_MUL_MAT, ggml-base side: the graph constructor and the node check every backend runs
// before computing (an RPC server receives nodes that no constructor checked).
//
// dst = W_b . x for an any-precision weight (docs/formats/anyprec.md): W's bitplanes (type APQ, parent
// precision P) read at precision b, i.e. its first b planes and precision b's centroid tables only. The
// tables are a separate F16 tensor (the file's "<name>.apq_tables"); the seed precision S follows from
// their length, N (2^(P+1) - 2^S), and travels in the op params with P and b.
#include "ggml-ext-ops.h"

enum { P_SEED = 0, P_PARENT = 1, P_BITS = 2 };

int ggml_ext_anyprec_parent_bits(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_ANYPREC ? t->layout : 0;
}

int ggml_ext_anyprec_seed_bits(const struct ggml_tensor * w, const struct ggml_tensor * tables) {
    const int P = w ? ggml_ext_anyprec_parent_bits((int) w->type) : 0;
    if (P == 0 || !tables || tables->type != GGML_TYPE_F16 || ggml_nrows(tables) != 1 || w->ne[1] <= 0) {
        return -1;
    }
    const int64_t n = w->ne[1];
    for (int s = 1; s <= P; s++) {
        if (tables->ne[0] == n * ((INT64_C(2) << P) - (INT64_C(1) << s))) {
            return s;
        }
    }
    return -1;
}

const char * ggml_ext_apq_mul_mat_check(const struct ggml_tensor * dst) {
    const struct ggml_tensor * w      = dst->src[0];
    const struct ggml_tensor * x      = dst->src[1];
    const struct ggml_tensor * tables = dst->src[2];
    if (!w || !x || !tables) {
        return "apq_mul_mat: needs w, x and tables";
    }
    const int P = ggml_ext_anyprec_parent_bits((int) w->type);
    if (P == 0) {
        return "apq_mul_mat: w is not an any-precision (APQ) tensor";
    }
    if (x->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32) {
        return "apq_mul_mat: x and the result are F32";
    }
    if (w->ne[2] != 1 || w->ne[3] != 1 || !ggml_is_contiguous(w) || w->ne[0] % 32 != 0) {
        return "apq_mul_mat: w is one contiguous matrix with rows of a multiple of 32 weights";
    }
    const int S = ggml_ext_anyprec_seed_bits(w, tables);
    if (S < 0 || !ggml_is_contiguous(tables)) {
        return "apq_mul_mat: tables is F16 [N (2^(P+1) - 2^S)] for w of N rows";
    }
    const int32_t * p = (const int32_t *) dst->op_params;
    if (p[P_SEED] != S || p[P_PARENT] != P || p[P_BITS] < S || p[P_BITS] > P) {
        return "apq_mul_mat: op params are S, P of w and its tables, and a precision S <= b <= P";
    }
    if (x->ne[0] != w->ne[0] || dst->ne[0] != w->ne[1]) {
        return "apq_mul_mat: x has rows of w's length K, the result rows of w's N";
    }
    for (int i = 1; i < GGML_MAX_DIMS; i++) {
        if (dst->ne[i] != x->ne[i]) {
            return "apq_mul_mat: the result has x's rows";
        }
    }
    if (x->nb[0] != sizeof(float) || dst->nb[0] != sizeof(float)) {
        return "apq_mul_mat: rows of x and of the result are contiguous";
    }
    return NULL;
}

struct ggml_tensor * ggml_ext_apq_mul_mat(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * x,
                                          struct ggml_tensor * tables, int bits) {
    const int64_t        ne[4]  = { w->ne[1], x->ne[1], x->ne[2], x->ne[3] };
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, ne);
    result->op                  = GGML_OP_APQ_MUL_MAT;
    result->src[0]              = w;
    result->src[1]              = x;
    result->src[2]              = tables;
    int32_t * p                 = (int32_t *) result->op_params;
    p[P_SEED]                   = ggml_ext_anyprec_seed_bits(w, tables);
    p[P_PARENT]                 = ggml_ext_anyprec_parent_bits((int) w->type);
    p[P_BITS]                   = bits;
    const char * err            = ggml_ext_apq_mul_mat_check(result);
    if (err) {
        GGML_ABORT("%s (w %s, precision %d)", err, w->name, bits);
    }
    return result;
}
