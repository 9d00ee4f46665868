// What patch 0300 calls from llama.cpp: ggml_ext_llama_linear for each weight matmul of the graph,
// ggml_ext_llama_kv_type for the K/V types of each KV cache; patch 0301: the names of ggml-ext's file
// types; patch 0302: which types -sm tensor must not cut, and its row cuts of interleaved types. Compiled into libllama.
//
// ggml-ext's own rules go first (any-precision weights: an APQ weight's mul_mat becomes
// ggml_ext_apq_mul_mat with the tables the loader attached, patch 0303, at the precision asked for); then
// a registered callback, which tests use to see every call and programs may use to try a rule before it
// becomes one here.
#include "common/settings.h"
#include "ggml-ext-llama.h"
#include "ggml-ext-qdec.h"
#include "ggml-ext-ops.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// ---- any-precision weights ----
//
// The loader (patch 0303) creates an APQ weight's tables beside it and attaches them here; the linear
// hook looks them up by the weight's address. Entries are never removed: a freed model's entries stay
// until a later weight at the same address attaches its own, and only APQ weights are looked up, each
// attached when its model loaded, so a stale entry is never read.
struct apq_entry {
    const struct ggml_tensor * w;
    struct ggml_tensor *       tables;
    int                        seed, parent;  // the precisions it serves (kept: w may be freed since)
};

static pthread_mutex_t    apq_lock = PTHREAD_MUTEX_INITIALIZER;
static struct apq_entry * apq_entries;
static size_t             apq_count, apq_cap;
static int                apq_bits_set;  // ggml_ext_llama_set_apq_bits; 0: the environment decides
static _Thread_local int  apq_bits_local;  // ggml_ext_llama_set_apq_bits_local (llama-server: per request)

static struct ggml_tensor * apq_tables_of(const struct ggml_tensor * w) {
    struct ggml_tensor * t = NULL;
    pthread_mutex_lock(&apq_lock);
    for (size_t i = apq_count; i-- > 0;) {
        if (apq_entries[i].w == w) {
            t = apq_entries[i].tables;
            break;
        }
    }
    pthread_mutex_unlock(&apq_lock);
    return t;
}

static int apq_remember(const struct ggml_tensor * w, struct ggml_tensor * tables, int seed, int parent) {
    int ok = 1;
    pthread_mutex_lock(&apq_lock);
    size_t i = 0;
    while (i < apq_count && apq_entries[i].w != w) {
        i++;
    }
    if (i == apq_count) {
        if (apq_count == apq_cap) {
            const size_t       cap = apq_cap ? 2 * apq_cap : 256;
            struct apq_entry * e   = (struct apq_entry *) realloc(apq_entries, cap * sizeof(*e));
            if (e == NULL) {
                ok = 0;
            } else {
                apq_entries = e;
                apq_cap     = cap;
            }
        }
        if (ok) {
            apq_count++;
        }
    }
    if (ok) {
        apq_entries[i].w      = w;
        apq_entries[i].tables = tables;
        apq_entries[i].seed   = seed;
        apq_entries[i].parent = parent;
    }
    pthread_mutex_unlock(&apq_lock);
    return ok;
}

// ---- OOC column side-cars (docs/GPTQ.md, OOC) ----
//
// The loader creates "<w>.ooc_idx" (I32 [k]) and "<w>.ooc_s" (F32 [k, rows of w]) when the file has
// them and attaches them here; the linear hook adds ggml_ext_col_sidecar(W.x, x, idx, s). Kept like the
// APQ tables: by the weight's address, never removed (a later weight at the same address replaces them).
struct ooc_entry {
    const struct ggml_tensor * w;
    struct ggml_tensor *       idx;
    struct ggml_tensor *       s;
};

static pthread_mutex_t    ooc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ooc_entry * ooc_entries;
static size_t             ooc_count, ooc_cap;

