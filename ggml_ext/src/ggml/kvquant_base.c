// The KVQuant cache types NUQ4 / NUQ3 / NUQ2 in ggml-base (docs/KVQUANT.md "In llama.cpp's cache"):
// ggml's row functions (to_float, from_float_ref: patch 0100's type traits, patch 0110's CPU from_float)
// and the cache tables bound by address.
//
// A block of 64 values is the value row of a one-head, 64-channel kvquant layer with no outlier slots
// (formats/kvquant: 64 B-bit indices, fp16 mid / half, u16 kept / dropped = 0), so the bytes, the
// rounding and the dequantization are ggml_ext_kvq_quantize_v / _dequantize_v's, with the layer's nuqB
// table. to_float / from_float get only a pointer: the table is the one bound to the address range the
// pointer lies in (ggml_ext_kvq_bind, called by the llama glue when a cache is allocated), else uniform
// levels. Readers (the attention and set_rows threads) scan the bindings without a lock; writers take
// one. A binding's layer is never freed while the process runs (a reader may hold it), but identical
// tables share one layer, so re-creating contexts does not grow memory.
#include "formats/kvquant/kvquant.h"
#include "formats/kvquant/nuq_decode.h"
#include "ggml-ext-llama.h"  // ggml_ext_kvq_bind_keys
#include "ggml/families.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVQ_BLOCK 64
#define KVQ_MAX_BINDINGS 1024

struct binding {
    _Atomic(const char *) lo;  // NULL: the slot is free
    _Atomic(const char *) hi;
    _Atomic(const struct ggml_ext_kvq_layer *) layer;
    int   type;
    float levels[16], values[16];
    // a pre-RoPE key cache (ggml_ext_kvq_bind_keys): per-channel scales of rows of row_blocks blocks
    int64_t       row_blocks;  // 0: a value cache
    const float * k_mid, * k_half;
};

static struct binding  bindings[KVQ_MAX_BINDINGS];
static atomic_int      n_bindings;  // slots in use so far (a prefix of the array)
static atomic_uint     generation;  // bumped by every change of the bindings (the readers' caches)
static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;

// The block decoder of to_float (nuq_decode.h): ggml-cpu hands its SIMD one over when it loads
// (ggml/kvquant_cpu.c); the scalar reference until then, or with GGML_EXT_KVQ_DECODE=ref.
static _Atomic(ggml_ext_nuq_decode_fn) decoder = ggml_ext_nuq_block_decode_ref;
static _Atomic(const char *)           decoder_name = "generic";

void ggml_ext_nuq_set_block_decoder(ggml_ext_nuq_decode_fn fn, const char * name) {
    const char * env = getenv("GGML_EXT_KVQ_DECODE");
    if (!fn || (env && !strcmp(env, "ref"))) {
        fn   = ggml_ext_nuq_block_decode_ref;
        name = "generic";
    }
    atomic_store(&decoder_name, name);
    atomic_store(&decoder, fn);
}

const char * ggml_ext_nuq_block_decoder(void) {
    return atomic_load(&decoder_name);
}

static int type_bits(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_KVQUANT ? t->layout : 0;
}

// A one-head, 64-channel value layer with the given table (levels doubles as the unused key table).
static struct ggml_ext_kvq_layer * make_layer(int bits, const float * levels, const float * values, char * err,
                                              size_t n) {
    float k_lo[KVQ_BLOCK], k_hi[KVQ_BLOCK];
    for (int i = 0; i < KVQ_BLOCK; i++) {
        k_lo[i] = -1.0f;
        k_hi[i] = 1.0f;
    }
    const struct ggml_ext_kvq_config c = {
        .bits = bits, .n_kv_heads = 1, .head_dim = KVQ_BLOCK, .k_slots = 0, .v_slots = 0,
        .v_outliers_per_side = 0, .rope_mode = GGML_EXT_KVQ_ROPE_NORM, .rope_n_dims = 0,
        .rope_freq_base = 10000.0f, .rope_freq_scale = 1.0f, .k_lo = k_lo, .k_hi = k_hi,
        .k_levels = levels, .k_values = values, .v_levels = levels, .v_values = values,
    };
    return ggml_ext_kvq_layer_new(&c, err, n);
}

