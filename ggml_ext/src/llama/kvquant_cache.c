// The KVQuant cache types inside llama.cpp's KV cache (patch 0320; docs/KVQUANT.md "In llama.cpp's
// cache"): the calibration file the tables come from (--kv-calib / GGML_EXT_KV_CALIB), and the binding of
// each K / V tensor a llama_kv_cache allocates to its layer's nuqB table (ggml_ext_kvquant_bind, in ggml-base);
// keys are stored before RoPE with per-channel scales (ggml_ext_kvquant_bind_keys) and roped when attention reads
// them (patch 0322: ggml_ext_llama_k_unroped / ggml_ext_llama_k_rope below).
#include "common/settings.h"
#include "ggml-ext-kvquant.h"
#include "ggml-ext-llama.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The decode op's default reach: graphs of at most this many tokens (decode steps and short batches), where it
// beats dequantizing and roping the whole cache.
#define KV_ATTN_MAX_TOKENS 16

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

// --kv-outliers / --kv-sink (patch 0323); < 0: the environment decides
static float outliers_set = -1.0f;
static int   sink_set     = -1;

int ggml_ext_llama_set_kv_outliers(float f) {
    if (!(f >= 0.0f && f < 0.5f)) {
        return -1;
    }
    pthread_mutex_lock(&calib_lock);
    outliers_set = f;
    pthread_mutex_unlock(&calib_lock);
    return 0;
}

int ggml_ext_llama_set_kv_sink(int n) {
    if (n < 0 || n > GGML_EXT_KVQUANT_MAX_SINK) {
        return -1;
    }
    pthread_mutex_lock(&calib_lock);
    sink_set = n;
    pthread_mutex_unlock(&calib_lock);
    return 0;
}

// the outlier fraction asked for (0: none); -1 with err for a bad GGML_EXT_KV_OUTLIERS
static float kv_outliers(char * err, size_t n) {
    if (outliers_set >= 0.0f) {
        return outliers_set;
    }
    float     f = 0.0f;
    const int r = ggml_ext_settings_kv_outliers(&f);
    if (r < 0) {
        snprintf(err, n, "ggml-ext: GGML_EXT_KV_OUTLIERS=%s: an outlier fraction in [0, 0.5) (e.g. 0.01)",
                 ggml_ext_setting_text(GGML_EXT_SETTING_KV_OUTLIERS));
        return -1.0f;
    }
    return f;
}

static int kv_sink(char * err, size_t n) {
    if (sink_set >= 0) {
        return sink_set;
    }
    const int v = ggml_ext_settings_kv_sink(GGML_EXT_KVQUANT_MAX_SINK);
    if (v < 0) {
        snprintf(err, n, "ggml-ext: GGML_EXT_KV_SINK=%s: the number of first positions kept in float, 0..%d",
                 ggml_ext_setting_text(GGML_EXT_SETTING_KV_SINK), GGML_EXT_KVQUANT_MAX_SINK);
    }
    return v;
}

const char * ggml_ext_llama_kv_calib(void) {
    if (calib_set[0]) {
        return calib_set;
    }
    return ggml_ext_settings_kv_calib();
}

static int kvquant_bits(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_KVQUANT ? t->layout : 0;
}

// GGML_EXT_KV_VROT=1: a NUQ value cache takes upstream's Hadamard rotation (attn_rot_v: 64 channels at a time,
// rotated back after attention) and the calibration's tables fitted on rotated values (v_nuqB_r / _ro). Keys
// never rotate (stored before RoPE; patch 0325 keeps attn_rot_k off for them). 0 / unset: off; -1: a bad value.
static int kv_vrot(void) {
    return ggml_ext_settings_kv_vrot();
}

bool ggml_ext_llama_kv_rotate(int type) {
    return kvquant_bits(type) == 0 || kv_vrot() == 1;
}

// GGML_EXT_KV_KROT=1: a NUQ key cache holds K after RoPE, Hadamard-rotated as upstream rotates a quantized K
// (attn_rot_k, q rotated alike), in value-style blocks (per-64 mid / half, one outlier slot) with the
// calibration's k_nuqB_r / _ro tables; attention reads it as F32 without roping (the pre-RoPE hook stays in
// place); patch 0325 lets a context shift take upstream's path for rotated keys (untested). 0 / unset: off (keys
// before RoPE, per-channel scales); -1: a bad value.
static int kv_krot(void) {
    return ggml_ext_settings_kv_krot();
}