// The entry of w (created when create is set; NULL if out of memory or absent). Call under ooc_lock.
static struct ooc_entry * ooc_entry_of(const struct ggml_tensor * w, int create) {
    for (size_t i = ooc_count; i-- > 0;) {
        if (ooc_entries[i].w == w) {
            return &ooc_entries[i];
        }
    }
    if (!create) {
        return NULL;
    }
    if (ooc_count == ooc_cap) {
        const size_t       cap = ooc_cap ? 2 * ooc_cap : 256;
        struct ooc_entry * e   = (struct ooc_entry *) realloc(ooc_entries, cap * sizeof(*e));
        if (e == NULL) {
            return NULL;
        }
        ooc_entries = e;
        ooc_cap     = cap;
    }
    struct ooc_entry * e = &ooc_entries[ooc_count++];
    e->w                 = w;
    e->idx               = NULL;
    e->s                 = NULL;
    return e;
}

static int has_suffix(const char * name, const char * suffix) {
    const size_t n = strlen(name), m = strlen(suffix);
    return n >= m && strcmp(name + n - m, suffix) == 0;
}

// Remembers an OOC side-car tensor of w after checking its type and shape; NULL or why not.
static const char * ooc_attach(struct ggml_tensor * w, struct ggml_tensor * t, int is_values) {
    static _Thread_local char err[256];
    if (!is_values && (t->type != GGML_TYPE_I32 || t->ne[0] < 1 || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)) {
        snprintf(err, sizeof(err), "its OOC side-car index '%s' is not I32 [k] (a damaged or foreign file)", t->name);
        return err;
    }
    if (!is_values && t->ne[0] > w->ne[0]) {
        snprintf(err, sizeof(err), "its OOC side-car index '%s' lists %lld columns, the weight has %lld", t->name,
                 (long long) t->ne[0], (long long) w->ne[0]);
        return err;
    }
    pthread_mutex_lock(&ooc_lock);
    struct ooc_entry * e = ooc_entry_of(w, !is_values);
    const char *       r = NULL;
    if (!is_values) {
        if (e == NULL) {
            r = "out of memory";
        } else {
            e->idx = t;
            e->s   = NULL;
        }
    } else if (e == NULL || e->idx == NULL) {
        snprintf(err, sizeof(err), "the file has its OOC side-car values '%s' but not the index '%s.ooc_idx'", t->name,
                 w->name);
        r = err;
    } else if (t->type != GGML_TYPE_F32 || t->ne[0] != e->idx->ne[0] || t->ne[1] != w->ne[1] || t->ne[2] != 1 ||
               t->ne[3] != 1) {
        snprintf(err, sizeof(err),
                 "its OOC side-car values '%s' are %s [%lld, %lld], the weight needs F32 [%lld, %lld] (k columns of "
                 "its index, its %lld rows)",
                 t->name, ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1],
                 (long long) e->idx->ne[0], (long long) w->ne[1], (long long) w->ne[1]);
        r = err;
    } else {
        e->s = t;
    }
    pthread_mutex_unlock(&ooc_lock);
    return r;
}

const char * ggml_ext_llama_companion_name(const struct ggml_tensor * w, int i, bool * required) {
    static _Thread_local char name[GGML_MAX_NAME + 16];
    if (w == NULL || i < 0) {
        return NULL;
    }
    if (ggml_ext_anyprec_parent_bits((int) w->type) > 0) {
        if (i > 0) {
            return NULL;
        }
        *required = true;
        snprintf(name, sizeof(name), "%s.apq_tables", w->name);
        return name;
    }
    if (i > 1 || w->ne[1] < 1 || w->ne[2] != 1 || w->ne[3] != 1 || !has_suffix(w->name, ".weight")) {
        return NULL;  // OOC side-cars belong to matrices only
    }
    *required = false;
    snprintf(name, sizeof(name), "%s%s", w->name, i == 0 ? ".ooc_idx" : ".ooc_s");
    return name;
}

int ggml_ext_llama_set_apq_bits(int bits) {
    if (bits < 0 || bits > 8) {
        return -1;
    }
    apq_bits_set = bits;
    return 0;
}

