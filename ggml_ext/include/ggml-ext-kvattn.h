// KVQuant decode attention (issue 20; docs/KVQUANT.md "In llama.cpp's cache", "The decode op"): attention
// straight from a pre-RoPE NUQ key cache, keys decoded and roped on the fly, flash-decoding style (cell ranges
// in parallel, then a combine). A header of its own, included only by the patched llama-graph.cpp (patch 0326)
// and ggml-ext's sources, so changing it rebuilds little.
#pragma once

#include "ggml-ext.h"
#include "ggml.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- ggml-cpu (src/ggml/kvattn_cpu.c) ----

// The RoPE of the model's keys, as ggml_rope_ext takes it (mode GGML_ROPE_TYPE_NORMAL or _NEOX).
struct ggml_ext_kvq_rope {
    int   mode, n_dims, n_ctx_orig;
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
};

// softmax(scale * q . RoPE(k, pos) + mask) . v for every query head and token, as ggml_flash_attn_ext with
// K = ggml_rope_ext(dequantized k) at the cells' positions would give (without its F16 rounding of q and K):
//   q     F32 [hd, n_head, n_tokens] (any strides; n_tokens = n_stream * tokens per stream, stream-major)
//   k     the cache view [hd, n_head_kv, n_kv, n_stream] of any type with a to_float (the NUQ key types: their
//         binding, outlier slots and sink rows as to_float reads them); rows of hd contiguous
//   v     [hd_v, n_head_kv, n_kv, n_stream], F32, F16 or any type with a to_float, rows contiguous
//   mask  F16 or F32 [n_kv, >= tokens per stream, 1, n_stream]: added to the scaled score (-inf: skip)
//   k_pos I32 [n_kv * n_stream]: the cells' positions;  freq_factors: F32 [>= n_dims / 2] or NULL
//   k_norm_w F32 [hd] or NULL: the model's K norm between the cache and RoPE (qwen3): each KV head's key is
//         rms_norm(k, k_norm_eps) * k_norm_w before RoPE, as ggml_rms_norm and ggml_mul compute it
// n_head a multiple of n_head_kv (GQA: query head i reads KV head i / (n_head / n_head_kv)). Returns the
// result F32 [hd_v, n_head, n_tokens], or NULL and a reason in why when the graph is not one it takes.
// Three ggml custom nodes: the cells' cos / sin table (once per k_pos and RoPE: layers share it), partial
// softmax sums over ranges of `chunk` cells (threads over ranges x token tiles), and the combine.
GGML_EXT_API struct ggml_tensor * ggml_ext_kvq_attn(struct ggml_context * ctx, struct ggml_tensor * q,
                                                    struct ggml_tensor * k, struct ggml_tensor * v,
                                                    struct ggml_tensor * mask, struct ggml_tensor * k_pos,
                                                    struct ggml_tensor * freq_factors,
                                                    const struct ggml_ext_kvq_rope * rope,
                                                    struct ggml_tensor * k_norm_w, float k_norm_eps, float scale,
                                                    int chunk, char * why, size_t why_size);

// Whether `node` is the partial-sums node ggml_ext_kvq_attn makes (the CPU backend's supports_op: a custom
// node reading a NUQ cache is ours only then).
GGML_EXT_API bool ggml_ext_kvq_attn_is_node(const struct ggml_tensor * node);

// ---- ggml-base (src/ggml/kvattn_base.c): the op's nodes, for every backend ----

// The op's three GGML_OP_CUSTOM nodes (ggml_ext_kvq_attn_node_kind): the cos / sin table, the partial sums, the combine.
enum { GGML_EXT_KVA_TABLE = 1, GGML_EXT_KVA_PARTIAL = 2, GGML_EXT_KVA_COMBINE = 3 };

// Which of the op's nodes `node` is (GGML_EXT_KVA_*), 0 for any other tensor: ggml-cuda's supports_op and
// compute_forward (patch 0421, src/cuda/kvattn_cuda.cu) take the three by it. The nodes carry the tag of their
// kind as their userdata.
GGML_EXT_API int ggml_ext_kvq_attn_node_kind(const struct ggml_tensor * node);
GGML_EXT_API void * ggml_ext_kvq_attn_tag(int kind);

// ---- libllama (src/glue/kvquant_cache.c) ----

// llama_graph's hook (patch 0326; the iSWA build_attn of patch 0327 with each layer's own cache, positions and
// mask): the attention of a pre-RoPE K cache through ggml_ext_kvq_attn, or NULL
// when it does not take this layer (then the caller ropes the whole cache, ggml_ext_llama_k_rope, and runs
// its own attention). q [hd, n_head, n_tokens], k / v the cache views, k_roped the model's roped K node
// (its RoPE parameters), k_pos the cells' positions. Taken: graphs of at most GGML_EXT_KV_ATTN_MAX_TOKENS
// tokens (default 16), no ALiBi, soft-capping, attention sinks or KQ bias, a transposed V refused, the cache
// (and a K norm's weight) in host memory or, in a GGML_EXT_CUDA build, the cache in a device's memory (the op's nodes
// then run on ggml-cuda, src/cuda/kvattn_cuda.cu; not with GGML_EXT_KV_KBLOCK's block-scaled keys). GGML_EXT_KV_ATTN=ref keeps the dequantize-and-rope path, =fused takes any size, =check
// as fused with the reference computed beside it and each layer's max difference printed on stderr.
GGML_EXT_API struct ggml_tensor * ggml_ext_llama_kv_attn(struct ggml_context * ctx, struct ggml_tensor * q,
                                                         struct ggml_tensor * k, struct ggml_tensor * v,
                                                         struct ggml_tensor * kq_mask, struct ggml_tensor * sinks,
                                                         float kq_scale, float max_bias, float softcap,
                                                         const struct ggml_tensor * k_roped,
                                                         struct ggml_tensor * k_pos);

#ifdef __cplusplus
}
#endif
