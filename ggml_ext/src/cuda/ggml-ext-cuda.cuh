// ggml-ext's ops in ggml-cuda (GGML_EXT_CUDA=ON): what patch 0200 calls from ggml-cuda.cu, and the
// table each op's <name>.cu fills when its ggml-ext-ops.def row says CUDA.
#pragma once

#include "ggml.h"

struct ggml_backend_cuda_context;

// Runs ggml-ext's op `dst` on ctx's stream; false when it is not one of ggml-ext's ops with a CUDA kernel.
bool ggml_ext_cuda_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// supports_op of ggml-cuda for ops past upstream's: true when `op` is one of ggml-ext's ops with a CUDA
// kernel that runs this node on `device`.
bool ggml_ext_cuda_supports_ext_op(int device, const ggml_tensor * op);

struct ggml_ext_cuda_op {
    bool (*supports)(int device, const ggml_tensor * op);
    void (*forward)(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
};

// ggml_ext_cuda_op_<name> for each row marked CUDA (extern: a namespace-scope const is internal in C++)
#define GGML_EXT_CUDA_DECL_CUDA(name) extern const ggml_ext_cuda_op ggml_ext_cuda_op_##name;
#define GGML_EXT_CUDA_DECL_NO_CUDA(name)
#define GGML_EXT_OP(NAME, name, symbol, cuda) GGML_EXT_CUDA_DECL_##cuda(name)
#include "ggml-ext-ops.def"
#undef GGML_EXT_OP
#undef GGML_EXT_CUDA_DECL_CUDA
#undef GGML_EXT_CUDA_DECL_NO_CUDA