int ggml_ext_llama_set_apq_bits_local(int bits) {
    if (bits < 0 || bits > 8) {
        return -1;
    }
    apq_bits_local = bits;
    return 0;
}

int ggml_ext_llama_apq_check(int bits, char * err, size_t n) {
    int seed = 0, parent = 9, count = 0;
    pthread_mutex_lock(&apq_lock);
    for (size_t i = 0; i < apq_count; i++) {
        seed   = apq_entries[i].seed > seed ? apq_entries[i].seed : seed;
        parent = apq_entries[i].parent < parent ? apq_entries[i].parent : parent;
        count++;
    }
    pthread_mutex_unlock(&apq_lock);
    if (count == 0) {
        snprintf(err, n, "apq_bits=%d asked for, but the loaded model has no any-precision (APQ) weights", bits);
        return -1;
    }
    if (bits < seed || bits > parent) {
        snprintf(err, n, "apq_bits=%d asked for, but the loaded any-precision weights serve %d to %d bits", bits, seed,
                 parent);
        return -1;
    }
    return 0;
}

int ggml_ext_llama_apq_bits(void) {
    if (apq_bits_local > 0) {
        return apq_bits_local;
    }
    if (apq_bits_set > 0) {
        return apq_bits_set;
    }
    return ggml_ext_settings_apq_bits();
}

// llama-server's slot files (patch 0311): the precision each saved slot's KV was computed at, by path. Kept
// for the process only: a file saved by another process restores as unknown (-1), which no request's
// precision equals, so its KV is recomputed rather than reused at another precision.
static struct {
    char * path;
    int    bits;
} *             apq_slots;
static size_t   apq_slot_count, apq_slot_cap;

int ggml_ext_llama_apq_slot_saved(const char * path, int bits) {
    if (path == NULL) {
        return -1;
    }
    int rc = 0;
    pthread_mutex_lock(&apq_lock);
    size_t i = 0;
    while (i < apq_slot_count && strcmp(apq_slots[i].path, path) != 0) {
        i++;
    }
    if (i == apq_slot_count) {
        const size_t len  = strlen(path) + 1;
        char *       copy = (char *) malloc(len);
        if (copy != NULL) {
            memcpy(copy, path, len);
        }
        if (apq_slot_count == apq_slot_cap) {
            const size_t cap  = apq_slot_cap ? 2 * apq_slot_cap : 8;
            void *       grow = copy ? realloc(apq_slots, cap * sizeof(*apq_slots)) : NULL;
            if (grow != NULL) {
                apq_slots    = grow;
                apq_slot_cap = cap;
            }
        }
        if (copy == NULL || apq_slot_count == apq_slot_cap) {
            free(copy);
            rc = -1;  // out of memory: the file restores as unknown
        } else {
            apq_slots[apq_slot_count++].path = copy;
        }
    }
    if (rc == 0) {
        apq_slots[i].bits = bits;
    }
    pthread_mutex_unlock(&apq_lock);
    return rc;
}

int ggml_ext_llama_apq_slot_restored(const char * path) {
    int bits = -1;
    pthread_mutex_lock(&apq_lock);
    for (size_t i = 0; path && i < apq_slot_count; i++) {
        if (strcmp(apq_slots[i].path, path) == 0) {
            bits = apq_slots[i].bits;
            break;
        }
    }
    pthread_mutex_unlock(&apq_lock);
    return bits;
}

// Precision per llama context (patch 0312): (context, bits) of the live contexts that had one at creation
static pthread_mutex_t apq_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const void * ctx;
    int          bits;
} *             apq_ctxs;
static size_t   apq_ctx_count, apq_ctx_cap;

void ggml_ext_llama_apq_context_unbind(const void * ctx) {
    pthread_mutex_lock(&apq_ctx_lock);
    for (size_t i = 0; i < apq_ctx_count; i++) {
        if (apq_ctxs[i].ctx == ctx) {
            apq_ctxs[i] = apq_ctxs[--apq_ctx_count];
            break;
        }
    }
    pthread_mutex_unlock(&apq_ctx_lock);
}

