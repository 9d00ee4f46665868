// QDEC in llama.cpp (docs/QDEC.md, "In llama.cpp"; header ggml-ext-qdec.h). Compiled into libllama.
//
// The side file of `ggml-ext calibrate dec` is mapped read-only, whole, once; its tensors' data point into
// the mapping, which one buffer of our own host buffer type spans (GGML_EXT_DEC_Host): the CPU reads it
// as any host buffer, ggml-cuda (patch 0440) reads it in place, pinned and mapped (ggml_ext_cuda_qdec_pin,
// zero-copy over PCIe), so the scheduler never copies a residual to GPU memory. The model loader (patch
// 0330) hands every weight to ggml_ext_llama_dec_attach, which checks the side file's residual of it
// against its shape and type and remembers it by the weight's address (as the OOC side-cars are); the
// linear hook then adds DEC_MUL_MAT after the weight's matmul in graphs of one token (decode) only.
#include "common/settings.h"
#include "ggml-ext-llama.h"
#include "ggml-ext-qdec.h"
#include "ggml-ext-ops.h"
#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { DEC_QKV, DEC_O, DEC_GATEUP, DEC_DOWN, DEC_NTYPES };
static const char * const dec_type_names[DEC_NTYPES] = { "qkv", "o", "gateup", "down" };

#define DEC_DEFAULT_K 16
#define DEC_MAX_KS    16

static char * dup_str(const char * s) {
    const size_t n = strlen(s) + 1;
    char *       d = (char *) malloc(n);
    if (d) {
        memcpy(d, s, n);
    }
    return d;
}

// ---- the buffer type of the mapped side file ----

static const char * host_buft_name(ggml_backend_buffer_type_t buft) {
    (void) buft;
    return GGML_EXT_QDEC_HOST_BUFT_NAME;
}

static ggml_backend_buffer_t host_buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    (void) buft;
    (void) size;
    return NULL;  // only ggml_ext's mapping of a side file is of this type
}

static size_t host_buft_alignment(ggml_backend_buffer_type_t buft) {
    (void) buft;
    return 32;  // GGUF's default alignment of tensor data
}

static bool host_buft_is_host(ggml_backend_buffer_type_t buft) {
    (void) buft;
    return true;
}

static struct ggml_backend_buffer_type host_buft = {
    .iface =
        {
                .get_name       = host_buft_name,
                .alloc_buffer   = host_buft_alloc,
                .get_alignment  = host_buft_alignment,
                .get_max_size   = NULL,
                .get_alloc_size = NULL,
                .is_host        = host_buft_is_host,
                },
    .device  = NULL,
    .context = NULL,
};

static void * host_buf_base(ggml_backend_buffer_t buf) {
    return buf->context;
}

static void host_buf_get(ggml_backend_buffer_t buf, const struct ggml_tensor * t, void * data, size_t offset,
                         size_t size) {
    (void) buf;
    memcpy(data, (const char *) t->data + offset, size);
}

static void host_buf_set(ggml_backend_buffer_t buf, struct ggml_tensor * t, const void * data, size_t offset,
                         size_t size) {
    (void) buf;
    (void) t;
    (void) data;
    (void) offset;
    (void) size;
    GGML_ABORT("ggml-ext: the QDEC side file is mapped read-only; nothing writes its residuals");
}

static void host_buf_memset(ggml_backend_buffer_t buf, struct ggml_tensor * t, uint8_t v, size_t offset, size_t size) {
    (void) buf;
    (void) t;
    (void) v;
    (void) offset;
    (void) size;
    GGML_ABORT("ggml-ext: the QDEC side file is mapped read-only; nothing writes its residuals");
}

static void host_buf_clear(ggml_backend_buffer_t buf, uint8_t v) {
    (void) buf;
    (void) v;  // llama.cpp clears output buffers only; a mapped file has nothing to clear
}

static const struct ggml_backend_buffer_i host_buf_iface = {
    .free_buffer   = NULL,  // the mapping lives as long as the process (models may still point into it)
    .get_base      = host_buf_base,
    .init_tensor   = NULL,
    .memset_tensor = host_buf_memset,
    .set_tensor    = host_buf_set,
    .get_tensor    = host_buf_get,
    .cpy_tensor    = NULL,
    .clear         = host_buf_clear,
    .reset         = NULL,
};