// The uniform layers (2, 3, 4 bits) used outside every binding, made once.
static const struct ggml_ext_kvq_layer * uniform_layers[5];

static void init_uniform(void) {
    for (int bits = 2; bits <= 4; bits++) {
        const int n = 1 << bits;
        float     lv[16];
        for (int i = 0; i < n; i++) {
            lv[i] = -1.0f + 2.0f * (float) i / (float) (n - 1);
        }
        uniform_layers[bits] = make_layer(bits, lv, lv, NULL, 0);
    }
}

// The binding of the memory p lies in (NULL: none), and the layer to use (uniform levels outside bindings).
// The attention calls to_float once per head and cell: the binding the thread's previous call found
// is kept with its range, type and layer, valid while no binding changed since (one relaxed load of
// the generation and a range check per call, no scan).
struct last_hit {
    unsigned                          gen;  // generation + 1 when found (0: nothing kept)
    const char *                      lo, * hi;
    int                               type;
    const struct binding *            b;
    const struct ggml_ext_kvq_layer * layer;
};

static const struct ggml_ext_kvq_layer * binding_at(const void * p, int type, const struct binding ** bound) {
    static _Thread_local struct last_hit last;
    const char *                         c   = p;
    const unsigned                       gen = atomic_load_explicit(&generation, memory_order_acquire);
    if (last.gen == gen + 1 && c >= last.lo && c < last.hi && last.type == type) {
        *bound = last.b;
        return last.layer;
    }
    const int n = atomic_load_explicit(&n_bindings, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        const char * lo = atomic_load_explicit(&bindings[i].lo, memory_order_acquire);
        const char * hi = atomic_load_explicit(&bindings[i].hi, memory_order_relaxed);
        if (lo && c >= lo && c < hi && bindings[i].type == type) {
            const struct ggml_ext_kvq_layer * L = atomic_load_explicit(&bindings[i].layer, memory_order_relaxed);
            last   = (struct last_hit) { gen + 1, lo, hi, type, &bindings[i], L };
            *bound = &bindings[i];
            return L;
        }
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_uniform);
    *bound = NULL;
    return uniform_layers[type_bits(type)];
}

static int bind(const void * data, size_t nbytes, int type, const float * levels, const float * values,
                int64_t row_blocks, const float * k_mid, const float * k_half, char * err, size_t en) {
    const int bits = type_bits(type);
    if (!bits) {
        snprintf(err, en, "kvquant: type %d is not a KVQuant cache type", type);
        return -1;
    }
    if (!data || !nbytes) {
        snprintf(err, en, "kvquant: nothing to bind (no memory)");
        return -1;
    }
    const int    n  = 1 << bits;
    const char * lo = data, * hi = lo + nbytes;
    pthread_mutex_lock(&bind_lock);
    const int used = atomic_load(&n_bindings);
    // a layer with this table already (a cache made again): share it
    const struct ggml_ext_kvq_layer * L = NULL;
    for (int i = 0; i < used && !L; i++) {
        if (bindings[i].type == type && !memcmp(bindings[i].levels, levels, sizeof(float) * n) &&
            !memcmp(bindings[i].values, values, sizeof(float) * n)) {
            L = atomic_load(&bindings[i].layer);
        }
    }
    if (!L) {
        char why[200] = "";
        L             = make_layer(bits, levels, values, why, sizeof(why));
        if (!L) {
            pthread_mutex_unlock(&bind_lock);
            snprintf(err, en, "kvquant: bad nuq%d table: %s", bits, why);
            return -1;
        }
    }
    // bindings the new memory overlaps belong to freed caches: drop them; then take a free slot
    int slot = -1;
    for (int i = 0; i < used; i++) {
        const char * blo = atomic_load(&bindings[i].lo);
        if (blo && lo < atomic_load(&bindings[i].hi) && blo < hi) {
            atomic_store(&bindings[i].lo, NULL);
        }
        if (slot < 0 && !atomic_load(&bindings[i].lo)) {
            slot = i;
        }
    }
    if (slot < 0) {
        if (used == KVQ_MAX_BINDINGS) {
            pthread_mutex_unlock(&bind_lock);
            snprintf(err, en, "kvquant: more than %d KV cache tensors bound at once", KVQ_MAX_BINDINGS);
            return -1;
        }
        slot = used;
    }
    struct binding * b = &bindings[slot];
    b->type            = type;
    memcpy(b->levels, levels, sizeof(float) * n);
    memcpy(b->values, values, sizeof(float) * n);
    b->row_blocks      = row_blocks;
    b->k_mid           = k_mid;
    b->k_half          = k_half;
    atomic_store(&b->layer, L);
    atomic_store(&b->hi, hi);
    atomic_store(&b->lo, lo);  // published last: readers test lo first
    if (slot == used) {
        atomic_store(&n_bindings, used + 1);
    }
    atomic_fetch_add(&generation, 1);
    pthread_mutex_unlock(&bind_lock);
    return 0;
}