void ggml_ext_llama_apq_context_bind(const void * ctx) {
    const int bits = ggml_ext_llama_apq_bits();
    ggml_ext_llama_apq_context_unbind(ctx);  // an address reused by a new context
    if (bits <= 0) {
        return;  // the weights' parent precision (or a bad GGML_EXT_APQ_BITS, refused when weights load)
    }
    pthread_mutex_lock(&apq_ctx_lock);
    if (apq_ctx_count == apq_ctx_cap) {
        const size_t cap  = apq_ctx_cap ? 2 * apq_ctx_cap : 8;
        void *       grow = realloc(apq_ctxs, cap * sizeof(*apq_ctxs));
        if (grow == NULL) {
            pthread_mutex_unlock(&apq_ctx_lock);
            return;  // out of memory: the context follows the process-wide precision
        }
        apq_ctxs    = grow;
        apq_ctx_cap = cap;
    }
    apq_ctxs[apq_ctx_count].ctx    = ctx;
    apq_ctxs[apq_ctx_count++].bits = bits;
    pthread_mutex_unlock(&apq_ctx_lock);
}

int ggml_ext_llama_apq_context_enter(const void * ctx) {
    if (apq_bits_local > 0) {
        return 0;  // the caller's (llama-server's per-request precision)
    }
    int bits = 0;
    pthread_mutex_lock(&apq_ctx_lock);
    for (size_t i = 0; i < apq_ctx_count; i++) {
        if (apq_ctxs[i].ctx == ctx) {
            bits = apq_ctxs[i].bits;
            break;
        }
    }
    pthread_mutex_unlock(&apq_ctx_lock);
    if (bits <= 0) {
        return 0;
    }
    apq_bits_local = bits;
    return 1;
}

void ggml_ext_llama_apq_context_leave(int entered) {
    if (entered) {
        apq_bits_local = 0;
    }
}

// The precision w runs at, or why not (message in err, of size n): -1 on error.
static int apq_precision(const struct ggml_tensor * w, int seed, int parent, char * err, size_t n) {
    const int bits = ggml_ext_llama_apq_bits();
    if (bits < 0) {
        snprintf(err, n, "GGML_EXT_APQ_BITS=\"%s\" is not a precision (a number from 1 to 8)",
                 ggml_ext_setting_text(GGML_EXT_SETTING_APQ_BITS));
        return -1;
    }
    if (bits == 0) {
        return parent;
    }
    if (bits < seed || bits > parent) {
        snprintf(err, n,
                 "%d-bit precision asked for (--apq-bits / GGML_EXT_APQ_BITS), but this file's any-precision weights "
                 "(%s, ...) serve %d to %d bits only",
                 bits, w->name, seed, parent);
        return -1;
    }
    return bits;
}

const char * ggml_ext_llama_attach_companion(struct ggml_tensor * w, struct ggml_tensor * companion) {
    static _Thread_local char err[256];
    if (companion != NULL && has_suffix(companion->name, ".ooc_idx")) {
        return ooc_attach(w, companion, 0);
    }
    if (companion != NULL && has_suffix(companion->name, ".ooc_s")) {
        return ooc_attach(w, companion, 1);
    }
    const int                 seed = ggml_ext_anyprec_seed_bits(w, companion);
    if (seed < 0) {
        snprintf(err, sizeof(err),
                 "its tables '%s' are not F16 [N (2^(P+1) - 2^S)] for %lld rows and parent precision %d "
                 "(a damaged or foreign any-precision file)",
                 companion ? companion->name : "?", (long long) w->ne[1], ggml_ext_anyprec_parent_bits((int) w->type));
        return err;
    }
    if (apq_precision(w, seed, ggml_ext_anyprec_parent_bits((int) w->type), err, sizeof(err)) < 0) {
        return err;
    }
    if (!apq_remember(w, companion, seed, ggml_ext_anyprec_parent_bits((int) w->type))) {
        return "out of memory";
    }
    return NULL;
}

