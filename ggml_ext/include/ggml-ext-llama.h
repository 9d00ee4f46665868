// ggml-ext's hooks in llama.cpp's graph and KV cache (patch 0300), compiled into libllama:
// ggml_ext/src/glue. Both default to changing nothing; ggml-ext's formats add their rules in the glue,
// and a program (or a test) may register a callback that sees every call.
#pragma once

#include "ggml-ext.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_context;
struct ggml_tensor;

// ---- linear layers: every weight matmul llama.cpp's graph builds (llm_graph_context::build_lora_mm) ----

// Called with the weight w (its name, e.g. "blk.0.attn_q.weight", and type say what it is), the input
// cur and result = ggml_mul_mat(ctx, w, cur) as llama.cpp built it (precision already set), before
// any per-channel scale and LoRA. Returns the tensor llama.cpp uses instead of result: result itself
// (the default), result plus a side-car (e.g. ggml_ext_col_sidecar), or another op of the same shape.
GGML_EXT_API struct ggml_tensor * ggml_ext_llama_linear(struct ggml_context * ctx, struct ggml_tensor * w,
                                                        struct ggml_tensor * cur, struct ggml_tensor * result);

// A callback run by ggml_ext_llama_linear after ggml-ext's own rules; it gets their result and returns
// what llama.cpp uses (NULL: keep it). It runs while llama.cpp builds a graph (context creation,
// graph reserve, each decode that cannot reuse the last graph), on the thread that builds it.
typedef struct ggml_tensor * (*ggml_ext_llama_linear_fn)(void * user, struct ggml_context * ctx, struct ggml_tensor * w,
                                                         struct ggml_tensor * cur, struct ggml_tensor * result);

// Installs fn (NULL removes it). Not synchronised with graph building: set it while no llama context
// builds a graph (before creating one, or between decodes).
GGML_EXT_API void ggml_ext_llama_set_linear_hook(ggml_ext_llama_linear_fn fn, void * user);

// ---- KV cache types: each llama_kv_cache picks the types of its K and V tensors here ----

// type: the requested K (is_v = false) or V (is_v = true) type (enum ggml_type, e.g. from
// llama_context_params.type_k / --cache-type-k); n_layer: the model's layers; name_tag: the cache's
// tag ("" for the main cache). Returns the type the cache allocates: type itself by default.
// It is asked after llama_context's checks of the requested types (flash attention and block size).
GGML_EXT_API int ggml_ext_llama_kv_type(int type, bool is_v, uint32_t n_layer, const char * name_tag);

// A callback run by ggml_ext_llama_kv_type after ggml-ext's own rules, with their answer as type;
// returns the type to use (a negative value: keep it).
typedef int (*ggml_ext_llama_kv_type_fn)(void * user, int type, bool is_v, uint32_t n_layer, const char * name_tag);

// Installs fn (NULL removes it); set it before creating the llama context.
GGML_EXT_API void ggml_ext_llama_set_kv_type_hook(ggml_ext_llama_kv_type_fn fn, void * user);

#ifdef __cplusplus
}
#endif
