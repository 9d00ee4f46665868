// The op_params of the KVQuant decode op's nodes (ggml-ext-kvquant.h), shared by the CPU functions
// (backend/kvquant_attn_cpu.c) and the CUDA kernels (cuda/kvquant_attn_cuda.cu): after ggml's struct ggml_custom_op_params
// (ggml-impl.h), the table node holds a struct ggml_ext_kvquant_rope, the partial node the struct below.
#pragma once

#include "ggml-ext-kvquant.h"
#include "ggml-impl.h"

#define GGML_EXT_KVQUANT_ATTN_OFF sizeof(struct ggml_custom_op_params)

struct ggml_ext_kvquant_attn_params {
    float scale;
    int   chunk, mode, n_dims, tile;
    float norm_eps;  // with a K norm (src[5], its weight): rms_norm(k, eps) * w per KV head before RoPE
};

#ifdef __cplusplus
static_assert(sizeof(struct ggml_custom_op_params) + sizeof(struct ggml_ext_kvquant_rope) <= GGML_MAX_OP_PARAMS,
              "rope parameters do not fit in op_params");
static_assert(sizeof(struct ggml_custom_op_params) + sizeof(struct ggml_ext_kvquant_attn_params) <= GGML_MAX_OP_PARAMS,
              "attention parameters do not fit in op_params");
#else
_Static_assert(sizeof(struct ggml_custom_op_params) + sizeof(struct ggml_ext_kvquant_rope) <= GGML_MAX_OP_PARAMS,
               "rope parameters do not fit in op_params");
_Static_assert(sizeof(struct ggml_custom_op_params) + sizeof(struct ggml_ext_kvquant_attn_params) <= GGML_MAX_OP_PARAMS,
               "attention parameters do not fit in op_params");
#endif
