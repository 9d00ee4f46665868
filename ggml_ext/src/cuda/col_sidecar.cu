// GGML_OP_COL_SIDECAR on CUDA: dst[m, r] = y[m, r] + sum_j s[j, m] * x[idx[j], r], checked against the
// CPU reference (ggml_ext/src/ops/col_sidecar_cpu.c) by tests/c/test_ext_ops.cpp.
//
// One block per (row r, 256 outputs): its threads first gather the row's k selected inputs x[idx[j], r]
// into shared memory, then each thread sums its output over j = 0..k-1 in order, as the CPU does (the
// results may still differ in the last bits: nvcc contracts a*b+c into FMA, a CPU build may not).
#include "ggml-cuda/common.cuh"

#include "ggml-ext-cuda.cuh"
#include "ggml-ext-ops.h"

#define COL_SIDECAR_BLOCK 256
// the gathered inputs live in shared memory: 48 KiB without opting in to more
#define COL_SIDECAR_MAX_K (48 * 1024 / (int) sizeof(float))

static __global__ void k_col_sidecar(const char * __restrict__ y, const char * __restrict__ x,
                                     const int32_t * __restrict__ idx, const char * __restrict__ s,
                                     char * __restrict__ dst, const int64_t M, const int k, const int64_t K,
                                     const int64_t ne1, const int64_t ne2, const size_t y_nb1, const size_t y_nb2,
                                     const size_t y_nb3, const size_t x_nb1, const size_t x_nb2, const size_t x_nb3,
                                     const size_t d_nb1, const size_t d_nb2, const size_t d_nb3, const size_t s_nb1) {
    extern __shared__ float xs[];  // x[idx[j], r] for j < k

    const int64_t r  = blockIdx.x;
    const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    const float * xr = (const float *) (x + i1 * x_nb1 + i2 * x_nb2 + i3 * x_nb3);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int32_t c = idx[j];
        // the CPU backend aborts on an index out of range; a kernel cannot, so such a column adds nothing
        xs[j] = c >= 0 && c < K ? xr[c] : 0.0f;
    }
    __syncthreads();

    const int64_t m = (int64_t) blockIdx.y * blockDim.x + threadIdx.x;
    if (m >= M) {
        return;
    }
    const float * sm  = (const float *) (s + m * s_nb1);
    float         acc = 0.0f;
    for (int j = 0; j < k; j++) {
        acc += sm[j] * xs[j];
    }
    const float * yr = (const float *) (y + i1 * y_nb1 + i2 * y_nb2 + i3 * y_nb3);
    float *       dr = (float *) (dst + i1 * d_nb1 + i2 * d_nb2 + i3 * d_nb3);
    dr[m]            = yr[m] + acc;
}

static bool supports(int device, const ggml_tensor * op) {
    GGML_UNUSED(device);
    if (ggml_ext_col_sidecar_check(op) != nullptr) {
        return false;
    }
    // grid: x = rows of the result, y = blocks of outputs (at most 65535)
    return op->src[2]->ne[0] <= COL_SIDECAR_MAX_K && ggml_nrows(op) <= INT32_MAX &&
           (op->ne[0] + COL_SIDECAR_BLOCK - 1) / COL_SIDECAR_BLOCK <= 65535;
}

static void forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const char * err = ggml_ext_col_sidecar_check(dst);
    if (err) {
        GGML_ABORT("%s", err);
    }
    const ggml_tensor * y   = dst->src[0];
    const ggml_tensor * x   = dst->src[1];
    const ggml_tensor * idx = dst->src[2];
    const ggml_tensor * s   = dst->src[3];
    const int64_t       M = y->ne[0], rows = ggml_nrows(y);
    const int           k = (int) idx->ne[0];
    GGML_ASSERT(k <= COL_SIDECAR_MAX_K);
    if (M == 0 || rows == 0) {
        return;
    }
    const dim3 grid((unsigned) rows, (unsigned) ((M + COL_SIDECAR_BLOCK - 1) / COL_SIDECAR_BLOCK));
    k_col_sidecar<<<grid, COL_SIDECAR_BLOCK, k * sizeof(float), ctx.stream()>>>(
        (const char *) y->data, (const char *) x->data, (const int32_t *) idx->data, (const char *) s->data,
        (char *) dst->data, M, k, x->ne[0], y->ne[1], y->ne[2], y->nb[1], y->nb[2], y->nb[3], x->nb[1], x->nb[2],
        x->nb[3], dst->nb[1], dst->nb[2], dst->nb[3], s->nb[1]);
}

extern const ggml_ext_cuda_op ggml_ext_cuda_op_col_sidecar = { supports, forward };
