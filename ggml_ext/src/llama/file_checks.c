// What a GGUF file declares about itself, checked before anything of it is used: the format versions of
// its ggml_ext.* keys (and of the KV-calibration and QDEC side files), and the any-precision facts its
// keys state about its tensors. Called by the model loader (patch 0304) and the side-file readers
// (kvquant_cache.c, qdec.c). A file from a newer ggml-ext may store the same type ids with other bytes or
// other tables; read with this build's rules it would run silently wrong, so it is refused with its
// version and this build's.
#include "ggml-ext-llama.h"
#include "ggml-ext-ops.h"
#include "ggml.h"
#include "gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

// The version of each format this build reads; python/ggml_ext/formats/versions.py asks for these
// (ggml_ext_format_key_version), so the two readers refuse the same files.
static const struct {
    const char * key;
    int          reads;
} format_keys[] = {
    { "ggml_ext.format_version",           1 },  // GGUF conventions of every file ggml-ext writes
    { "ggml_ext.anyprec.version",          1 },  // bitplanes and centroid tables (docs/formats/anyprec.md)
    { "ggml_ext.ooc.version",              1 },  // OOC column side-cars (docs/GPTQ.md)
    { "ggml_ext.codebooks.tables_version", 1 },  // CB2 / CB3 tables compiled in (codebooks_tables.h)
    { "kvquant.format_version",            1 },  // KV calibration side file (ggml-ext calibrate kv)
    { "qdec.format_version",               1 },  // QDEC side file (ggml-ext calibrate dec)
};

int ggml_ext_format_key_version(const char * key) {
    for (size_t i = 0; key && i < sizeof(format_keys) / sizeof(format_keys[0]); i++) {
        if (strcmp(format_keys[i].key, key) == 0) {
            return format_keys[i].reads;
        }
    }
    return -1;
}

// A ggml_ext.* key that names a format version: "<...>version" under "ggml_ext."
static int is_ext_version_key(const char * key) {
    const size_t n = strlen(key), m = strlen("version");
    return strncmp(key, "ggml_ext.", 9) == 0 && n >= m && strcmp(key + n - m, "version") == 0;
}

// Key id's value as an integer; 0 when it is not one of GGUF's integer types.
static int int_value(const struct gguf_context * g, int64_t id, long long * v) {
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8:  *v = gguf_get_val_u8(g, id);  return 1;
        case GGUF_TYPE_INT8:   *v = gguf_get_val_i8(g, id);  return 1;
        case GGUF_TYPE_UINT16: *v = gguf_get_val_u16(g, id); return 1;
        case GGUF_TYPE_INT16:  *v = gguf_get_val_i16(g, id); return 1;
        case GGUF_TYPE_UINT32: *v = gguf_get_val_u32(g, id); return 1;
        case GGUF_TYPE_INT32:  *v = gguf_get_val_i32(g, id); return 1;
        case GGUF_TYPE_INT64:  *v = (long long) gguf_get_val_i64(g, id); return 1;
        case GGUF_TYPE_UINT64: {
            const uint64_t u = gguf_get_val_u64(g, id);
            *v = u > (uint64_t) INT64_MAX ? INT64_MAX : (long long) u;
            return 1;
        }
        default: return 0;
    }
}

int ggml_ext_check_format_key(const struct gguf_context * g, const char * key, const char * path, int required,
                              char * err, size_t n) {
    const int     reads = ggml_ext_format_key_version(key);
    const int64_t id    = gguf_find_key(g, key);
    long long     v     = 0;
    if (id < 0) {
        if (!required) {
            return 0;
        }
        snprintf(err, n, "%s: %s is missing (not a file ggml-ext wrote); this build reads version %d", path, key, reads);
        return -1;
    }
    if (!int_value(g, id, &v)) {
        snprintf(err, n, "%s: %s is a %s, not a version number; this build reads %d", path, key,
                 gguf_type_name(gguf_get_kv_type(g, id)), reads);
        return -1;
    }
    if (reads < 0) {
        // a format this build does not know at all: a newer ggml-ext added it
        snprintf(err, n, "%s: %s: written by a newer ggml-ext (version %lld); this build reads none of this format",
                 path, key, v);
        return -1;
    }
    if (v > reads) {
        snprintf(err, n, "%s: %s: written by a newer ggml-ext (version %lld); this build reads %d", path, key, v,
                 reads);
        return -1;
    }
    if (v < 1) {
        snprintf(err, n, "%s: %s: version %lld is not one ggml-ext writes (a damaged file); this build reads %d", path,
                 key, v, reads);
        return -1;
    }
    return 0;
}