int ggml_ext_kvq_bind(const void * data, size_t nbytes, int type, const float * levels, const float * values,
                      char * err, size_t en) {
    return bind(data, nbytes, type, levels, values, 0, NULL, NULL, err, en);
}

// Per-channel key scales, kept for the process (a reader may hold them, as the layers): identical arrays
// (the same cache made again) are shared, so re-creating contexts does not grow memory.
struct key_scales {
    int64_t n;
    float * mid, * half;
};
static struct key_scales key_scales[KVQ_MAX_BINDINGS];
static int               n_key_scales;

static int keep_key_scales(int64_t n, const float * mid, const float * half, const float ** kmid,
                           const float ** khalf) {
    for (int i = 0; i < n_key_scales; i++) {
        if (key_scales[i].n == n && !memcmp(key_scales[i].mid, mid, sizeof(float) * n) &&
            !memcmp(key_scales[i].half, half, sizeof(float) * n)) {
            *kmid  = key_scales[i].mid;
            *khalf = key_scales[i].half;
            return 0;
        }
    }
    if (n_key_scales == KVQ_MAX_BINDINGS) {
        return -1;
    }
    float * m = malloc(sizeof(float) * n), * h = malloc(sizeof(float) * n);
    if (!m || !h) {
        free(m);
        free(h);
        return -1;
    }
    memcpy(m, mid, sizeof(float) * n);
    memcpy(h, half, sizeof(float) * n);
    key_scales[n_key_scales++] = (struct key_scales) { n, m, h };
    *kmid                      = m;
    *khalf                     = h;
    return 0;
}

int ggml_ext_kvq_bind_keys(const void * data, size_t nbytes, int type, int64_t row_values, const float * levels,
                           const float * values, const float * mid, const float * half, char * err, size_t en) {
    if (row_values <= 0 || row_values % KVQ_BLOCK) {
        snprintf(err, en, "kvquant: key rows of %lld channels (must be a multiple of %d)", (long long) row_values,
                 KVQ_BLOCK);
        return -1;
    }
    for (int64_t c = 0; c < row_values; c++) {
        if (!isfinite(mid[c]) || !isfinite(half[c]) || !(half[c] > 0.0f)) {
            snprintf(err, en, "kvquant: key channel %lld: mid %g, half %g (must be finite, half > 0)", (long long) c,
                     (double) mid[c], (double) half[c]);
            return -1;
        }
    }
    const float * kmid, * khalf;
    pthread_mutex_lock(&bind_lock);
    const int kept = keep_key_scales(row_values, mid, half, &kmid, &khalf);
    pthread_mutex_unlock(&bind_lock);
    if (kept != 0) {
        snprintf(err, en, "kvquant: no room for the key scales");
        return -1;
    }
    return bind(data, nbytes, type, levels, values, row_values / KVQ_BLOCK, kmid, khalf, err, en);
}

