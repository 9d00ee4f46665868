// ggml-cpu side of the codebooks family (CB2 / CB3): mul_mat through the family's kernels on ggml's
// threadpool (called from the hook at the top of ggml_compute_forward_mul_mat), and what the CPU
// backend runs: mul_mat of a 2-D weight with F32 activations, and get_rows (ggml's own, through the
// row-wise to_float of the type traits: patch 0110).
//
// Every thread first quantizes its share of src1's rows to Q8_K into the work buffer (ggml plans its
// size from the vec_dot_type Q8_K); after a barrier each thread takes a range of weight rows and
// runs the kernel on all activation rows of each src1 plane, so each weight block is decoded once
// per plane.
#include "ggml-cpu-impl.h"

#include "formats/codebooks/codebooks.h"
#include "common/families.h"

static const struct ggml_ext_type_info * codebooks(enum ggml_type type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id((int) type);
    return t && t->family == GGML_EXT_FAMILY_CODEBOOKS ? t : NULL;
}

bool ggml_ext_codebooks_cpu_supports_op(const struct ggml_tensor * op) {
    const struct ggml_tensor * src0 = op->src[0];
    const struct ggml_tensor * src1 = op->src[1];
    if (!src0 || !codebooks(src0->type)) {
        return false;  // a codebook type as a result or a later source: copies into it are not supported
    }
    switch (op->op) {
        case GGML_OP_MUL_MAT:
            return src0->ne[2] == 1 && src0->ne[3] == 1 && ggml_is_contiguous(src0) && src1 &&
                   src1->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32;
        case GGML_OP_GET_ROWS:
            return op->type == GGML_TYPE_F32 && src1 && src1->type == GGML_TYPE_I32;
        default:
            return false;
    }
}

bool ggml_ext_codebooks_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor *        src0 = dst->src[0];
    const struct ggml_tensor *        src1 = dst->src[1];
    const struct ggml_ext_type_info * t    = codebooks(src0->type);
    if (!t) {
        return false;
    }

    GGML_TENSOR_BINARY_OP_LOCALS

    GGML_ASSERT(src1->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32);
    GGML_ASSERT(ne02 == 1 && ne03 == 1);  // one weight matrix, broadcast over src1's planes
    GGML_ASSERT(ne00 % GGML_EXT_QK_CB == 0);
    GGML_ASSERT(ne0 == ne01 && ne1 == ne11 && ne2 == ne12 && ne3 == ne13);
    GGML_ASSERT(nb10 == sizeof(float) && nb0 == sizeof(float));

    const int ith = params->ith;
    const int nth = params->nth;

    const size_t q8_row   = (size_t) (ne00 / GGML_EXT_QK_CB) * sizeof(ggml_ext_block_q8_K);
    const size_t q8_plane = q8_row * (size_t) ne11;
    GGML_ASSERT(params->wsize >= q8_plane * (size_t) (ne12 * ne13));
    char * const wdata = (char *) params->wdata;

    // --- quantize src1's rows, shared round-robin by the threads
    for (int64_t i13 = 0; i13 < ne13; i13++) {
        for (int64_t i12 = 0; i12 < ne12; i12++) {
            const char * x  = (const char *) src1->data + i12 * nb12 + i13 * nb13;
            char *       wq = wdata + (i13 * ne12 + i12) * q8_plane;
            for (int64_t row = ith; row < ne11; row += nth) {
                ggml_ext_codebooks_quantize_row_q8_K((const float *) (x + row * nb11), wq + row * q8_row, ne00);
            }
        }
    }

    ggml_barrier(params->threadpool);

    // --- this thread's weight rows [c0, c1)
    const int64_t c0 = (ith * ne01) / nth;
    const int64_t c1 = ((ith + 1) * ne01) / nth;
    if (c0 >= c1) {
        return true;
    }
    const char * w  = (const char *) src0->data + c0 * nb01;
    const size_t bs = nb1 / sizeof(float);
    for (int64_t i13 = 0; i13 < ne13; i13++) {
        for (int64_t i12 = 0; i12 < ne12; i12++) {
            const char * wq = wdata + (i13 * ne12 + i12) * q8_plane;
            float *      d  = (float *) ((char *) dst->data + i12 * nb2 + i13 * nb3) + c0;
            ggml_ext_codebooks_mm(t->layout, (int) ne00, d, bs, w, wq, (int) ne11, (int) (c1 - c0));
        }
    }
    return true;
}
