// The KVQuant cache types inside llama.cpp's KV cache (patch 0305; docs/KVQUANT.md "In llama.cpp's
// cache"): the calibration file the tables come from (--kv-calib / GGML_EXT_KV_CALIB), and the binding of
// each K / V tensor a llama_kv_cache allocates to its layer's nuqB table (ggml_ext_kvq_bind, in ggml-base).
// Values only: a KVQuant K cache is refused until the pre-RoPE key path exists.
#include "ggml-ext-llama.h"
#include "ggml.h"
#include "gguf.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t calib_lock = PTHREAD_MUTEX_INITIALIZER;
static char            calib_set[4096];  // ggml_ext_llama_set_kv_calib; "" : the environment decides

// the file loaded last (kept: every layer of every cache reads it)
static char                  loaded_path[4096];
static struct gguf_context * loaded_gguf;
static struct ggml_context * loaded_ctx;

int ggml_ext_llama_set_kv_calib(const char * path) {
    pthread_mutex_lock(&calib_lock);
    snprintf(calib_set, sizeof(calib_set), "%s", path ? path : "");
    pthread_mutex_unlock(&calib_lock);
    return 0;
}

const char * ggml_ext_llama_kv_calib(void) {
    if (calib_set[0]) {
        return calib_set;
    }
    const char * env = getenv("GGML_EXT_KV_CALIB");
    return env && env[0] ? env : NULL;
}

static int kvquant_bits(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_KVQUANT ? t->layout : 0;
}

bool ggml_ext_llama_kv_rotate(int type) {
    return kvquant_bits(type) == 0;
}

// "cache_<tag>k_l<il>" / "cache_<tag>v_l<il>": K or V ('k' / 'v') and the layer; 0 when the name is not one
static char tensor_role(const char * name, int * il) {
    const char * u = strrchr(name, '_');
    if (!u || u - name < 2 || u[1] != 'l' || sscanf(u + 2, "%d", il) != 1) {
        return 0;
    }
    return u[-1] == 'k' || u[-1] == 'v' ? u[-1] : 0;
}

static int u32_key(const struct gguf_context * g, const char * key, uint32_t * out) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_UINT32) {
        return -1;
    }
    *out = gguf_get_val_u32(g, id);
    return 0;
}

// Loads path unless it is the file loaded last; checks it is a KVQuant calibration. Under calib_lock.
static int load_calibration(const char * path, char * err, size_t n) {
    if (loaded_gguf && !strcmp(path, loaded_path)) {
        return 0;
    }
    if (loaded_gguf) {
        gguf_free(loaded_gguf);
        ggml_free(loaded_ctx);
        loaded_gguf = NULL;
        loaded_ctx  = NULL;
    }
    struct ggml_context *  ctx = NULL;
    struct gguf_init_params p  = { /*.no_alloc =*/ false, /*.ctx =*/ &ctx };
    struct gguf_context *  g   = gguf_init_from_file(path, p);
    if (!g) {
        snprintf(err, n, "KV calibration %s: cannot be read as a GGUF file (make one with `ggml-ext calibrate kv "
                 "HF_DIR -o FILE`)", path);
        return -1;
    }
    const int64_t t = gguf_find_key(g, "general.type");
    if (t < 0 || gguf_get_kv_type(g, t) != GGUF_TYPE_STRING || strcmp(gguf_get_val_str(g, t), "kvquant") != 0) {
        snprintf(err, n, "KV calibration %s: not a KVQuant calibration (general.type %s); it carries no KV "
                 "calibration: make one with `ggml-ext calibrate kv HF_DIR -o FILE`", path,
                 t >= 0 && gguf_get_kv_type(g, t) == GGUF_TYPE_STRING ? gguf_get_val_str(g, t) : "missing");
        gguf_free(g);
        ggml_free(ctx);
        return -1;
    }
    snprintf(loaded_path, sizeof(loaded_path), "%s", path);
    loaded_gguf = g;
    loaded_ctx  = ctx;
    return 0;
}