// Block-scaled keys: pre-RoPE keys normalised per channel (the calibration's 1% thresholds, or min / max
// without outliers) and then, per token and 64-channel block, by the block's own mid / half (the value blocks'
// trailer: one outlier slot), with the calibration's k_nuqB_h / _ho tables (ggml_ext_kvquant_key_blocks).
// GGML_EXT_KV_KBLOCK unset / empty: 2 (the default: block-scaled for nuq3 / nuq4 where the calibration has those
// tables, per channel alone where it has not and for nuq2); 1: block-scaled (a calibration without the tables is refused); 0: per channel
// alone; -1: a bad value.
static int kv_kblock(void) {
    return ggml_ext_settings_kv_kblock();
}

int ggml_ext_kvquant_key_blocks(const void * data, int on);  // ggml-base (backend/kvquant_base.c)
bool ggml_ext_kvquant_attn_cells(int64_t hd);                   // ggml-base (backend/kvquant_attn_base.c)

// Whether upstream's Hadamard rotation applies to a KVQuant K cache (patch 0325 asks this instead of
// ggml_ext_llama_kv_rotate for the pre-RoPE types): only with GGML_EXT_KV_KROT=1.
bool ggml_ext_llama_kv_rotate_keys(int type);  // declared in patch 0325 (not in ggml-ext-llama.h: a change there rebuilds llama)
bool ggml_ext_llama_kv_rotate_keys(int type) {
    return kvquant_bits(type) != 0 && kv_krot() == 1;
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
    // a calibration of a newer ggml-ext may lay its tables out otherwise: refused, not misread
    if (ggml_ext_check_format_key(g, "kvquant.format_version", path, 1, err, n) != 0) {
        gguf_free(g);
        ggml_free(ctx);
        return -1;
    }
    snprintf(loaded_path, sizeof(loaded_path), "%s", path);
    loaded_gguf = g;
    loaded_ctx  = ctx;
    return 0;
}

