// ggml-ext's ops in ggml-cuda: patch 0200 sends every op ggml-cuda does not know here; this file finds
// the op's table by its GGML_OP id, from the rows of ggml-ext-ops.def marked CUDA.
#include "ggml-ext-cuda.cuh"

static const ggml_ext_cuda_op * cuda_op(int op) {
    switch (op) {
#define GGML_EXT_CUDA_CASE_CUDA(NAME, name) \
    case GGML_OP_##NAME:                    \
        return &ggml_ext_cuda_op_##name;
#define GGML_EXT_CUDA_CASE_NO_CUDA(NAME, name)
#define GGML_EXT_OP(NAME, name, symbol, cuda) GGML_EXT_CUDA_CASE_##cuda(NAME, name)
#include "ggml-ext-ops.def"
#undef GGML_EXT_OP
        default:
            return nullptr;
    }
}

bool ggml_ext_cuda_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_ext_cuda_op * o = cuda_op(dst->op);
    if (o == nullptr) {
        return false;
    }
    o->forward(ctx, dst);
    return true;
}

bool ggml_ext_cuda_supports_ext_op(int device, const ggml_tensor * op) {
    const ggml_ext_cuda_op * o = cuda_op(op->op);
    return o != nullptr && o->supports(device, op);
}
