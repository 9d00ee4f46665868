// What patch 0300 calls from llama.cpp: ggml_ext_llama_linear for each weight matmul of the graph,
// ggml_ext_llama_kv_type for the K/V types of each KV cache. Compiled into libllama.
//
// ggml-ext's own rules go first (none yet: no format of ours needs a side-car or its own KV type, so
// both answer with what llama.cpp asked for); then a registered callback, which tests use to see
// every call and programs may use to try a rule before it becomes one here.
#include "ggml-ext-llama.h"
#include "ggml.h"

#include <stddef.h>
#include <stdio.h>

static ggml_ext_llama_linear_fn  linear_fn;
static void *                    linear_user;
static ggml_ext_llama_kv_type_fn kv_type_fn;
static void *                    kv_type_user;

void ggml_ext_llama_set_linear_hook(ggml_ext_llama_linear_fn fn, void * user) {
    linear_fn   = fn;
    linear_user = user;
}

void ggml_ext_llama_set_kv_type_hook(ggml_ext_llama_kv_type_fn fn, void * user) {
    kv_type_fn   = fn;
    kv_type_user = user;
}

struct ggml_tensor * ggml_ext_llama_linear(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * cur,
                                           struct ggml_tensor * result) {
    if (linear_fn) {
        struct ggml_tensor * t = linear_fn(linear_user, ctx, w, cur, result);
        if (t) {
            result = t;
        }
    }
    return result;
}

int ggml_ext_llama_kv_type(int type, bool is_v, uint32_t n_layer, const char * name_tag) {
    if (kv_type_fn) {
        const int t = kv_type_fn(kv_type_user, type, is_v, n_layer, name_tag ? name_tag : "");
        if (t >= 0 && (t >= GGML_TYPE_COUNT || ggml_blck_size((enum ggml_type) t) == 0)) {
            // ggml_new_tensor would abort on it: say so and keep what was asked for
            fprintf(stderr, "ggml-ext: the KV type hook returned %d, not a ggml type; keeping %s\n", t,
                    ggml_type_name((enum ggml_type) type));
        } else if (t >= 0) {
            type = t;
        }
    }
    return type;
}