// layer il's key ('k') or value ('v') table for `bits`: 2^B F32 levels and dequantization values
// (kvq.il.{k,v}_{nuq,deq}B<tag>; tag "_o": with outliers, the tables fitted without them; values also
// "_b" / "_bo" / "_r" / "_ro": fitted on llama.cpp's 64-value blocks, unrotated / rotated: v_table_tag)
static int nuq_table(const char * path, char role, int il, int bits, const char * tag, const float ** levels,
                     const float ** values, char * err, size_t n) {
    char names[2][64];
    snprintf(names[0], sizeof(names[0]), "kvq.%d.%c_nuq%d%s", il, role, bits, tag);
    snprintf(names[1], sizeof(names[1]), "kvq.%d.%c_deq%d%s", il, role, bits, tag);
    for (int i = 0; i < 2; i++) {
        const struct ggml_tensor * t = ggml_get_tensor(loaded_ctx, names[i]);
        if (!t) {
            snprintf(err, n, "KV calibration %s has no nuq%d %s tables (no tensor %s): calibrate with "
                     "--bits including %d%s", path, bits, role == 'k' ? "key" : "value", names[i], bits,
                     tag[0] == '_' && tag[1] == 'h' ? " and this version of `ggml-ext calibrate kv` (key tables of "
                                                      "block-scaled keys, for GGML_EXT_KV_KBLOCK=1)"
                     : tag[0] == '_' && tag[1] == 'r' ? (role == 'k' ? " and this version of `ggml-ext calibrate kv` "
                                                                     "(rotated key tables, for GGML_EXT_KV_KROT=1: "
                                                                     "models with plain RoPE)"
                                                                   : " and this version of `ggml-ext calibrate kv` "
                                                                     "(rotated value tables, for GGML_EXT_KV_VROT=1)")
                                                    : "");
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

// The value tables a V cache binds (suffix of kvq.il.v_{nuq,deq}B): rotated (GGML_EXT_KV_VROT=1) "_r" / "_ro";
// else the ones fitted on llama.cpp's 64-value blocks, "_b" / "_bo", where the calibration has them, and the
// per-token ones ("" / "_o": the simulation's normalisation) where it does not or GGML_EXT_KV_VTABLE=token.
// NULL with err for a bad setting. Under calib_lock.
static const char * v_table_tag(int il, int bits, bool outliers, char * err, size_t n) {
    const int rot = kv_vrot();
    if (rot < 0) {
        snprintf(err, n, "ggml-ext: GGML_EXT_KV_VROT=%s: 1 (rotate NUQ value caches) or 0", ggml_ext_setting_text(GGML_EXT_SETTING_KV_VROT));
        return NULL;
    }
    if (rot) {
        return outliers ? "_ro" : "_r";
    }
    const int vtable = ggml_ext_settings_kv_vtable();
    if (vtable < 0) {
        snprintf(err, n, "ggml-ext: GGML_EXT_KV_VTABLE=%s: block (tables fitted on 64-value blocks, the default "
                 "where the calibration has them) or token", ggml_ext_setting_text(GGML_EXT_SETTING_KV_VTABLE));
        return NULL;
    }
    char name[64];
    snprintf(name, sizeof(name), "kvq.%d.v_nuq%d%s", il, bits, outliers ? "_bo" : "_b");
    const bool block = vtable == GGML_EXT_KV_VTABLE_BLOCK ||
                       (vtable == GGML_EXT_KV_VTABLE_AUTO && ggml_get_tensor(loaded_ctx, name) != NULL);
    return block ? (outliers ? "_bo" : "_b") : (outliers ? "_o" : "");
}

// Whether the calibrated model's K rows reach llama.cpp permuted (the converter's permute_qk: llama-arch
// models rotate with normal RoPE, pairs (2j, 2j + 1), while the HF k_proj output the calibration saw pairs
// (j, j + hd / 2)); other architectures keep HF's order and rotate NEOX-style.
static bool keys_permuted(void) {
    const int64_t a = gguf_find_key(loaded_gguf, "kvquant.architecture");
    if (a < 0 || gguf_get_kv_type(loaded_gguf, a) != GGUF_TYPE_STRING) {
        return false;
    }
    const char * arch = gguf_get_val_str(loaded_gguf, a);
    // the calibration's architecture is the HF config's model_type (the converter's _llama archs)
    return !strcmp(arch, "llama") || !strcmp(arch, "mistral");
}

// Binds a pre-RoPE key cache tensor to layer il: the nuqB key table and per-channel mid / half from the
// calibration's min / max (kvq.il.k_lo0 / k_hi0, no outliers: everything beyond rounds to the end levels),
// in the cache's channel order. Under calib_lock.
static int bind_keys(struct ggml_tensor * t, const char * path, int il, int bits, uint32_t head_dim, bool outliers,
                     int n_sink, char * err, size_t n) {
    // the calibration saw k_proj's output, and that is what the cache stores: the K that enters RoPE, or the
    // K before the model's K norm (qwen3, gemma3: ggml_ext_llama_k_unroped; the norm is applied after the
    // cache); sliding-window models (gemma2/3) through patch 0327; phi3, whose K is a view of the fused qkv output
    // (`calibrate kv` measured that part of qkv_proj's output). Every architecture of the converter.
    static const char * const archs[] = { "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gemma3_text",
                                          "phi3" };
    const int64_t a    = gguf_find_key(loaded_gguf, "kvquant.architecture");
    const char *  arch = a >= 0 && gguf_get_kv_type(loaded_gguf, a) == GGUF_TYPE_STRING ? gguf_get_val_str(loaded_gguf, a) : "";
    bool          known = false;
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        known = known || strcmp(arch, archs[i]) == 0;
    }
    if (!known) {
        snprintf(err, n, "ggml-ext: -ctk %s: KVQuant keys support llama, mistral, qwen2/3, gemma2/3 and phi3 models; KV "
                 "calibration %s is for '%s' (use -ctk f16 or q8_0; -ctv %s works)", ggml_type_name(t->type), path,
                 arch, ggml_type_name(t->type));
        return -1;
    }
    // a per-token scale per 64-channel block over the per-channel one, its own tables: by default where the
    // calibration has them (GGML_EXT_KV_KBLOCK=0: per channel alone; 1: required)
    int kblock = kv_kblock();
    if (kblock < 0) {
        snprintf(err, n, "ggml-ext: GGML_EXT_KV_KBLOCK=%s: 1 (per-block token scales over the keys' channel scales, "
                 "the default where the calibration has their tables) or 0 (per-channel scales alone)",
                 ggml_ext_setting_text(GGML_EXT_SETTING_KV_KBLOCK));
        return -1;
    }
    // a cache in device memory (CUDA) takes the same keys: the CUDA writer's block-scaled keys are the CPU's bit for
    // bit (tests/c/test_kvquant_cuda.cpp)
    // the default keys 2-bit caches per channel alone: at full context the block scale made nuq2 worse on both
    // models (H100: Gemma-3-270M 32768 +53.1% vs +48.2%, SmolLM2 8192 +55.0% vs +41.7%) while it helps nuq3
    // (+6.78% vs +7.25%, +5.67% vs +6.47%); docs/RESULTS.md "KVQuant"
    if (kblock == 2 && bits < 3) {
        kblock = 0;
    }
    if (kblock == 2) {
        char name[64];
        snprintf(name, sizeof(name), "kvq.%d.k_nuq%d%s", il, bits, outliers ? "_ho" : "_h");
        kblock = ggml_get_tensor(loaded_ctx, name) != NULL;
    }
    const float * levels, * values;
    if (nuq_table(path, 'k', il, bits, kblock ? (outliers ? "_ho" : "_h") : outliers ? "_o" : "", &levels, &values,
                  err, n) != 0) {
        return -1;
    }
    const int64_t D = t->ne[0];
    const float * lohi[2];
    for (int i = 0; i < 2; i++) {
        char name[64];
        // with outliers the thresholds at the calibration's fraction (k_lo / k_hi), else min / max (k_lo0 / k_hi0)
        snprintf(name, sizeof(name), "kvq.%d.k_%s%s", il, i ? "hi" : "lo", outliers ? "" : "0");
        const struct ggml_tensor * r = ggml_get_tensor(loaded_ctx, name);
        if (!r || r->type != GGML_TYPE_F32 || ggml_nelements(r) != D) {
            snprintf(err, n, "KV calibration %s: tensor %s missing or not %lld F32 values", path, name, (long long) D);
            return -1;
        }
        lohi[i] = (const float *) r->data;
    }
    if (!t->data) {
        return 0;
    }
    float * mid = malloc(sizeof(float) * D), * half = malloc(sizeof(float) * D);
    if (!mid || !half) {
        free(mid);
        free(half);
        snprintf(err, n, "ggml-ext: out of memory");
        return -1;
    }
    const bool perm = keys_permuted();
    const int  hd = (int) head_dim, h2 = hd / 2;
    for (int64_t c = 0; c < D; c++) {
        // cache channel c of head h is HF channel j / 2 (even c) or j / 2 + hd / 2 (odd c) when permuted
        const int64_t h = c / hd, j = c % hd;
        const int64_t src = perm ? h * hd + (j % 2 ? j / 2 + h2 : j / 2) : c;
        mid[c]  = (lohi[1][src] + lohi[0][src]) / 2;
        half[c] = fmaxf((lohi[1][src] - lohi[0][src]) / 2, 1e-8f);
    }
    int rc = ggml_ext_kvquant_bind_opts(t->data, ggml_nbytes(t), (int) t->type, D, levels, values, mid, half,
                                        outliers, n_sink, err, n);
    if (rc == 0 && kblock && ggml_ext_kvquant_key_blocks(t->data, 1) != 0) {
        snprintf(err, n, "ggml-ext: the key cache of layer %d is not bound", il);
        rc = -1;
    }
    free(mid);
    free(half);
    return rc;
}

bool ggml_ext_llama_kv_pre_rope(int type) {
    return kvquant_bits(type) != 0;
}

// The K norm some models apply right before RoPE (Qwen3, Gemma-3: rope(rms_norm(k) * w), llama.cpp's
// build_norm): its MUL node, NULL if K enters RoPE without one. The cache then stores K before the norm --
// where `ggml-ext calibrate kv` measured the keys' per-channel ranges (the k_proj output) -- and the norm is
// applied again to the dequantized keys, before RoPE (as the torch simulation does).
static const struct ggml_tensor * k_norm_of(const struct ggml_tensor * k_roped) {
    const struct ggml_tensor * m = k_roped->src[0];
    return m->op == GGML_OP_MUL && m->src[0]->op == GGML_OP_RMS_NORM && m->src[1]->ne[0] == m->ne[0] &&
                   ggml_nelements(m->src[1]) == m->ne[0]
               ? m
               : NULL;
}

struct ggml_tensor * ggml_ext_llama_k_unroped(struct ggml_tensor * k_roped) {
    if (kv_krot() == 1) {
        return k_roped;  // GGML_EXT_KV_KROT: the cache holds K after RoPE
    }
    const int mode = k_roped->op == GGML_OP_ROPE ? ((const int32_t *) k_roped->op_params)[2] : -1;
    if (mode != GGML_ROPE_TYPE_NORMAL && mode != GGML_ROPE_TYPE_NEOX) {
        // the model ropes K otherwise (or not at all): the pre-RoPE cache cannot take it
        GGML_ABORT("ggml-ext: a KVQuant K cache (-ctk nuq*) needs K roped by ggml_rope_ext in normal or NEOX mode "
                   "right before the cache; this model's K is %s (mode %d): use -ctk f16 / q8_0",
                   ggml_op_desc(k_roped), mode);
    }
    const struct ggml_tensor * norm = k_norm_of(k_roped);
    return norm ? norm->src[0]->src[0] : k_roped->src[0];
}

struct ggml_tensor * ggml_ext_llama_k_rope(struct ggml_context * ctx, struct ggml_tensor * k,
                                           const struct ggml_tensor * k_roped, struct ggml_tensor * k_pos) {
    // k: [head_dim, n_head_kv, n_kv, n_stream] of the cache; dequantized (contiguous), roped as one sequence of
    // n_kv * n_stream cells, each at its own position
    struct ggml_tensor * kf = ggml_cast(ctx, k, GGML_TYPE_F32);
    if (kv_krot() == 1) {
        return kf;  // GGML_EXT_KV_KROT: roped (and rotated) before the cache
    }
    kf = ggml_reshape_3d(ctx, kf, k->ne[0], k->ne[1], k->ne[2] * k->ne[3]);
    GGML_ASSERT(k_pos->ne[0] == kf->ne[2]);
    const struct ggml_tensor * norm = k_norm_of(k_roped);
    if (norm) {  // the model's K norm on the dequantized keys (the cache holds them before it)
        float eps;
        memcpy(&eps, norm->src[0]->op_params, sizeof(eps));
        // on the rows as one 2-D tensor: ggml-cuda's rms_norm puts ne[2] in grid.y (at most 65535), and ne[2]
        // here is the cell count (131072 cells aborted the CUDA build); the values are the same row by row
        struct ggml_tensor * k2 = ggml_reshape_2d(ctx, kf, kf->ne[0], kf->ne[1] * kf->ne[2]);
        k2 = ggml_mul(ctx, ggml_rms_norm(ctx, k2, eps), norm->src[1]);
        kf = ggml_reshape_3d(ctx, k2, k->ne[0], k->ne[1], k->ne[2] * k->ne[3]);
    }
    const int32_t * p = (const int32_t *) k_roped->op_params;
    float           f[6];
    memcpy(f, p + 5, sizeof(f));  // freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow
    struct ggml_tensor * r = ggml_rope_ext(ctx, kf, k_pos, k_roped->src[2], p[1], p[2], p[4], f[0], f[1], f[2], f[3],
                                           f[4], f[5]);
    return ggml_reshape_4d(ctx, r, k->ne[0], k->ne[1], k->ne[2], k->ne[3]);
}

// GGML_EXT_KV_ATTN=check: the op's result next to the reference path's (the whole cache dequantized, roped, flash
// attention at F32 accumulation over F16 q / K / V, as build_attn_mha runs it); the op's result goes on, and each
// layer prints "ggml_ext: kv-attn check: n_tokens N max |op - ref| D, max |ref| R" on stderr.
static void check_fn(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) nth, (void) userdata;
    if (ith != 0) {
        return;
    }
    const float * a = (const float *) dst->src[0]->data, * b = (const float *) dst->src[1]->data;
    double        worst = 0.0, big = 0.0;
    for (int64_t i = 0; i < ggml_nelements(dst); i++) {
        const double d = (double) a[i] - (double) b[i];
        worst          = isnan(d) ? (double) INFINITY : fmax(worst, fabs(d));
        big            = fmax(big, fabs((double) b[i]));
    }
    fprintf(stderr, "ggml_ext: kv-attn check: n_tokens %lld max |op - ref| %.4g, max |ref| %.4g\n",
            (long long) dst->ne[2], worst, big);
    memcpy(dst->data, a, ggml_nbytes(dst));
}

static struct ggml_tensor * check_against_reference(struct ggml_context * ctx, struct ggml_tensor * out,
                                                    struct ggml_tensor * q, struct ggml_tensor * k,
                                                    struct ggml_tensor * v, struct ggml_tensor * kq_mask,
                                                    float kq_scale, const struct ggml_tensor * k_roped,
                                                    struct ggml_tensor * k_pos) {
    const int64_t        ns = k->ne[3];
    struct ggml_tensor * kr = ggml_cast(ctx, ggml_ext_llama_k_rope(ctx, k, k_roped, k_pos), GGML_TYPE_F16);
    struct ggml_tensor * qv = ggml_view_4d(ctx, q, q->ne[0], q->ne[1], q->ne[2] / ns, ns, q->nb[1], q->nb[2],
                                           q->nb[2] * (q->ne[2] / ns), 0);
    struct ggml_tensor * vv = v->type == GGML_TYPE_F32 ? ggml_cast(ctx, v, GGML_TYPE_F16) : v;
    struct ggml_tensor * ref =
        ggml_flash_attn_ext(ctx, ggml_permute(ctx, qv, 0, 2, 1, 3), ggml_permute(ctx, kr, 0, 2, 1, 3),
                            ggml_permute(ctx, vv, 0, 2, 1, 3), kq_mask, kq_scale, 0.0f, 0.0f);
    ggml_prec_set_acc(ref, GGML_PREC_F32);
    ref                          = ggml_reshape_3d(ctx, ref, out->ne[0], out->ne[1], out->ne[2]);
    struct ggml_tensor * args[2] = { out, ref };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, out->ne[0], out->ne[1], out->ne[2], 1, args, 2, check_fn, 1, NULL);
}