// An APQ weight's mul_mat as the APQ op: its tables, the precision asked for.
static struct ggml_tensor * apq_linear(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * cur,
                                       struct ggml_tensor * result) {
    struct ggml_tensor * tables = apq_tables_of(w);
    if (tables == NULL) {
        GGML_ABORT("ggml-ext: the any-precision weight %s has no tables attached (loaded without patch 0303?)",
                   w->name);
    }
    char      err[256];
    const int seed = ggml_ext_anyprec_seed_bits(w, tables);
    const int bits = apq_precision(w, seed, ggml_ext_anyprec_parent_bits((int) w->type), err, sizeof(err));
    if (bits < 0) {
        GGML_ABORT("ggml-ext: %s", err);  // checked when the model loaded; changed since
    }
    if (cur->type != GGML_TYPE_F32) {
        return result;  // the CPU backend's mul_mat check refuses it (clear abort), as for any bad node
    }
    return ggml_ext_apq_mul_mat(ctx, w, cur, tables, bits);
}

// A weight's mul_mat plus its OOC column side-car: y + S.x[idx], when the loader attached one.
static struct ggml_tensor * ooc_linear(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * cur,
                                       struct ggml_tensor * result) {
    pthread_mutex_lock(&ooc_lock);
    const struct ooc_entry * e   = ooc_count ? ooc_entry_of(w, 0) : NULL;
    struct ggml_tensor *     idx = e ? e->idx : NULL;
    struct ggml_tensor *     s   = e ? e->s : NULL;
    pthread_mutex_unlock(&ooc_lock);
    if (idx == NULL) {
        return result;
    }
    if (s == NULL) {
        GGML_ABORT("ggml-ext: %s has an OOC side-car index but no values (%s.ooc_s missing from the file)", w->name,
                   w->name);
    }
    if (idx->buffer && idx->data && ggml_backend_buffer_is_host(idx->buffer)) {  // loaded: check the columns
        const int32_t * ix = (const int32_t *) idx->data;
        for (int64_t j = 0; j < idx->ne[0]; j++) {
            if (ix[j] < 0 || ix[j] >= w->ne[0]) {
                GGML_ABORT("ggml-ext: %s holds column %d at %lld, out of range for %s's %lld columns", idx->name,
                           (int) ix[j], (long long) j, w->name, (long long) w->ne[0]);
            }
        }
    }
    if (cur->type != GGML_TYPE_F32 || result->type != GGML_TYPE_F32) {
        GGML_ABORT("ggml-ext: %s's OOC side-car needs an F32 input and matmul result", w->name);
    }
    if (cur->nb[0] != sizeof(float)) {
        cur = ggml_cont(ctx, cur);
    }
    return ggml_ext_col_sidecar(ctx, result, cur, idx, s);
}