// layer il's value table for `bits`: 2^B F32 levels and dequantization values
static int value_table(const char * path, int il, int bits, const float ** levels, const float ** values, char * err,
                       size_t n) {
    char names[2][64];
    snprintf(names[0], sizeof(names[0]), "kvq.%d.v_nuq%d", il, bits);
    snprintf(names[1], sizeof(names[1]), "kvq.%d.v_deq%d", il, bits);
    for (int i = 0; i < 2; i++) {
        const struct ggml_tensor * t = ggml_get_tensor(loaded_ctx, names[i]);
        if (!t) {
            snprintf(err, n, "KV calibration %s has no nuq%d value tables (no tensor %s): calibrate with "
                     "--bits including %d", path, bits, names[i], bits);
            return -1;
        }
        if (t->type != GGML_TYPE_F32 || ggml_nelements(t) != (1 << bits)) {
            snprintf(err, n, "KV calibration %s: tensor %s is not %d F32 values", path, names[i], 1 << bits);
            return -1;
        }
        *(i ? values : levels) = (const float *) t->data;
    }
    return 0;
}

int ggml_ext_llama_kv_bind(struct ggml_tensor * t, uint32_t n_layer, char * err, size_t n) {
    const int bits = kvquant_bits((int) t->type);
    if (!bits || t->view_src) {  // views (one per stream) lie inside their tensor's binding
        return 0;
    }
    int        il   = -1;
    const char role = tensor_role(t->name, &il);
    if (!role) {
        snprintf(err, n, "ggml-ext: KV cache tensor %s: cannot tell its layer", t->name);
        return -1;
    }
    if (role == 'k') {
        snprintf(err, n, "ggml-ext: -ctk %s: KVQuant keys are not implemented yet (they need pre-RoPE storage, "
                 "docs/KVQUANT.md); use it for values (-ctv %s) with an f16 or q8_0 K cache", ggml_type_name(t->type),
                 ggml_type_name(t->type));
        return -1;
    }
    pthread_mutex_lock(&calib_lock);
    int          rc   = -1;
    const char * path = ggml_ext_llama_kv_calib();
    if (!path) {
        snprintf(err, n, "ggml-ext: the %s V cache needs a KV calibration, and none was given: make one with "
                 "`ggml-ext calibrate kv HF_DIR -o FILE` and pass --kv-calib FILE (or set GGML_EXT_KV_CALIB)",
                 ggml_type_name(t->type));
        goto done;
    }
    if (load_calibration(path, err, n) != 0) {
        goto done;
    }
    uint32_t n_layers = 0, n_kv_heads = 0, head_dim = 0;
    if (u32_key(loaded_gguf, "kvquant.n_layers", &n_layers) || u32_key(loaded_gguf, "kvquant.n_kv_heads", &n_kv_heads) ||
        u32_key(loaded_gguf, "kvquant.head_dim", &head_dim)) {
        snprintf(err, n, "KV calibration %s: kvquant.n_layers / n_kv_heads / head_dim missing", path);
        goto done;
    }
    if (n_layers != n_layer || (int64_t) n_kv_heads * head_dim != t->ne[0] || il < 0 || (uint32_t) il >= n_layer) {
        snprintf(err, n, "KV calibration %s is for %u layers x %u KV heads x head dim %u, the model has %u layers "
                 "and %lld V channels (layer %d): calibrated for another model", path, n_layers, n_kv_heads,
                 head_dim, n_layer, (long long) t->ne[0], il);
        goto done;
    }
    const float * levels, * values;
    if (value_table(path, il, bits, &levels, &values, err, n) != 0) {
        goto done;
    }
    rc = t->data ? ggml_ext_kvq_bind(t->data, ggml_nbytes(t), (int) t->type, levels, values, err, n) : 0;
done:
    pthread_mutex_unlock(&calib_lock);
    return rc;
}

void ggml_ext_llama_kv_unbind(struct ggml_tensor * t) {
    if (kvquant_bits((int) t->type) && t->data && !t->view_src) {
        ggml_ext_kvq_unbind(t->data);
    }
}