// The op's constructor lives in ggml-cpu, whose graph nodes carry its kernels. libllama finds it through the
// backend registry (ggml-ext.h, ggml_ext_cpu_proc_address), not the linker: with GGML_BACKEND_DL the CPU backend
// is a module, one per CPU variant, loaded at run time (make dist).
typedef struct ggml_tensor * (*kvquant_attn_fn)(struct ggml_context *, struct ggml_tensor *, struct ggml_tensor *,
                                                struct ggml_tensor *, struct ggml_tensor *, struct ggml_tensor *,
                                                struct ggml_tensor *, const struct ggml_ext_kvquant_rope *,
                                                struct ggml_tensor *, float, float, int, char *, size_t);
static kvquant_attn_fn kvquant_attn_found;
static void            find_kvquant_attn(void) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
    void *             p   = reg ? ggml_backend_reg_get_proc_address(reg, "ggml_ext_kvquant_attn") : NULL;
    memcpy(&kvquant_attn_found, &p, sizeof(p));  // ISO C has no cast from void * to a function pointer
}
static kvquant_attn_fn cpu_kvquant_attn(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, find_kvquant_attn);
    return kvquant_attn_found;
}

// The decode op (patch 0326; ggml-ext-kvquant.h): attention straight from the pre-RoPE cache for graphs of few
// tokens. GGML_EXT_KV_ATTN: "ref" never (the dequantize-and-rope path, on the CPU and on a GPU alike), "fused" for
// any number of tokens (the tests: prefill batches through the same kernel), "check" as fused plus the reference
// beside it (above), unset / "auto" up to KV_ATTN_MAX_TOKENS.
struct ggml_tensor * ggml_ext_llama_kv_attn(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                            struct ggml_tensor * v, struct ggml_tensor * kq_mask,
                                            struct ggml_tensor * sinks, float kq_scale, float max_bias, float softcap,
                                            const struct ggml_tensor * k_roped, struct ggml_tensor * k_pos) {
    const int  mode  = ggml_ext_settings_kv_attn();
    const bool check = mode == GGML_EXT_KV_ATTN_CHECK;
    const bool force = check || mode == GGML_EXT_KV_ATTN_FUSED;
    if (mode == GGML_EXT_KV_ATTN_REF || kv_krot() == 1) {
        return NULL;  // GGML_EXT_KV_KROT: keys stored after RoPE (and rotated): the reference path reads them
    }
    if (sinks || max_bias != 0.0f || softcap != 0.0f || !k_roped || k_roped->op != GGML_OP_ROPE || q->ne[3] != 1 ||
        (!force && q->ne[2] > KV_ATTN_MAX_TOKENS)) {
        return NULL;
    }
    // where the cache lives: host memory (the op's CPU functions read it), or a CUDA device's (a GGML_EXT_CUDA build:
    // ggml-cuda runs the op's nodes, src/cuda/kvquant_attn_cuda.cu, whose row reader decodes block-scaled keys too)
    const struct ggml_tensor * kb = k->view_src ? k->view_src : k, * vb = v->view_src ? v->view_src : v;
    if (!kb->buffer || !vb->buffer) {
        return NULL;
    }
    const bool on_host   = ggml_backend_buffer_is_host(kb->buffer) && ggml_backend_buffer_is_host(vb->buffer);
    // On CUDA the op runs too: its kernels decode at 0.96-1.51x the dequantize-and-rope path's speed on the H100
    // (docs/KVQUANT.md "The CUDA path") and need no f16 copy of the layer's cache
    const bool on_device = !on_host && ggml_ext_has_cuda() &&
                           !strncmp(ggml_backend_buffer_name(kb->buffer), "CUDA", 4) &&
                           !strncmp(ggml_backend_buffer_name(vb->buffer), "CUDA", 4);
    if (!on_host && !on_device) {
        return NULL;
    }
    // a K norm between the cache and RoPE (qwen3, gemma3): the op applies it as ggml_ext_llama_k_rope does
    const struct ggml_tensor * norm   = k_norm_of(k_roped);
    struct ggml_tensor *       norm_w = norm ? norm->src[1] : NULL;
    float                      eps    = 0.0f;
    if (norm) {
        const struct ggml_tensor * wb = norm_w->view_src ? norm_w->view_src : norm_w;
        if (on_host && (!wb->buffer || !ggml_backend_buffer_is_host(wb->buffer))) {
            return NULL;
        }
        memcpy(&eps, norm->src[0]->op_params, sizeof(eps));
    }
    const int32_t *         p = (const int32_t *) k_roped->op_params;
    struct ggml_ext_kvquant_rope r;
    r.n_dims     = p[1];
    r.mode       = p[2];
    r.n_ctx_orig = p[4];
    memcpy(&r.freq_base, p + 5, sizeof(float));
    memcpy(&r.freq_scale, p + 6, sizeof(float));
    memcpy(&r.ext_factor, p + 7, sizeof(float));
    memcpy(&r.attn_factor, p + 8, sizeof(float));
    memcpy(&r.beta_fast, p + 9, sizeof(float));
    memcpy(&r.beta_slow, p + 10, sizeof(float));
    // cell ranges: the CPU op's default (~32 ranges, for threads); on a GPU ~512 ranges of 32-256 cells per KV head
    // for the block kernel (blocks for every SM), and where the lane kernel takes the op (kvquant_attn_cuda.cu's k_lanes,
    // where ggml_ext_kvquant_attn_cells allows it: 4 warps a block, 32 cells a warp at a time) ranges of 128-4096
    // cells, ~512 over all KV heads and streams: 4+ blocks an SM at every depth, the fewest ranges for the combine
    int chunk = 0;
    if (on_device) {
        const int64_t n_kv  = k->ne[2];
        const bool    split = ggml_ext_kvquant_is_cache_type((int) k->type) && ggml_ext_kvquant_is_cache_type((int) v->type) &&
                           k->ne[0] == v->ne[0] && ggml_ext_kvquant_attn_cells(k->ne[0]);
        if (split) {
            const int64_t cells = n_kv * k->ne[1] * k->ne[3];
            chunk = (int) ((cells / 512 + 127) / 128 * 128);
            chunk = chunk < 128 ? 128 : chunk > 4096 ? 4096 : chunk;
        } else {
            chunk = (int) ((n_kv / 512 + 31) / 32 * 32);
            chunk = chunk < 32 ? 32 : chunk > 256 ? 256 : chunk;
        }
    }
    char                 why[160] = "the CPU backend does not provide ggml_ext_kvquant_attn";
    const kvquant_attn_fn attn    = cpu_kvquant_attn();
    struct ggml_tensor *  out     = attn ? attn(ctx, q, k, v, kq_mask, k_pos, k_roped->src[2], &r, norm_w, eps, kq_scale,
                                                chunk, why, sizeof(why)) : NULL;
    if (!out) {
        static int said;
        if (force && !said) {
            said = 1;
            fprintf(stderr, "ggml_ext: GGML_EXT_KV_ATTN=fused: not taken (%s); the dequantize-and-rope path runs\n", why);
        }
        return NULL;
    }
    if (check) {
        out = check_against_reference(ctx, out, q, k, v, kq_mask, kq_scale, k_roped, k_pos);
    }
    return ggml_reshape_2d(ctx, out, out->ne[0] * out->ne[1], out->ne[2]);
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
    // A binding lives in this process (by the cache's address); an RPC server computes with its own process's
    // tables, where the cache is bound to nothing: it would quantize and read with uniform levels, a silent loss
    // (SmolLM2, nuq4 over two RPC devices: +5.8 % perplexity)
    const char * where = t->buffer ? ggml_backend_buffer_name(t->buffer) : "";
    if (!strncmp(where, "RPC", 3)) {
        snprintf(err, n, "ggml-ext: the %s cache of layer %d would be on an RPC device (%s), whose server has no KV "
                 "calibration: keep NUQ caches in this process (--no-kv-offload, or no --rpc), or use -ctk/-ctv "
                 "f16 / q8_0 / q4_0", ggml_type_name(t->type), il, where);
        return -1;
    }
    // split mode "tensor" cuts the cache over several devices' buffers, and a binding holds one address
    if (!strncmp(where, "Meta", 4)) {
        snprintf(err, n, "ggml-ext: the %s cache of layer %d would be cut across devices (split mode \"tensor\"), "
                 "which NUQ caches do not support: use --split-mode layer, or -ctk/-ctv f16 / q8_0 / q4_0",
                 ggml_type_name(t->type), il);
        return -1;
    }
    pthread_mutex_lock(&calib_lock);
    int          rc   = -1;
    const char * path = ggml_ext_llama_kv_calib();
    if (!path) {
        snprintf(err, n, "ggml-ext: the %s %c cache needs a KV calibration, and none was given: make one with "
                 "`ggml-ext calibrate kv HF_DIR -o FILE` and pass --kv-calib FILE (or set GGML_EXT_KV_CALIB)",
                 ggml_type_name(t->type), role == 'k' ? 'K' : 'V');
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
                 "and %lld %c channels (layer %d): calibrated for another model", path, n_layers, n_kv_heads,
                 head_dim, n_layer, (long long) t->ne[0], role == 'k' ? 'K' : 'V', il);
        goto done;
    }
    const float frac   = kv_outliers(err, n);
    const int   n_sink = frac < 0.0f ? -1 : kv_sink(err, n);
    if (frac < 0.0f || n_sink < 0) {
        goto done;
    }
    if (frac > 0.0f) {
        // the thresholds and outlier tables are the calibration's, fitted at its own fraction
        const int64_t id = gguf_find_key(loaded_gguf, "kvquant.outlier_fraction");
        const int     kt = id >= 0 ? (int) gguf_get_kv_type(loaded_gguf, id) : -1;
        const float   cf = kt == GGUF_TYPE_FLOAT64   ? (float) gguf_get_val_f64(loaded_gguf, id)
                           : kt == GGUF_TYPE_FLOAT32 ? gguf_get_val_f32(loaded_gguf, id)
                                                     : -1.0f;
        if (!(cf > 0.0f) || fabsf(cf - frac) > 1e-6f * fmaxf(1.0f, cf)) {
            snprintf(err, n, "ggml-ext: --kv-outliers %g: KV calibration %s was fitted at outlier fraction %g; use "
                     "--kv-outliers %g or calibrate with `ggml-ext calibrate kv ... --outliers %g`", (double) frac, path,
                     (double) cf, (double) cf, (double) frac);
            goto done;
        }
    }
    const int krot = kv_krot();
    if (krot < 0) {
        snprintf(err, n, "ggml-ext: GGML_EXT_KV_KROT=%s: 1 (NUQ keys after RoPE, rotated) or 0", ggml_ext_setting_text(GGML_EXT_SETTING_KV_KROT));
        goto done;
    }
    if (role == 'k' && !krot) {
        rc = bind_keys(t, path, il, bits, head_dim, frac > 0.0f, n_sink, err, n);
        goto done;
    }
    const float * levels, * values;
    const char *  tag = role == 'k' ? (frac > 0.0f ? "_ro" : "_r") : v_table_tag(il, bits, frac > 0.0f, err, n);
    if (!tag || nuq_table(path, role, il, bits, tag, &levels, &values, err, n) != 0) {
        goto done;
    }
    rc = t->data ? ggml_ext_kvquant_bind_opts(t->data, ggml_nbytes(t), (int) t->type, t->ne[0], levels, values, NULL,
                                              NULL, frac > 0.0f, n_sink, err, n)
                 : 0;
done:
    pthread_mutex_unlock(&calib_lock);
    return rc;
}

void ggml_ext_llama_kv_unbind(struct ggml_tensor * t) {
    if (kvquant_bits((int) t->type) && t->data && !t->view_src) {
        ggml_ext_kvquant_unbind(t->data);
    }
}