struct ggml_tensor * ggml_ext_llama_linear(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * cur,
                                           struct ggml_tensor * result) {
    if (w && ggml_ext_anyprec_parent_bits((int) w->type) > 0) {
        result = apq_linear(ctx, w, cur, result);
    } else if (w) {
        result = ooc_linear(ctx, w, cur, result);
        result = ggml_ext_llama_dec_linear(ctx, w, cur, result);  // QDEC at decode (dec.c)
    }
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

// llama_ftype values (llama.h): MOSTLY_Q4_0 is 2, MOSTLY_IQ4_NL 25; upstream removed 33-35
// (MOSTLY_Q4_0_4_4/4_8/8_8, in layout order) and keeps them reserved, and ggml-ext writes them again.
// The types of the other families (own ids 100-119, far above upstream's file types, 0-41) are their
// own file type: a file mostly of CB2 is file type 100, named "CB2 - 2.4375 bpw".
enum { FTYPE_MOSTLY_IQ4_NL = 25, FTYPE_Q4_0_INTERLEAVED_FIRST = 33 };

#define FTYPE_NAME_INTERLEAVED4(NAME, ID, BPW)
#define FTYPE_NAME_ANYPREC(NAME, ID, BPW) { ID, "(guessed) " #NAME " - any-precision bitplanes" },
#define FTYPE_NAME_CODEBOOKS(NAME, ID, BPW) { ID, "(guessed) " #NAME " - " BPW " bpw" },
#define FTYPE_NAME_KVQUANT(NAME, ID, BPW)  // KV cache types: no file is made of them

static const struct {
    int          ftype;
    const char * name;  // "(guessed) " + the type name: llama_ftype_name drops the prefix for a stored type
} ftype_names[] = {
    { FTYPE_Q4_0_INTERLEAVED_FIRST + 0, "(guessed) Q4_0_4_4" },
    { FTYPE_Q4_0_INTERLEAVED_FIRST + 1, "(guessed) Q4_0_4_8" },
    { FTYPE_Q4_0_INTERLEAVED_FIRST + 2, "(guessed) Q4_0_8_8" },
    // bits per weight: TYPE_SIZE * 8 / BLCK of the .def, written out (78 * 8 / 256, 110 * 8 / 256)
#define BPW_CB2 "2.4375"
#define BPW_CB3 "3.4375"
#define GGML_EXT_TYPE(NAME, ID, BLCK, TYPE_SIZE, ROWS, CHUNK, GGML_NAME, FAMILY, ...) \
    FTYPE_NAME_##FAMILY(NAME, ID, BPW_##NAME)
#include "ggml-ext-types.def"
};

const char * ggml_ext_llama_ftype_name(int ftype, bool guessed) {
    for (size_t i = 0; i < sizeof(ftype_names) / sizeof(ftype_names[0]); i++) {
        if (ftype_names[i].ftype == ftype) {
            return guessed ? ftype_names[i].name : ftype_names[i].name + sizeof("(guessed) ") - 1;
        }
    }
    return NULL;
}

int ggml_ext_llama_ftype_of_type(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    if (t == NULL || t->family == GGML_EXT_FAMILY_KVQUANT) {  // KV cache types hold no weights
        return -1;
    }
    if (t->family != GGML_EXT_FAMILY_INTERLEAVED4) {
        return t->id;  // its own file type
    }
    return t->base_type == GGML_TYPE_Q4_0 ? FTYPE_Q4_0_INTERLEAVED_FIRST + t->layout : FTYPE_MOSTLY_IQ4_NL;
}

const char * ggml_ext_llama_weight_type_refusal(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    if (t != NULL && t->family == GGML_EXT_FAMILY_KVQUANT) {
        // only a KV cache with its calibration bound to its memory gives these bytes a meaning
        return "is of a KVQuant KV cache type (nuq4 / nuq3 / nuq2, ids 103-105), which holds no weights: "
               "use it for the KV cache (-ctk / -ctv with --kv-calib); the file is damaged or was not made "
               "by ggml-ext";
    }
    return NULL;
}

const char * ggml_ext_llama_split_tensor_refusal(int type) {
    if (ggml_ext_type_family(type) == GGML_EXT_FAMILY_ANYPREC) {
        // planes are plane-major over the whole tensor: no row or column range is a contiguous slice
        return "any-precision (APQ) weights hold a whole matrix's bitplanes, which split mode \"tensor\" cannot "
               "cut across devices; use --split-mode layer (the default)";
    }
    return NULL;  // the interleaved types: whole groups of rows (ggml_ext_llama_split_granularity, patch 0102)
}

int64_t ggml_ext_llama_split_granularity(int type, int64_t g) {
    const int64_t r = ggml_ext_type_row_group(type);
    if (r <= 1) {
        return g;
    }
    int64_t a = g, b = r;  // lcm(g, r)
    while (b) {
        const int64_t t = a % b;
        a = b, b = t;
    }
    return g / a * r;
}