// ---- the side file ----

struct dec_file {
    char *                path;
    void *                map;
    size_t                size;
    struct gguf_context * gguf;
    struct ggml_context * meta;  // its tensors, data in the mapping
    ggml_backend_buffer_t buf;
    int                   ks[DEC_MAX_KS];  // qdec.k_chunks: the k values whose b15 is stored
    int                   n_ks;
    char                  model_id[128];
    char                  base_sha[20];  // the first 16 hex digits of qdec.base_sha256
    int                   n_linears;     // tensors named *.dec_r
    int                   has_types;     // qdec.base_types present
};

struct dec_entry {
    const struct ggml_tensor * w;
    struct ggml_tensor *       r, *s;
    const float *              bounds;  // b0, then b15 per k of the file's k_chunks
    const struct dec_file *    file;
    int                        type;  // DEC_QKV ...
};

static pthread_mutex_t    dec_lock = PTHREAD_MUTEX_INITIALIZER;
static char *             dec_path_set;  // ggml_ext_llama_set_dec; NULL: GGML_EXT_DEC
static struct dec_file *  dec_files[16];  // every side file opened (kept mapped: models may use them)
static int                dec_n_files;
static struct dec_entry * dec_entries;
static size_t             dec_count, dec_cap;
static int                dec_matched;     // linears of the current load matched (dec_attach .. dec_done)
static struct dec_file *  dec_load_file;   // the side file of the current load

// per-type settings: layered defaults < config < k / ntb spec (set, else environment)
static int   dec_k_set[DEC_NTYPES], dec_ntb_set[DEC_NTYPES];  // -1: not set here
static int   dec_cfg_k[DEC_NTYPES], dec_cfg_ntb[DEC_NTYPES];  // from ggml_ext_llama_set_dec_config; -1: none
static int   dec_cfg_set;                                     // a config was loaded through the API
static int   dec_settings_init;

static void settings_init(void) {
    if (!dec_settings_init) {
        for (int i = 0; i < DEC_NTYPES; i++) {
            dec_k_set[i] = dec_ntb_set[i] = dec_cfg_k[i] = dec_cfg_ntb[i] = -1;
        }
        dec_settings_init = 1;
    }
}

const char * ggml_ext_llama_dec(void) {
    if (dec_path_set) {
        return dec_path_set;
    }
    return ggml_ext_settings_dec();
}

int ggml_ext_llama_set_dec(const char * path) {
    pthread_mutex_lock(&dec_lock);
    free(dec_path_set);
    dec_path_set = path && path[0] ? dup_str(path) : NULL;
    pthread_mutex_unlock(&dec_lock);
    return 0;
}

// "16" or "qkv=16,o=8,gateup=16,down=32" into v (types not named left alone); 0 or -1 with err
static int parse_spec(const char * what, const char * spec, int max, int v[DEC_NTYPES], char * err, size_t n) {
    int          out[DEC_NTYPES];
    const char * p = spec;
    memcpy(out, v, sizeof(out));
    if (spec == NULL || spec[0] == '\0') {
        snprintf(err, n, "%s: empty; use 0..%d, or qkv=N,o=N,gateup=N,down=N", what, max);
        return -1;
    }
    if (isdigit((unsigned char) spec[0])) {
        char *     end = NULL;
        const long x   = strtol(spec, &end, 10);
        if (*end != '\0' || x < 0 || x > max) {
            snprintf(err, n, "%s: '%s' is %s; use 0..%d, or qkv=N,o=N,gateup=N,down=N", what, spec,
                     *end != '\0' ? "not an integer" : "out of range", max);
            return -1;
        }
        for (int i = 0; i < DEC_NTYPES; i++) {
            v[i] = (int) x;
        }
        return 0;
    }
    while (*p) {
        const char * eq = strchr(p, '=');
        int          t  = -1;
        for (int i = 0; eq && i < DEC_NTYPES; i++) {
            if ((size_t) (eq - p) == strlen(dec_type_names[i]) && strncmp(p, dec_type_names[i], eq - p) == 0) {
                t = i;
            }
        }
        if (t < 0) {
            snprintf(err, n, "%s: '%s' is not an integer or NAME=N list; use 0..%d, or NAME=N,... with NAME one of "
                     "qkv, o, gateup, down", what, spec, max);
            return -1;
        }
        char *     end = NULL;
        const long x   = strtol(eq + 1, &end, 10);
        if (end == eq + 1 || (*end != ',' && *end != '\0') || x < 0 || x > max) {
            snprintf(err, n, "%s: '%s': the value of %s is not an integer in 0..%d", what, spec, dec_type_names[t], max);
            return -1;
        }
        out[t] = (int) x;
        p      = *end == ',' ? end + 1 : end;
    }
    memcpy(v, out, sizeof(out));
    return 0;
}