int ggml_ext_kvq_unbind(const void * data) {
    int found = -1;
    pthread_mutex_lock(&bind_lock);
    for (int i = 0, used = atomic_load(&n_bindings); i < used; i++) {
        if (data && atomic_load(&bindings[i].lo) == data) {
            atomic_store(&bindings[i].lo, NULL);
            found = 0;
        }
    }
    atomic_fetch_add(&generation, 1);
    pthread_mutex_unlock(&bind_lock);
    return found;
}

int ggml_ext_kv_cache_type_by_name(const char * name) {
    for (int i = 0, n = ggml_ext_type_count(); name && i < n; i++) {
        const struct ggml_ext_type_info * t = ggml_ext_type_info_at(i);
        if (t->family == GGML_EXT_FAMILY_KVQUANT && !strcmp(t->ggml_name, name)) {
            return t->id;
        }
    }
    return -1;
}

// Keys: block i of the cache holds channels (i % row_blocks) * 64 .. + 63 of its row, normalised per channel
// by the calibrated mid / half; the block's own scale fields are the neutral 0 / 1.
static int64_t key_channel0(const struct binding * b, const void * p, size_t block_bytes) {
    const char * lo = atomic_load_explicit(&b->lo, memory_order_relaxed);
    return (int64_t) (((size_t) ((const char *) p - lo) / block_bytes) % (size_t) b->row_blocks) * KVQ_BLOCK;
}

static void key_to_float(const struct binding * b, const struct ggml_ext_kvq_layer * L, const void * x, float * y,
                         int64_t k) {
    const ggml_ext_nuq_decode_fn decode = atomic_load_explicit(&decoder, memory_order_relaxed);
    for (int64_t i = 0, nb = k / KVQ_BLOCK; i < nb;) {
        // blocks to the end of the cache row (or of the call) have consecutive channels
        const uint8_t * blk = (const uint8_t *) x + i * L->v_row_size;
        const int64_t   c0  = key_channel0(b, blk, L->v_row_size);
        int64_t         n   = b->row_blocks - c0 / KVQ_BLOCK;
        n                   = n < nb - i ? n : nb - i;
        decode(L->bits, blk, n, L->v_row_size, L->v_values, b->k_mid + c0, b->k_half + c0, y + i * KVQ_BLOCK);
        i += n;
    }
}

static void key_from_float(const struct binding * b, const struct ggml_ext_kvq_layer * L, const float * x, void * y,
                           int64_t k) {
    const int n = 1 << L->bits;
    for (int64_t i = 0; i < k / KVQ_BLOCK; i++) {
        uint8_t *     blk = (uint8_t *) y + i * L->v_row_size;
        const int64_t c0  = key_channel0(b, blk, L->v_row_size);
        memset(blk, 0, L->v_row_size);
        uint16_t scale[2] = { 0x0000, 0x3c00 };  // fp16 0 and 1
        for (int c = 0; c < KVQ_BLOCK; c++) {
            const float v = x[i * KVQ_BLOCK + c];
            if (!isfinite(v)) {
                scale[0] = 0x7e00;  // a NaN block, as for values
                continue;
            }
            const float xn = (v - b->k_mid[c0 + c]) / b->k_half[c0 + c];
            int         q  = 0;  // the nearest level: past the midpoints below xn (outside [-1, 1]: the end level)
            while (q < n - 1 && L->v_mids[q] < xn) {
                q++;
            }
            ggml_ext_kvq_set(blk, L->bits, KVQ_BLOCK, c, q);
        }
        memcpy(blk + L->dense_bytes, scale, sizeof(scale));
    }
}