// The any-precision keys against the tensors: the parent precision of every APQ weight's type, the seed
// precision its tables' length gives. -1 with err on a contradiction.
static int check_anyprec(const struct gguf_context * g, const struct ggml_context * ctx, const char * path, char * err,
                         size_t n) {
    const char * const keys[2] = { "ggml_ext.anyprec.seed_bits", "ggml_ext.anyprec.parent_bits" };
    long long          declared[2];
    for (int i = 0; i < 2; i++) {
        const int64_t id = gguf_find_key(g, keys[i]);
        if (id < 0) {
            snprintf(err, n, "%s: any-precision file without %s (a damaged file)", path, keys[i]);
            return -1;
        }
        if (!int_value(g, id, &declared[i]) || declared[i] < 1 || declared[i] > 8) {
            snprintf(err, n, "%s: %s is not a precision from 1 to 8 bits", path, keys[i]);
            return -1;
        }
    }
    const int64_t nt = ctx ? gguf_get_n_tensors(g) : 0;
    for (int64_t i = 0; i < nt; i++) {
        const struct ggml_tensor * w = ggml_get_tensor((struct ggml_context *) ctx, gguf_get_tensor_name(g, i));
        const int                  P = w ? ggml_ext_anyprec_parent_bits((int) w->type) : 0;
        if (P == 0) {
            continue;
        }
        if (P != declared[1]) {
            snprintf(err, n, "%s: %s = %lld contradicts tensor %s (type %s holds %d bitplanes)", path, keys[1],
                     declared[1], w->name, ggml_type_name(w->type), P);
            return -1;
        }
        char tname[GGML_MAX_NAME + 16];
        snprintf(tname, sizeof(tname), "%s.apq_tables", w->name);
        const struct ggml_tensor * tables = ggml_get_tensor((struct ggml_context *) ctx, tname);
        if (tables == NULL) {
            continue;  // the loader names the missing companion (patch 0303)
        }
        const int S = ggml_ext_anyprec_seed_bits(w, tables);
        if (S != declared[0]) {
            if (S < 0) {
                snprintf(err, n, "%s: tensor %s holds %lld entries, not N (2^(P+1) - 2^S) for %s's %lld rows, P = %d "
                         "and %s = %lld", path, tname, (long long) tables->ne[0], w->name, (long long) w->ne[1], P,
                         keys[0], declared[0]);
            } else {
                snprintf(err, n, "%s: %s = %lld contradicts tensor %s (its length is that of %d-bit seed tables)",
                         path, keys[0], declared[0], tname, S);
            }
            return -1;
        }
    }
    if (declared[0] > declared[1]) {  // a file without APQ tensors (bitplanes stored as I8) gets here
        snprintf(err, n, "%s: %s = %lld exceeds %s = %lld", path, keys[0], declared[0], keys[1], declared[1]);
        return -1;
    }
    return 0;
}

const char * ggml_ext_llama_check_model_file(const struct gguf_context * g, const struct ggml_context * ctx,
                                             const char * path) {
    static _Thread_local char err[512];
    if (g == NULL) {
        return NULL;
    }
    path               = path ? path : "(model)";
    const int64_t n_kv = gguf_get_n_kv(g);
    for (int64_t i = 0; i < n_kv; i++) {
        const char * key = gguf_get_key(g, i);
        if (is_ext_version_key(key) && ggml_ext_check_format_key(g, key, path, 0, err, sizeof(err)) != 0) {
            return err;
        }
    }
    if (gguf_find_key(g, "ggml_ext.anyprec.version") >= 0 && check_anyprec(g, ctx, path, err, sizeof(err)) != 0) {
        return err;
    }
    return NULL;
}