#define DEC_K_MAX   GGML_EXT_QDEC_CHUNK
#define DEC_NTB_MAX 65536

// --dec-k / --dec-ntb: a spec updates the types it names in *set (NULL: back to the environment / default)
static int set_spec(const char * flag, int max, int * set, const char * spec, char * err, size_t n) {
    settings_init();
    int v[DEC_NTYPES] = { -1, -1, -1, -1 };
    if (spec != NULL) {
        memcpy(v, set, sizeof(v));
        if (parse_spec(flag, spec, max, v, err, n) != 0) {
            return -1;
        }
    }
    memcpy(set, v, sizeof(v));
    return 0;
}

int ggml_ext_llama_set_dec_k(const char * spec, char * err, size_t n) {
    return set_spec("--dec-k", DEC_K_MAX, dec_k_set, spec, err, n);
}

int ggml_ext_llama_set_dec_ntb(const char * spec, char * err, size_t n) {
    return set_spec("--dec-ntb", DEC_NTB_MAX, dec_ntb_set, spec, err, n);
}

// The string value of "key" in a flat JSON object (no escapes in our configs); 0 or -1
static int json_string_field(const char * text, const char * key, char * out, size_t n) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\"", key);
    const char * p = strstr(text, pat);
    if (p == NULL) {
        return -1;
    }
    p += strlen(pat);
    while (isspace((unsigned char) *p)) {
        p++;
    }
    if (*p++ != ':') {
        return -1;
    }
    while (isspace((unsigned char) *p)) {
        p++;
    }
    if (*p++ != '"') {
        return -1;
    }
    const char * e = strchr(p, '"');
    if (e == NULL || (size_t) (e - p) >= n) {
        return -1;
    }
    memcpy(out, p, e - p);
    out[e - p] = '\0';
    return 0;
}

// Reads a tuner config into k / ntb (each type -1 first: a config names all four); 0 or -1 with err
static int read_config(const char * path, int k[DEC_NTYPES], int ntb[DEC_NTYPES], char * err, size_t n) {
    FILE * f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, n, "QDEC config %s: %s", path, strerror(errno));
        return -1;
    }
    char         text[8192];
    const size_t got = fread(text, 1, sizeof(text) - 1, f);
    const int    big = !feof(f);
    fclose(f);
    text[got] = '\0';
    if (big) {
        snprintf(err, n, "QDEC config %s: larger than %zu bytes (not a config of `ggml-ext tune dec`)", path,
                 sizeof(text) - 1);
        return -1;
    }
    char sk[256], sn[256];
    if (strstr(text, "\"ggml-ext-dec-config\"") == NULL || json_string_field(text, "dec_k", sk, sizeof(sk)) != 0 ||
        json_string_field(text, "dec_ntb", sn, sizeof(sn)) != 0) {
        snprintf(err, n,
                 "QDEC config %s: not a config of `ggml-ext tune dec` (a JSON object with \"format\": "
                 "\"ggml-ext-dec-config\" and string fields \"dec_k\", \"dec_ntb\")",
                 path);
        return -1;
    }
    for (int i = 0; i < DEC_NTYPES; i++) {
        k[i] = ntb[i] = DEC_DEFAULT_K;
    }
    char e2[200];
    if (parse_spec("dec_k", sk, DEC_K_MAX, k, e2, sizeof(e2)) != 0 ||
        parse_spec("dec_ntb", sn, DEC_NTB_MAX, ntb, e2, sizeof(e2)) != 0) {
        snprintf(err, n, "QDEC config %s: %s", path, e2);
        return -1;
    }
    return 0;
}