// ggml's row functions: k values (a multiple of 64) = k / 64 value rows of the one-head layer
static void to_float(int type, const void * x, float * y, int64_t k) {
    const struct binding *            b;
    const struct ggml_ext_kvq_layer * L = binding_at(x, type, &b);
    if (b && b->row_blocks) {
        key_to_float(b, L, x, y, k);
        return;
    }
    // runs of blocks without outliers through the block decoder; a block that counts some (none are
    // written yet) through the row kernel's dequantization, which applies them
    const ggml_ext_nuq_decode_fn decode = atomic_load_explicit(&decoder, memory_order_relaxed);
    const char *                 row    = x;
    for (int64_t i = 0, nb = k / KVQ_BLOCK; i < nb;) {
        int64_t n = 0;
        while (i + n < nb &&
               !ggml_ext_kvq_n_kept(ggml_ext_kvq_v_sparse(L, (const uint8_t *) row + (i + n) * L->v_row_size))) {
            n++;
        }
        if (n) {
            decode(L->bits, row + i * L->v_row_size, n, L->v_row_size, L->v_values, NULL, NULL, y + i * KVQ_BLOCK);
            i += n;
        } else {
            ggml_ext_kvq_dequantize_v(L, row + i * L->v_row_size, y + i * KVQ_BLOCK);
            i++;
        }
    }
}

static void from_float(int type, const float * x, void * y, int64_t k) {
    const struct binding *            b;
    const struct ggml_ext_kvq_layer * L = binding_at(y, type, &b);
    if (b && b->row_blocks) {
        key_from_float(b, L, x, y, k);
        return;
    }
    for (int64_t i = 0; i < k / KVQ_BLOCK; i++) {
        char * row = (char *) y + i * L->v_row_size;
        if (ggml_ext_kvq_quantize_v(L, x + i * KVQ_BLOCK, row) != 0) {
            // a NaN or infinity: ggml's own types store it as it comes; the block keeps no scale of its
            // own then, so it becomes a NaN block (mid NaN) the attention shows as it would show the input
            memset(row, 0, L->v_row_size);
            const uint16_t nan[2] = { 0x7e00, 0 };
            memcpy(row + L->dense_bytes, nan, sizeof(nan));
        }
    }
}

#define KVQ_ROW_FUNCTIONS(NAME)                                                                          \
    void ggml_ext_to_float_##NAME(const void * restrict x, float * restrict y, int64_t k) {            \
        to_float(GGML_TYPE_EXT_ID_##NAME, x, y, k);                                                     \
    }                                                                                                   \
    void ggml_ext_from_float_ref_##NAME(const float * restrict x, void * restrict y, int64_t k) {      \
        from_float(GGML_TYPE_EXT_ID_##NAME, x, y, k);                                                   \
    }
enum {
#define GGML_EXT_TYPE(NAME, ID, ...) GGML_TYPE_EXT_ID_##NAME = ID,
#include "ggml-ext-types.def"
};
KVQ_ROW_FUNCTIONS(NUQ4)
KVQ_ROW_FUNCTIONS(NUQ3)
KVQ_ROW_FUNCTIONS(NUQ2)

// ggml_quantize_chunk: a KV cache type holds activations appended at run time, not weights
size_t ggml_ext_kvq_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                           int64_t n_per_row, const float * imatrix) {
    (void) src, (void) dst, (void) start, (void) nrows, (void) n_per_row, (void) imatrix;
    fprintf(stderr, "ggml_ext: %s is a KV cache type (-ctk/-ctv), not a weight type\n",
            ggml_ext_type_info_by_id(type)->ggml_name);
    return 0;
}

// a row is valid when every block's mid / half are finite and its outlier counts are 0 (no slots)
bool ggml_ext_kvq_validate_row_data(int type, const void * data, size_t nbytes) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    const size_t dense = (size_t) KVQ_BLOCK * t->layout / 8;
    if (nbytes % (size_t) t->type_size) {
        return false;
    }
    for (size_t off = 0; off < nbytes; off += (size_t) t->type_size) {
        uint16_t h[4];
        memcpy(h, (const char *) data + off + dense, sizeof(h));
        if ((h[0] & 0x7c00) == 0x7c00 || (h[1] & 0x7c00) == 0x7c00 || h[2] || h[3]) {
            fprintf(stderr, "ggml_ext: %s block %zu: non-finite scale or outlier counts\n", t->ggml_name,
                    off / (size_t) t->type_size);
            return false;
        }
    }
    return true;
}
