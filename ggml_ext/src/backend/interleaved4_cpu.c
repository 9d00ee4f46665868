// ggml-cpu side of the interleaved4 family (interleaved Q4_0 and IQ4_NL): mul_mat through our GEMV/GEMM kernels
// on ggml's threadpool, called from the hook at the top of ggml_compute_forward_mul_mat.
//
// Every thread first quantizes its share of src1 into the work buffer (whose size ggml
// plans from the Q8_0 vec_dot_type, a size these layouts share): per src1 plane, rows in
// groups of 4 as the layout's interleaved Q8_0x4 blocks (quantize_mat), the last ne11 % 4
// rows as plain Q8_0 rows. After a barrier each thread takes a range of weight rows (dst
// columns) in multiples of N and runs the GEMM on the 4-row groups, the GEMV on the rest.
#include "ggml-cpu-impl.h"

#include "formats/interleaved4/interleaved4.h"
#include "common/families.h"
#include "backend/interleaved4_runtime_repack.h"

// The registry (ggml-ext-types.def) says which types are ours and which family runs them.
static const struct ggml_ext_type_info * interleaved4(enum ggml_type type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id((int) type);
    return t && t->family == GGML_EXT_FAMILY_INTERLEAVED4 ? t : NULL;
}

static void mul_mat_interleaved(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                                const struct ggml_ext_interleaved4_layout_traits * lt);

bool ggml_ext_interleaved4_cpu_supports_op(const struct ggml_tensor * op) {
    const struct ggml_tensor * src0 = op->src[0];
    const struct ggml_tensor * src1 = op->src[1];
    // the kernels walk whole interleaved row groups: a view of part of each row cannot be read
    return op->op == GGML_OP_MUL_MAT && src0 && interleaved4(src0->type) && src0->ne[2] == 1 && src0->ne[3] == 1 &&
           ggml_is_contiguous(src0) && src1 && src1->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32;
}

bool ggml_ext_interleaved4_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_ext_type_info * t = interleaved4(dst->src[0]->type);
    if (!t) {
        return false;
    }
    // the activation side (Q8_0, interleaved by 4) is the same for both value tables
    const enum ggml_ext_interleaved4_layout l = (enum ggml_ext_interleaved4_layout) t->layout;
    const enum ggml_ext_interleaved4_values v = t->base_type == GGML_EXT_BASE_IQ4_NL ? GGML_EXT_INTERLEAVED4_IQ4_NL : GGML_EXT_INTERLEAVED4_Q4_0;
    mul_mat_interleaved(params, dst, ggml_ext_interleaved4_layout_traits(v, l));
    return true;
}

// src0's bytes are in `layout` whatever its type says (types 31-33, or a Q4_0 weight that the
// runtime repack put in our layout): both paths run this same code, hence the same numbers.
void ggml_ext_cpu_mul_mat_q4_0_layout(const struct ggml_compute_params * params, struct ggml_tensor * dst, int layout) {
    mul_mat_interleaved(params, dst, ggml_ext_interleaved4_layout_traits(GGML_EXT_INTERLEAVED4_Q4_0, (enum ggml_ext_interleaved4_layout) layout));
}

static void mul_mat_interleaved(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                                const struct ggml_ext_interleaved4_layout_traits * lt) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    GGML_ASSERT(src1->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32);
    GGML_ASSERT(ne02 == 1 && ne03 == 1);  // one interleaved matrix (weights)
    GGML_ASSERT(ne01 % lt->nrows == 0);
    GGML_ASSERT(ne00 % GGML_EXT_QK8_0 == 0);
    GGML_ASSERT(ne0 == ne01 && ne1 == ne11 && ne2 == ne12 && ne3 == ne13);
    GGML_ASSERT(nb10 == sizeof(float) && nb0 == sizeof(float));

    const int ith = params->ith;
    const int nth = params->nth;

    const size_t  q8_row   = (size_t) (ne00 / GGML_EXT_QK8_0) * sizeof(ggml_ext_block_q8_0);
    const size_t  q8_plane = q8_row * (size_t) ne11;
    // 4-row groups need 4 contiguous float rows.
    const int64_t nr4      = nb11 == (size_t) ne10 * sizeof(float) ? ne11 - ne11 % 4 : 0;
    GGML_ASSERT(params->wsize >= q8_plane * (size_t) (ne12 * ne13));

    char * const wdata = (char *) params->wdata;

    // --- quantize src1: 4-row groups and single rows, shared round-robin by the threads
    const int64_t units = nr4 / 4 + (ne11 - nr4);
    for (int64_t i13 = 0; i13 < ne13; i13++) {
        for (int64_t i12 = 0; i12 < ne12; i12++) {
            const char * x  = (const char *) src1->data + i12 * nb12 + i13 * nb13;
            char *       wq = wdata + (i13 * ne12 + i12) * q8_plane;
            for (int64_t u = ith; u < units; u += nth) {
                const int64_t row = u < nr4 / 4 ? u * 4 : nr4 + (u - nr4 / 4);
                if (row < nr4) {
                    lt->quantize_mat((const float *) (x + row * nb11), wq + row * q8_row, ne00);
                } else {
                    ggml_ext_quantize_row_q8_0((const float *) (x + row * nb11), wq + row * q8_row, ne00);
                }
            }
        }
    }

    ggml_barrier(params->threadpool);

    // --- this thread's weight rows: [c0, c1), multiples of N
    const int64_t groups = ne01 / lt->nrows;
    const int64_t c0     = (ith * groups) / nth * lt->nrows;
    const int64_t c1     = ((ith + 1) * groups) / nth * lt->nrows;
    if (c0 >= c1) {
        return;
    }
    const size_t w_row = (size_t) (ne00 / GGML_EXT_QK4_0) * sizeof(ggml_ext_block_q4_0);
    const char * w     = (const char *) src0->data + c0 * w_row;  // row groups are whole N-row slices
    const size_t bs    = nb1 / sizeof(float);

    for (int64_t i13 = 0; i13 < ne13; i13++) {
        for (int64_t i12 = 0; i12 < ne12; i12++) {
            const char * wq = wdata + (i13 * ne12 + i12) * q8_plane;
            float *      d  = (float *) ((char *) dst->data + i12 * nb2 + i13 * nb3) + c0;
            if (nr4 > 0) {
                lt->gemm((int) ne00, d, bs, w, wq, (int) nr4, (int) (c1 - c0));
            }
            if (ne11 > nr4) {
                lt->gemv((int) ne00, d + nr4 * bs, bs, w, wq + nr4 * q8_row, (int) (ne11 - nr4), (int) (c1 - c0));
            }
        }
    }
}