int ggml_ext_llama_set_dec_config(const char * path, char * err, size_t n) {
    settings_init();
    if (path == NULL) {
        dec_cfg_set = 0;
        return 0;
    }
    int k[DEC_NTYPES], ntb[DEC_NTYPES];
    if (read_config(path, k, ntb, err, n) != 0) {
        return -1;
    }
    memcpy(dec_cfg_k, k, sizeof(k));
    memcpy(dec_cfg_ntb, ntb, sizeof(ntb));
    dec_cfg_set = 1;
    return 0;
}

// The k_chunk and n_tb of every type now; 0, or -1 with err (a bad environment variable)
static int dec_settings(int k[DEC_NTYPES], int ntb[DEC_NTYPES], char * err, size_t n) {
    settings_init();
    for (int i = 0; i < DEC_NTYPES; i++) {
        k[i]   = DEC_DEFAULT_K;
        ntb[i] = 0;
    }
    if (dec_cfg_set) {
        memcpy(k, dec_cfg_k, sizeof(int) * DEC_NTYPES);
        memcpy(ntb, dec_cfg_ntb, sizeof(int) * DEC_NTYPES);
    } else if (ggml_ext_settings_dec_config()) {
        if (read_config(ggml_ext_settings_dec_config(), k, ntb, err, n) != 0) {
            return -1;
        }
    }
    const char * ek = ggml_ext_settings_dec_k();
    const char * en = ggml_ext_settings_dec_ntb();
    if (ek && parse_spec("GGML_EXT_DEC_K", ek, DEC_K_MAX, k, err, n) != 0) {
        return -1;
    }
    if (en && parse_spec("GGML_EXT_DEC_NTB", en, DEC_NTB_MAX, ntb, err, n) != 0) {
        return -1;
    }
    for (int i = 0; i < DEC_NTYPES; i++) {
        k[i]   = dec_k_set[i] >= 0 ? dec_k_set[i] : k[i];
        ntb[i] = dec_ntb_set[i] >= 0 ? dec_ntb_set[i] : ntb[i];
    }
    return 0;
}

static int has_suffix(const char * name, const char * suffix) {
    const size_t n = strlen(name), m = strlen(suffix);
    return n >= m && strcmp(name + n - m, suffix) == 0;
}

// The linear type of a weight by its GGUF name; -1: none of the four
static int linear_type(const char * name) {
    static const struct {
        const char * part;
        int          type;
    } map[] = {
        { ".attn_q.", DEC_QKV },      { ".attn_k.", DEC_QKV },   { ".attn_v.", DEC_QKV },
        { ".attn_qkv.", DEC_QKV },    { ".attn_output.", DEC_O }, { ".ffn_gate.", DEC_GATEUP },
        { ".ffn_up.", DEC_GATEUP },   { ".ffn_gate_up.", DEC_GATEUP }, { ".ffn_down.", DEC_DOWN },
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (strstr(name, map[i].part)) {
            return map[i].type;
        }
    }
    return -1;
}

static int64_t gguf_int(const struct gguf_context * g, int64_t id, int * ok) {
    *ok = 1;
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8:  return gguf_get_val_u8(g, id);
        case GGUF_TYPE_INT8:   return gguf_get_val_i8(g, id);
        case GGUF_TYPE_UINT16: return gguf_get_val_u16(g, id);
        case GGUF_TYPE_INT16:  return gguf_get_val_i16(g, id);
        case GGUF_TYPE_UINT32: return gguf_get_val_u32(g, id);
        case GGUF_TYPE_INT32:  return gguf_get_val_i32(g, id);
        case GGUF_TYPE_UINT64: return (int64_t) gguf_get_val_u64(g, id);
        case GGUF_TYPE_INT64:  return gguf_get_val_i64(g, id);
        default:               *ok = 0; return 0;
    }
}

static int64_t key_int(const struct gguf_context * g, const char * key, int64_t dflt, int * ok) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        *ok = 0;
        return dflt;
    }
    return gguf_int(g, id, ok);
}

static void file_free(struct dec_file * f) {
    if (f == NULL) {
        return;
    }
    if (f->buf) {
        ggml_backend_buffer_free(f->buf);
    }
    if (f->meta) {
        ggml_free(f->meta);
    }
    if (f->gguf) {
        gguf_free(f->gguf);
    }
    if (f->map && f->map != MAP_FAILED) {
        munmap(f->map, f->size);
    }
    free(f->path);
    free(f);
}

