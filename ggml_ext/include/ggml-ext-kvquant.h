// KVQuant in llama.cpp's cache (docs/KVQUANT.md "In llama.cpp's cache"): dense-and-sparse outliers and the
// attention sink ("Outliers and the sink"), and the decode attention straight from a pre-RoPE NUQ key cache,
// keys decoded and roped on the fly, flash-decoding style: cell ranges in parallel, then a combine ("The decode
// op"). A header of its own, included only by the KVQuant sources and the patched llama-kv-cache.cpp, arg.cpp
// and llama-graph.cpp (patches 0323, 0326), so changing it does not rebuild the rest of llama.cpp.
#pragma once

#include "ggml-ext.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ggml's graph types, as pointers only: the header needs no ggml.h
struct ggml_context;
struct ggml_tensor;

// ---- ggml-base (src/backend/kvquant_base.c) ----

// Binds [data, data + nbytes) (a cache tensor of rows of row_values values) like ggml_ext_kvquant_bind (values:
// k_mid = k_half = NULL) or ggml_ext_kvquant_bind_keys (keys: per-channel k_mid / k_half), with
//   outliers: 1 = in-block outlier slots (keys: up to 2 per 64-channel block, the channels beyond the
//             calibrated thresholds k_mid +- k_half with the largest excess; values: 1 per 64-value block,
//             the element whose removal narrows the block's range most), 0 = none;
//   n_sink:   cells written at positions < n_sink also keep their row in float (the attention sink), read
//             back instead of the blocks (0..GGML_EXT_KVQUANT_MAX_SINK).
#define GGML_EXT_KVQUANT_MAX_SINK 16
GGML_EXT_API int ggml_ext_kvquant_bind_opts(const void * data, size_t nbytes, int type, int64_t row_values,
                                        const float * levels, const float * values, const float * k_mid,
                                        const float * k_half, int outliers, int n_sink, char * err, size_t en);

// Whether `type` is a KVQuant cache type (its cache state carries the side blob below).
GGML_EXT_API bool ggml_ext_kvquant_is_cache_type(int type);

// The cache wrote cells[i] (row address data + cells[i] * row_stride) at position pos[i]: the sink marks of
// a bound tensor with n_sink > 0 follow (called before the graph that writes the rows runs). A no-op for
// memory outside every binding or without a sink.
GGML_EXT_API void ggml_ext_kvquant_rows_written(const void * data, size_t row_stride, const uint32_t * cells,
                                           const int32_t * pos, uint32_t n);

// State save / restore of the side data (the sink rows) of cells[0..n) of a bound tensor. side_get returns
// the blob's size and writes it to buf when cap suffices: u32 n_rows, u32 row_values, then n_rows x
// (u32 ordinal in cells, row_values f32). side_set reads such a blob for the destination cells (ordinal i ->
// cells[i]): the cells named get their sink rows, the others lose theirs; 0, or -1 (malformed: nothing kept).
GGML_EXT_API size_t ggml_ext_kvquant_side_get(const void * data, size_t row_stride, const uint32_t * cells, uint32_t n,
                                          void * buf, size_t cap);
GGML_EXT_API int ggml_ext_kvquant_side_set(const void * data, size_t row_stride, const uint32_t * cells, uint32_t n,
                                       const void * buf, size_t size);

// ---- libllama (src/llama/kvquant_cache.c) ----

// --kv-outliers F (GGML_EXT_KV_OUTLIERS): F = 0 off, else it must be the calibration's outlier fraction
// (kvquant.outlier_fraction): its thresholds and outlier tables are used. -1: invalid F.
GGML_EXT_API int   ggml_ext_llama_set_kv_outliers(float fraction);
// --kv-sink N (GGML_EXT_KV_SINK): the first N positions of every sequence in float. -1: N out of range.
GGML_EXT_API int   ggml_ext_llama_set_kv_sink(int n);

// ---- the decode attention ----

// ---- ggml-cpu (src/backend/kvquant_attn_cpu.c) ----

// The RoPE of the model's keys, as ggml_rope_ext takes it (mode GGML_ROPE_TYPE_NORMAL or _NEOX).
struct ggml_ext_kvquant_rope {
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
GGML_EXT_API struct ggml_tensor * ggml_ext_kvquant_attn(struct ggml_context * ctx, struct ggml_tensor * q,
                                                    struct ggml_tensor * k, struct ggml_tensor * v,
                                                    struct ggml_tensor * mask, struct ggml_tensor * k_pos,
                                                    struct ggml_tensor * freq_factors,
                                                    const struct ggml_ext_kvquant_rope * rope,
                                                    struct ggml_tensor * k_norm_w, float k_norm_eps, float scale,
                                                    int chunk, char * why, size_t why_size);

// Whether `node` is the partial-sums node ggml_ext_kvquant_attn makes (the CPU backend's supports_op: a custom
// node reading a NUQ cache is ours only then).
GGML_EXT_API bool ggml_ext_kvquant_attn_is_node(const struct ggml_tensor * node);

// ---- ggml-base (src/backend/kvquant_attn_base.c): the op's nodes, for every backend ----

// The op's three GGML_OP_CUSTOM nodes (ggml_ext_kvquant_attn_node_kind): the cos / sin table, the partial sums, the combine.
enum { GGML_EXT_KVQUANT_ATTN_TABLE = 1, GGML_EXT_KVQUANT_ATTN_PARTIAL = 2, GGML_EXT_KVQUANT_ATTN_COMBINE = 3 };

// Which of the op's nodes `node` is (GGML_EXT_KVQUANT_ATTN_*), 0 for any other tensor: ggml-cuda's supports_op and
// compute_forward (patch 0421, src/cuda/kvquant_attn_cuda.cu) take the three by it. The nodes carry the tag of their
// kind as their userdata.
GGML_EXT_API int ggml_ext_kvquant_attn_node_kind(const struct ggml_tensor * node);
GGML_EXT_API void * ggml_ext_kvquant_attn_tag(int kind);

// ---- libllama (src/llama/kvquant_cache.c) ----

// llama_graph's hook (patch 0326; the iSWA build_attn of patch 0327 with each layer's own cache, positions and
// mask): the attention of a pre-RoPE K cache through ggml_ext_kvquant_attn, or NULL
// when it does not take this layer (then the caller ropes the whole cache, ggml_ext_llama_k_rope, and runs
// its own attention). q [hd, n_head, n_tokens], k / v the cache views, k_roped the model's roped K node
// (its RoPE parameters), k_pos the cells' positions. Taken: graphs of at most 16 tokens
// (llama/kvquant_cache.c's KV_ATTN_MAX_TOKENS), no ALiBi, soft-capping, attention sinks or KQ bias, a transposed V refused, the cache
// (and a K norm's weight) in host memory or, in a GGML_EXT_CUDA build, the cache in a device's memory (the op's nodes
// then run on ggml-cuda, src/cuda/kvquant_attn_cuda.cu; not with GGML_EXT_KV_KBLOCK's block-scaled keys). GGML_EXT_KV_ATTN=ref keeps the dequantize-and-rope path, =fused takes any size, =check
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