// Opens and checks a side file (everything but its fit to a model); NULL with err on failure
static struct dec_file * file_open(const char * path, char * err, size_t n) {
    struct dec_file * f = (struct dec_file *) calloc(1, sizeof(*f));
    if (f == NULL) {
        snprintf(err, n, "out of memory");
        return NULL;
    }
    f->path = dup_str(path);
    struct gguf_init_params gp = { /*.no_alloc =*/true, /*.ctx =*/&f->meta };
    f->gguf                    = gguf_init_from_file(path, gp);
    if (f->gguf == NULL) {
        struct stat st;
        if (stat(path, &st) != 0) {
            snprintf(err, n, "the QDEC side file %s: %s", path, strerror(errno));
        } else {
            snprintf(err, n, "the QDEC side file %s is not a readable GGUF file", path);
        }
        file_free(f);
        return NULL;
    }
    const int64_t tid = gguf_find_key(f->gguf, "general.type");
    if (tid < 0 || gguf_get_kv_type(f->gguf, tid) != GGUF_TYPE_STRING ||
        strcmp(gguf_get_val_str(f->gguf, tid), "qdec") != 0) {
        snprintf(err, n,
                 "%s is not a QDEC side file (general.type \"%s\"): make one with `ggml-ext calibrate dec BASE.gguf "
                 "--hf HF_DIR -o OUT.gguf`",
                 path, tid >= 0 && gguf_get_kv_type(f->gguf, tid) == GGUF_TYPE_STRING ? gguf_get_val_str(f->gguf, tid) : "");
        file_free(f);
        return NULL;
    }
    int           ok2, ok3;
    const int64_t chunk = key_int(f->gguf, "qdec.chunk", -1, &ok2);
    const int64_t bits  = key_int(f->gguf, "qdec.bits", -1, &ok3);
    if (ggml_ext_check_format_key(f->gguf, "qdec.format_version", path, 1, err, n) != 0) {
        file_free(f);
        return NULL;
    }
    if (!ok2 || !ok3 || chunk != GGML_EXT_QDEC_CHUNK || bits != 4) {
        snprintf(err, n, "the QDEC side file %s: chunk %lld, %lld bits; this build runs chunk %d, 4 bits", path,
                 (long long) chunk, (long long) bits, GGML_EXT_QDEC_CHUNK);
        file_free(f);
        return NULL;
    }
    const int64_t kid = gguf_find_key(f->gguf, "qdec.k_chunks");
    if (kid < 0 || gguf_get_kv_type(f->gguf, kid) != GGUF_TYPE_ARRAY ||
        (gguf_get_arr_type(f->gguf, kid) != GGUF_TYPE_INT32 && gguf_get_arr_type(f->gguf, kid) != GGUF_TYPE_UINT32) ||
        gguf_get_arr_n(f->gguf, kid) < 1 || gguf_get_arr_n(f->gguf, kid) > DEC_MAX_KS) {
        snprintf(err, n, "the QDEC side file %s: qdec.k_chunks missing or not a list of 1..%d integers", path,
                 DEC_MAX_KS);
        file_free(f);
        return NULL;
    }
    f->n_ks = (int) gguf_get_arr_n(f->gguf, kid);
    for (int i = 0; i < f->n_ks; i++) {
        f->ks[i] = ((const int32_t *) gguf_get_arr_data(f->gguf, kid))[i];
        if (f->ks[i] < 1 || (i > 0 && f->ks[i] <= f->ks[i - 1])) {
            snprintf(err, n, "the QDEC side file %s: qdec.k_chunks is not ascending positive", path);
            file_free(f);
            return NULL;
        }
    }
    const int64_t mid = gguf_find_key(f->gguf, "qdec.model_id");
    snprintf(f->model_id, sizeof(f->model_id), "%s",
             mid >= 0 && gguf_get_kv_type(f->gguf, mid) == GGUF_TYPE_STRING ? gguf_get_val_str(f->gguf, mid) : "?");
    const int64_t sid = gguf_find_key(f->gguf, "qdec.base_sha256");
    snprintf(f->base_sha, sizeof(f->base_sha), "%.16s",
             sid >= 0 && gguf_get_kv_type(f->gguf, sid) == GGUF_TYPE_STRING ? gguf_get_val_str(f->gguf, sid) : "?");
    f->has_types = gguf_find_key(f->gguf, "qdec.base_types") >= 0;

    // map the file, check every tensor lies inside it, and point the tensors at their bytes
    const int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, n, "the QDEC side file %s: %s", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        file_free(f);
        return NULL;
    }
    f->size = (size_t) st.st_size;
    f->map  = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        snprintf(err, n, "the QDEC side file %s: mmap: %s", path, strerror(errno));
        f->map = NULL;
        file_free(f);
        return NULL;
    }
    f->buf = ggml_backend_buffer_init(&host_buft, host_buf_iface, f->map, f->size);
    if (f->buf == NULL) {
        snprintf(err, n, "out of memory");
        file_free(f);
        return NULL;
    }
    const size_t  data = gguf_get_data_offset(f->gguf);
    const int64_t nt   = gguf_get_n_tensors(f->gguf);
    for (int64_t i = 0; i < nt; i++) {
        const char *         name = gguf_get_tensor_name(f->gguf, i);
        struct ggml_tensor * t    = ggml_get_tensor(f->meta, name);
        const size_t         off  = data + gguf_get_tensor_offset(f->gguf, i);
        if (t == NULL || off > f->size || ggml_nbytes(t) > f->size - off) {
            snprintf(err, n, "the QDEC side file %s is truncated or damaged (tensor %s)", path, name);
            file_free(f);
            return NULL;
        }
        if (ggml_backend_tensor_alloc(f->buf, t, (char *) f->map + off) != GGML_STATUS_SUCCESS) {
            snprintf(err, n, "the QDEC side file %s: tensor %s cannot be placed", path, name);
            file_free(f);
            return NULL;
        }
        if (has_suffix(name, ".dec_r")) {
            f->n_linears++;
        }
    }
    if (f->n_linears == 0) {
        snprintf(err, n, "the QDEC side file %s holds no residuals (*.dec_r)", path);
        file_free(f);
        return NULL;
    }
    return f;
}

// The side file at path, opened once; NULL with err. Call under dec_lock.
static struct dec_file * file_get(const char * path, char * err, size_t n) {
    for (int i = 0; i < dec_n_files; i++) {
        if (strcmp(dec_files[i]->path, path) == 0) {
            return dec_files[i];
        }
    }
    if (dec_n_files == (int) (sizeof(dec_files) / sizeof(dec_files[0]))) {
        snprintf(err, n, "more than %d QDEC side files in one process", dec_n_files);
        return NULL;
    }
    struct dec_file * f = file_open(path, err, n);
    if (f) {
        dec_files[dec_n_files++] = f;
    }
    return f;
}

// Under dec_lock: the entry of w, created when create is set
static struct dec_entry * entry_of(const struct ggml_tensor * w, int create) {
    for (size_t i = dec_count; i-- > 0;) {
        if (dec_entries[i].w == w) {
            return &dec_entries[i];
        }
    }
    if (!create) {
        return NULL;
    }
    if (dec_count == dec_cap) {
        const size_t       cap = dec_cap ? 2 * dec_cap : 256;
        struct dec_entry * e   = (struct dec_entry *) realloc(dec_entries, cap * sizeof(*e));
        if (e == NULL) {
            return NULL;
        }
        dec_entries = e;
        dec_cap     = cap;
    }
    struct dec_entry * e = &dec_entries[dec_count++];
    memset(e, 0, sizeof(*e));
    e->w = w;
    return e;
}

// the base type the side file was made for w (qdec.base_types "name:type"); -1 when not recorded
static int recorded_type(const struct dec_file * f, const char * wname) {
    const int64_t id = gguf_find_key(f->gguf, "qdec.base_types");
    if (id < 0 || gguf_get_kv_type(f->gguf, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(f->gguf, id) != GGUF_TYPE_STRING) {
        return -1;
    }
    const size_t wl = strlen(wname);
    for (size_t i = 0; i < gguf_get_arr_n(f->gguf, id); i++) {
        const char * s = gguf_get_arr_str(f->gguf, id, i);
        if (strncmp(s, wname, wl) == 0 && s[wl] == ':') {
            return atoi(s + wl + 1);
        }
    }
    return -1;
}

const char * ggml_ext_llama_dec_attach(struct ggml_tensor * w) {
    static _Thread_local char err[512];
    const char *              path = ggml_ext_llama_dec();
    if (w == NULL) {
        return NULL;
    }
    const char * res = NULL;
    pthread_mutex_lock(&dec_lock);
    struct dec_entry * old = dec_count ? entry_of(w, 0) : NULL;
    if (old) {
        old->r = NULL;  // a freed model's weight at this address: forget its residual
    }
    if (path == NULL) {
        pthread_mutex_unlock(&dec_lock);
        return NULL;
    }
    struct dec_file * f = file_get(path, err, sizeof(err));
    if (f == NULL) {
        res = err;
        goto done;
    }
    if (dec_load_file != f) {
        dec_load_file = f;
        dec_matched   = 0;
    }
    char name[GGML_MAX_NAME + 16];
    snprintf(name, sizeof(name), "%s.dec_r", w->name);
    struct ggml_tensor * r = ggml_get_tensor(f->meta, name);
    if (r == NULL) {
        goto done;  // not covered: runs uncompensated
    }
    snprintf(name, sizeof(name), "%s.dec_scale", w->name);
    struct ggml_tensor * s = ggml_get_tensor(f->meta, name);
    snprintf(name, sizeof(name), "%s.dec_bounds", w->name);
    struct ggml_tensor * b    = ggml_get_tensor(f->meta, name);
    const int64_t        K    = w->ne[0], M = w->ne[1];
    const int            type = linear_type(w->name);
    if (w->ne[2] != 1 || w->ne[3] != 1 || type < 0) {
        snprintf(err, sizeof(err),
                 "the QDEC side file %s has a residual for '%s', which is not a linear QDEC compensates here "
                 "(q/k/v/qkv, output, gate/up, down matrices): a side file of another model",
                 path, w->name);
        res = err;
        goto done;
    }
    if (r->type != GGML_TYPE_I8 || r->ne[0] != (M + 1) / 2 || r->ne[1] != K || ggml_n_dims(r) > 2 || s == NULL ||
        s->type != GGML_TYPE_F32 || ggml_nelements(s) != M || b == NULL || b->type != GGML_TYPE_F32 ||
        ggml_nelements(b) != 1 + f->n_ks) {
        snprintf(err, sizeof(err),
                 "the QDEC side file %s does not belong to this model: '%s' is %lld x %lld (outputs x inputs) here, "
                 "its residual there is I8 [%lld, %lld] with %s scales and bounds (the side file's base: %s, "
                 "sha256 %s...); make one for this model with `ggml-ext calibrate dec`",
                 path, w->name, (long long) M, (long long) K, (long long) r->ne[0], (long long) r->ne[1],
                 s && b ? "these" : "missing", f->model_id, f->base_sha);
        res = err;
        goto done;
    }
    const int want = recorded_type(f, w->name);
    if (want >= 0 && want != (int) w->type) {
        snprintf(err, sizeof(err),
                 "the QDEC side file %s does not belong to this model: '%s' is %s here, the side file's residual is "
                 "of a %s base (%s, sha256 %s...); the residual is what that base misses, not this one: calibrate "
                 "one for this file with `ggml-ext calibrate dec`",
                 path, w->name, ggml_type_name(w->type), want < GGML_TYPE_COUNT ? ggml_type_name((enum ggml_type) want) : "?",
                 f->model_id, f->base_sha);
        res = err;
        goto done;
    }
    const float * bounds = (const float *) b->data;
    for (int i = 0; i <= f->n_ks; i++) {
        if (!isfinite(bounds[i]) || !(bounds[i] > 0.0f) || (i > 0 && bounds[i] > bounds[0])) {
            snprintf(err, sizeof(err), "the QDEC side file %s: %s.dec_bounds are not finite 0 < b15 <= b0 (damaged)",
                     path, w->name);
            res = err;
            goto done;
        }
    }
    struct dec_entry * e = entry_of(w, 1);
    if (e == NULL) {
        res = "out of memory";
        goto done;
    }
    e->r      = r;
    e->s      = s;
    e->bounds = bounds;
    e->file   = f;
    e->type   = type;
    dec_matched++;
done:
    pthread_mutex_unlock(&dec_lock);
    return res;
}

const char * ggml_ext_llama_dec_done(bool partial) {
    static _Thread_local char err[512];
    const char *              path = ggml_ext_llama_dec();
    if (path == NULL) {
        return NULL;
    }
    const char * res = NULL;
    pthread_mutex_lock(&dec_lock);
    struct dec_file * f = file_get(path, err, sizeof(err));
    if (f == NULL) {
        res = err;
    } else if (!partial && (dec_load_file != f || dec_matched < f->n_linears)) {
        // name one residual no weight of this model took
        const char * missing = "?";
        for (int64_t i = 0; i < gguf_get_n_tensors(f->gguf); i++) {
            const char * tn = gguf_get_tensor_name(f->gguf, i);
            if (!has_suffix(tn, ".dec_r")) {
                continue;
            }
            int found = 0;
            for (size_t j = 0; j < dec_count && !found; j++) {
                found = dec_entries[j].file == f && dec_entries[j].r == ggml_get_tensor(f->meta, tn);
            }
            if (!found) {
                missing = tn;
                break;
            }
        }
        snprintf(err, sizeof(err),
                 "the QDEC side file %s does not belong to this model: it has residuals for %d linears, this model "
                 "matched %d (no weight for '%s'; the side file's base: %s, sha256 %s...)",
                 path, f->n_linears, dec_load_file == f ? dec_matched : 0, missing, f->model_id, f->base_sha);
        res = err;
    }
    if (res == NULL) {
        fprintf(stderr, "ggml-ext: QDEC side file %s: %d linears compensated at decode (model %s)\n", path,
                f->n_linears, f->model_id);
    }
    dec_load_file = NULL;
    dec_matched   = 0;
    pthread_mutex_unlock(&dec_lock);
    return res;
}

static _Thread_local uint32_t dec_graph_n_tokens;  // 0: not told (a caller outside llama.cpp's graphs)

void ggml_ext_llama_dec_graph_tokens(uint32_t n_tokens) {
    dec_graph_n_tokens = n_tokens;
}

// b15 for k: the stored one, else the next larger stored k's, else the largest stored (calibration.py)
static float b15_for(const struct dec_entry * e, int k) {
    for (int i = 0; i < e->file->n_ks; i++) {
        if (e->file->ks[i] >= k) {
            return e->bounds[1 + i];
        }
    }
    return e->bounds[e->file->n_ks];
}

struct ggml_tensor * ggml_ext_llama_dec_linear(struct ggml_context * ctx, struct ggml_tensor * w,
                                               struct ggml_tensor * cur, struct ggml_tensor * result) {
    if (dec_count == 0 || w == NULL) {
        return result;
    }
    // one token (decode); prefill (a ubatch of several tokens) runs the base alone, also in its last layer
    // where llama.cpp keeps only the rows of the outputs (one, for the last token's logits)
    if (dec_graph_n_tokens > 1 || cur->ne[1] * cur->ne[2] * cur->ne[3] != 1) {
        return result;
    }
    pthread_mutex_lock(&dec_lock);
    const struct dec_entry * p = entry_of(w, 0);
    struct dec_entry         e;
    if (p) {
        e = *p;
    }
    pthread_mutex_unlock(&dec_lock);
    if (p == NULL || e.r == NULL) {
        return result;
    }
    int  k[DEC_NTYPES], ntb[DEC_NTYPES];
    char err[256];
    if (dec_settings(k, ntb, err, sizeof(err)) != 0) {
        GGML_ABORT("ggml-ext: %s", err);  // checked by the tools' arguments; a bad environment variable
    }
    if (k[e.type] == 0) {
        return result;
    }
    if (cur->type != GGML_TYPE_F32 || result->type != GGML_TYPE_F32) {
        return result;  // not a float activation (never in llama.cpp's graphs)
    }
    if (cur->nb[0] != sizeof(float)) {
        cur = ggml_cont(ctx, cur);
    }
    struct ggml_tensor * out = ggml_ext_dec_mul_mat(ctx, result, cur, e.r, e.s, k[e.type], GGML_EXT_QDEC_APPROX, e.bounds[0],
                                                    b15_for(&e, k[e.type]));
    ggml_ext_dec_mul_mat_set_n_tb(out, ntb[e.type]);
    return out;
}
