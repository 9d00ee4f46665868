// The KVQuant cache types NUQ4 / NUQ3 / NUQ2 in ggml-base (docs/KVQUANT.md "In llama.cpp's cache"):
// ggml's row functions (to_float, from_float_ref: patch 0100's type traits, patch 0110's CPU from_float)
// and the cache tables bound by address.
//
// A block of 64 values is the value row of a one-head, 64-channel kvquant layer with no outlier slots
// (formats/kvquant: 64 B-bit indices, fp16 mid / half, u16 kept / dropped = 0), so the bytes, the
// rounding and the dequantization are ggml_ext_kvquant_quantize_v / _dequantize_v's, with the layer's nuqB
// table. to_float / from_float get only a pointer: the table is the one bound to the address range the
// pointer lies in (ggml_ext_kvquant_bind, called from src/llama when a cache is allocated), else uniform
// levels. Readers (the attention and set_rows threads) scan the bindings without a lock; writers take
// one. A binding's layer is never freed while the process runs (a reader may hold it), but identical
// tables share one layer, so re-creating contexts does not grow memory.
#include "formats/kvquant/kvquant.h"
#include "formats/kvquant/kvquant_decode.h"
#include "ggml-ext-kvquant.h"    // outliers and the sink
#include "ggml-ext-llama.h"  // ggml_ext_kvquant_bind_keys
#include "backend/kvquant_device.h"  // the device backends' view of the bindings (CUDA)
#include "common/fp16.h"
#include "common/settings.h"
#include "common/families.h"

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
    _Atomic(const struct ggml_ext_kvquant_layer *) layer;
    int   type;
    float levels[16], values[16];
    // a pre-RoPE key cache (ggml_ext_kvquant_bind_keys): per-channel scales of rows of row_blocks blocks
    int64_t       row_blocks;  // 0: a value cache
    const float * k_mid, * k_half;
    int           k_block;     // keys: 1 = a per-token scale per block over the per-channel one (ggml_ext_kvquant_key_blocks)
    // outliers and the sink (ggml_ext_kvquant_bind_opts; docs/KVQUANT.md "Outliers and the sink")
    int64_t          row_values;  // values per cache row (0: not known, no sink)
    int              outliers;    // 1: in-block outlier slots when quantizing
    int              n_sink;      // positions < n_sink keep their row in float
    struct sink_row * sinks;      // sink_cap entries, row -1 = free
    int              sink_cap;
    int              sink_hw;     // entries past sink_hw were never used
    uint64_t         serial;      // unique per bind call (kvquant_device.h)
};

struct sink_row {
    int64_t row;   // the cache row (byte offset / row bytes), -1: free
    float * data;  // row_values floats
};

static struct binding  bindings[KVQ_MAX_BINDINGS];
static atomic_int      n_bindings;  // slots in use so far (a prefix of the array)
static atomic_uint     generation;  // bumped by every change of the bindings (the readers' caches)
static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t        next_serial = 1;  // under bind_lock
// a device backend's hooks (kvquant_device.h); called under bind_lock
static const struct ggml_ext_kvquant_device_hooks * dev_hooks;

// The block decoder of to_float (kvquant_decode.h): ggml-cpu hands its SIMD one over when it loads
// (backend/kvquant_cpu.c); the scalar reference until then, or with GGML_EXT_KVQ_DECODE=ref.
static _Atomic(ggml_ext_kvquant_decode_fn) decoder = ggml_ext_kvquant_block_decode_ref;
static _Atomic(const char *)           decoder_name = "generic";

void ggml_ext_kvquant_set_block_decoder(ggml_ext_kvquant_decode_fn fn, const char * name) {
    if (!fn || ggml_ext_settings_kvquant_decode_ref()) {
        fn   = ggml_ext_kvquant_block_decode_ref;
        name = "generic";
    }
    atomic_store(&decoder_name, name);
    atomic_store(&decoder, fn);
}

const char * ggml_ext_kvquant_block_decoder(void) {
    return atomic_load(&decoder_name);
}

static int type_bits(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_KVQUANT ? t->layout : 0;
}

// A one-head, 64-channel value layer with the given table (levels doubles as the unused key table).
static struct ggml_ext_kvquant_layer * make_layer(int bits, const float * levels, const float * values, char * err,
                                                  size_t n) {
    float k_lo[KVQ_BLOCK], k_hi[KVQ_BLOCK];
    for (int i = 0; i < KVQ_BLOCK; i++) {
        k_lo[i] = -1.0f;
        k_hi[i] = 1.0f;
    }
    const struct ggml_ext_kvquant_config c = {
        .bits = bits, .n_kv_heads = 1, .head_dim = KVQ_BLOCK, .k_slots = 0, .v_slots = 0,
        .v_outliers_per_side = 0, .rope_mode = GGML_EXT_KVQUANT_ROPE_NORM, .rope_n_dims = 0,
        .rope_freq_base = 10000.0f, .rope_freq_scale = 1.0f, .k_lo = k_lo, .k_hi = k_hi,
        .k_levels = levels, .k_values = values, .v_levels = levels, .v_values = values,
    };
    return ggml_ext_kvquant_layer_new(&c, err, n);
}

// The uniform layers (2, 3, 4 bits) used outside every binding, made once.
static const struct ggml_ext_kvquant_layer * uniform_layers[5];

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
    const struct ggml_ext_kvquant_layer * layer;
};

static const struct ggml_ext_kvquant_layer * binding_at(const void * p, int type, const struct binding ** bound) {
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
            const struct ggml_ext_kvquant_layer * L = atomic_load_explicit(&bindings[i].layer, memory_order_relaxed);
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

// Frees a binding's sink table (under bind_lock; the binding is unpublished or being replaced: no compute
// reads it any more, its cache is gone).
static void drop_sinks(struct binding * b) {
    for (int i = 0; b->sinks && i < b->sink_cap; i++) {
        free(b->sinks[i].data);
    }
    free(b->sinks);
    b->sinks    = NULL;
    b->sink_cap = 0;
    b->sink_hw  = 0;
    b->n_sink   = 0;
}

// a binding (b NULL: the uniform layer L) as kvquant_device.h describes it
static void describe(const struct binding * b, const struct ggml_ext_kvquant_layer * L,
                     struct ggml_ext_kvquant_binding_desc * d) {
    memset(d, 0, sizeof(*d));
    d->bits        = L->bits;
    d->block_bytes = L->v_row_size;
    memcpy(d->values, L->v_values, sizeof(d->values));
    memcpy(d->mids, L->v_mids, sizeof(d->mids));
    if (b) {
        d->lo         = atomic_load(&b->lo);
        d->hi         = atomic_load(&b->hi);
        d->serial     = b->serial;
        d->type       = b->type;
        d->row_blocks = b->row_blocks;
        d->k_mid      = b->k_mid;
        d->k_half     = b->k_half;
        d->row_values = b->row_values;
        d->outliers   = b->outliers;
        d->n_sink     = b->n_sink;
        d->sink_cap   = b->sink_cap;
        d->k_block    = b->row_blocks ? b->k_block : 0;
    }
}

static int bind(const void * data, size_t nbytes, int type, const float * levels, const float * values,
                int64_t row_blocks, const float * k_mid, const float * k_half, int64_t row_values, int outliers,
                int n_sink, char * err, size_t en) {
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
    if (n_sink < 0 || n_sink > GGML_EXT_KVQUANT_MAX_SINK || (n_sink > 0 && row_values <= 0)) {
        snprintf(err, en, "kvquant: attention sink of %d positions (0..%d, with known rows)", n_sink,
                 GGML_EXT_KVQUANT_MAX_SINK);
        return -1;
    }
    // the sink table: room for n_sink rows of 256 sequences (llama.cpp's LLAMA_MAX_SEQ); rows allocated when used
    struct sink_row * sinks = NULL;
    const int         cap   = n_sink * 256;
    if (n_sink > 0) {
        sinks = calloc((size_t) cap, sizeof(*sinks));
        if (!sinks) {
            snprintf(err, en, "kvquant: out of memory");
            return -1;
        }
        for (int i = 0; i < cap; i++) {
            sinks[i].row = -1;
        }
    }
    pthread_mutex_lock(&bind_lock);
    const int used = atomic_load(&n_bindings);
    // a layer with this table already (a cache made again): share it
    const struct ggml_ext_kvquant_layer * L = NULL;
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
            free(sinks);
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
            drop_sinks(&bindings[i]);
            if (dev_hooks) {
                dev_hooks->unbound(blo, bindings[i].serial);
            }
        }
        if (slot < 0 && !atomic_load(&bindings[i].lo)) {
            slot = i;
        }
    }
    if (slot < 0) {
        if (used == KVQ_MAX_BINDINGS) {
            pthread_mutex_unlock(&bind_lock);
            free(sinks);
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
    b->k_block         = 0;
    drop_sinks(b);  // a slot freed by unbind may still hold its old table
    b->row_values      = row_values;
    b->outliers        = outliers;
    b->n_sink          = n_sink;
    b->sinks           = sinks;
    b->sink_cap        = cap;
    b->sink_hw         = 0;
    b->serial          = next_serial++;
    atomic_store(&b->layer, L);
    atomic_store(&b->hi, hi);
    atomic_store(&b->lo, lo);  // published last: readers test lo first
    if (slot == used) {
        atomic_store(&n_bindings, used + 1);
    }
    atomic_fetch_add(&generation, 1);
    if (dev_hooks) {
        struct ggml_ext_kvquant_binding_desc d;
        describe(b, L, &d);
        dev_hooks->bound(&d);
    }
    pthread_mutex_unlock(&bind_lock);
    return 0;
}

int ggml_ext_kvquant_bind(const void * data, size_t nbytes, int type, const float * levels, const float * values,
                          char * err, size_t en) {
    return bind(data, nbytes, type, levels, values, 0, NULL, NULL, 0, 0, 0, err, en);
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

int ggml_ext_kvquant_bind_keys(const void * data, size_t nbytes, int type, int64_t row_values, const float * levels,
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
    return bind(data, nbytes, type, levels, values, row_values / KVQ_BLOCK, kmid, khalf, 0, 0, 0, err, en);
}

int ggml_ext_kvquant_bind_opts(const void * data, size_t nbytes, int type, int64_t row_values, const float * levels,
                               const float * values, const float * k_mid, const float * k_half, int outliers, int n_sink,
                               char * err, size_t en) {
    if (row_values <= 0 || row_values % KVQ_BLOCK) {
        snprintf(err, en, "kvquant: cache rows of %lld values (must be a multiple of %d)", (long long) row_values,
                 KVQ_BLOCK);
        return -1;
    }
    if (!k_mid) {
        return bind(data, nbytes, type, levels, values, 0, NULL, NULL, row_values, outliers != 0, n_sink, err, en);
    }
    for (int64_t c = 0; c < row_values; c++) {
        if (!isfinite(k_mid[c]) || !isfinite(k_half[c]) || !(k_half[c] > 0.0f)) {
            snprintf(err, en, "kvquant: key channel %lld: mid %g, half %g (must be finite, half > 0)", (long long) c,
                     (double) k_mid[c], (double) k_half[c]);
            return -1;
        }
    }
    const float * kmid, * khalf;
    pthread_mutex_lock(&bind_lock);
    const int kept = keep_key_scales(row_values, k_mid, k_half, &kmid, &khalf);
    pthread_mutex_unlock(&bind_lock);
    if (kept != 0) {
        snprintf(err, en, "kvquant: no room for the key scales");
        return -1;
    }
    return bind(data, nbytes, type, levels, values, row_values / KVQ_BLOCK, kmid, khalf, row_values, outliers != 0,
                n_sink, err, en);
}

// Keys with a per-token scale per 64-channel block over the calibrated per-channel one (GGML_EXT_KV_KBLOCK;
// docs/KVQUANT.md "Block tables and rotation"): the key binding at data writes and reads its blocks as value
// blocks of the channel-normalised keys (fp16 mid / half of the block, one outlier slot holding the raw key).
// Declared by its one caller (llama/kvquant_cache.c), so the ggml sources that include ggml-ext.h need no rebuild.
// -1: no key binding starts at data.
GGML_EXT_API int ggml_ext_kvquant_key_blocks(const void * data, int on);
int ggml_ext_kvquant_key_blocks(const void * data, int on) {
    int found = -1;
    pthread_mutex_lock(&bind_lock);
    for (int i = 0, used = atomic_load(&n_bindings); i < used; i++) {
        if (data && atomic_load(&bindings[i].lo) == data && bindings[i].row_blocks) {
            bindings[i].k_block = on != 0;
            found               = 0;
        }
    }
    atomic_fetch_add(&generation, 1);
    pthread_mutex_unlock(&bind_lock);
    return found;
}

int ggml_ext_kvquant_unbind(const void * data) {
    int found = -1;
    pthread_mutex_lock(&bind_lock);
    for (int i = 0, used = atomic_load(&n_bindings); i < used; i++) {
        if (data && atomic_load(&bindings[i].lo) == data) {
            atomic_store(&bindings[i].lo, NULL);
            drop_sinks(&bindings[i]);
            found = 0;
            if (dev_hooks) {
                dev_hooks->unbound(data, bindings[i].serial);
            }
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

// A block's trailer (8 bytes after the 64 indices), as u16 words w[0..3]:
//   values: fp16 mid, fp16 half, then one outlier slot: w[2] = 0x8000 | channel (0: no slot), w[3] = its fp16 value;
//   keys:   two outlier slots (w[0], w[1]) and (w[2], w[3]) of the same form (no scale: it is per channel).
// A key block without outliers keeps the neutral fp16 0 / 1 of the first slot's words, and a block written before
// outliers existed (counts 0 / 0) reads as one without slots.
#define KVQ_TAG(c)   ((uint16_t) (0x8000u | (unsigned) (c)))
#define KVQ_IS_TAG(w) (((w) & 0xffc0u) == 0x8000u)

static int nearest_level(const float * mids, int n, float xn) {
    int q = 0;  // past the midpoints below xn (outside [-1, 1]: the end level); a tie goes to the lower level
    while (q < n - 1 && mids[q] < xn) {
        q++;
    }
    return q;
}

// The sink row holding the block at p (NULL: none); *off = the block's first value within the row.
static float * sink_at(const struct binding * b, const void * p, size_t block_bytes, int64_t * off) {
    if (!b || !b->n_sink) {
        return NULL;
    }
    const char *  lo        = atomic_load_explicit(&b->lo, memory_order_relaxed);
    const size_t  row_bytes = (size_t) (b->row_values / KVQ_BLOCK) * block_bytes;
    const size_t  o         = (size_t) ((const char *) p - lo);
    const int64_t row       = (int64_t) (o / row_bytes);
    for (int i = 0; i < b->sink_hw; i++) {
        if (b->sinks[i].row == row) {
            *off = (int64_t) ((o % row_bytes) / block_bytes) * KVQ_BLOCK;
            return b->sinks[i].data;
        }
    }
    return NULL;
}

// Keys: block i of the cache holds channels (i % row_blocks) * 64 .. + 63 of its row, normalised per channel
// by the calibrated mid / half; outliers (beyond mid +- half) in the trailer's slots.
static int64_t key_channel0(const struct binding * b, const void * p, size_t block_bytes) {
    const char * lo = atomic_load_explicit(&b->lo, memory_order_relaxed);
    return (int64_t) (((size_t) ((const char *) p - lo) / block_bytes) % (size_t) b->row_blocks) * KVQ_BLOCK;
}

static void key_to_float(const struct binding * b, const struct ggml_ext_kvquant_layer * L, const void * x, float * y,
                         int64_t k) {
    const ggml_ext_kvquant_decode_fn decode = atomic_load_explicit(&decoder, memory_order_relaxed);
    for (int64_t i = 0, nb = k / KVQ_BLOCK; i < nb;) {
        // blocks to the end of the cache row (or of the call) have consecutive channels
        const uint8_t * blk = (const uint8_t *) x + i * L->v_row_size;
        int64_t         off;
        const float *   sink = sink_at(b, blk, L->v_row_size, &off);
        if (sink) {  // a sink row is a whole cache row: its float copy
            memcpy(y + i * KVQ_BLOCK, sink + off, sizeof(float) * KVQ_BLOCK);
            i++;
            continue;
        }
        // the dense part of the run through the block decoder, then each block's outlier slots over it
        const int64_t c0 = key_channel0(b, blk, L->v_row_size);
        int64_t       n  = b->row_blocks - c0 / KVQ_BLOCK;
        n                = n < nb - i ? n : nb - i;
        if (b->k_block) {
            // per-token block scale first (the value blocks' trailer), then the channel's calibrated one:
            // (val[q] * half_t + mid_t) * half_c + mid_c. The first part depends on the index alone, so each block
            // decodes as a per-channel key block with its own 2^B-entry table val[q] * half_t + mid_t (the same
            // roundings, product before sum: the same bits as the two passes, at the per-channel decode's speed)
            for (int64_t j = 0; j < n; j++) {
                const uint8_t * bj = blk + j * L->v_row_size;
                uint16_t        w[2];
                memcpy(w, bj + L->dense_bytes, sizeof(w));
                const float mid_t = ggml_ext_fp16_to_fp32(w[0]), half_t = ggml_ext_fp16_to_fp32(w[1]);
                float       table[16] = { 0 };
                for (int q = 0; q < (1 << L->bits); q++) {
                    const float p = L->v_values[q] * half_t;
                    table[q]      = p + mid_t;
                }
                decode(L->bits, bj, 1, L->v_row_size, table, b->k_mid + c0 + j * KVQ_BLOCK,
                       b->k_half + c0 + j * KVQ_BLOCK, y + (i + j) * KVQ_BLOCK);
            }
        } else {
            decode(L->bits, blk, n, L->v_row_size, L->v_values, b->k_mid + c0, b->k_half + c0, y + i * KVQ_BLOCK);
        }
        for (int64_t j = 0; j < n; j++) {
            uint16_t w[4];
            memcpy(w, blk + j * L->v_row_size + L->dense_bytes, sizeof(w));
            for (int s = b->k_block ? 1 : 0; s < 2; s++) {  // a scaled key block has one slot (words 2, 3)
                if (KVQ_IS_TAG(w[2 * s])) {
                    y[(i + j) * KVQ_BLOCK + (w[2 * s] & 63)] = ggml_ext_fp16_to_fp32(w[2 * s + 1]);
                }
            }
        }
        i += n;
    }
}

static int value_block_with_slot(const struct ggml_ext_kvquant_layer * L, const float * x, uint8_t * blk);

// A scaled key block (ggml_ext_kvquant_key_blocks): the channels normalised by their calibrated mid / half, then
// written as a value block (per-token mid / half of the block, with outliers one slot: written as the block's
// normalised value, stored back as the raw key). -1 for a NaN or infinity.
static int key_block_scaled(const struct binding * b, const struct ggml_ext_kvquant_layer * L, const float * x,
                            int64_t c0, uint8_t * blk) {
    float xn[KVQ_BLOCK];
    for (int c = 0; c < KVQ_BLOCK; c++) {
        xn[c] = (x[c] - b->k_mid[c0 + c]) / b->k_half[c0 + c];
    }
    const int rc = b->outliers ? value_block_with_slot(L, xn, blk) : ggml_ext_kvquant_quantize_v(L, xn, (char *) blk);
    uint16_t  w[4];
    memcpy(w, blk + L->dense_bytes, sizeof(w));
    if (rc == 0 && KVQ_IS_TAG(w[2])) {
        w[3] = ggml_ext_fp32_to_fp16(x[w[2] & 63]);
        memcpy(blk + L->dense_bytes, w, sizeof(w));
    }
    return rc;
}

static void key_from_float(const struct binding * b, const struct ggml_ext_kvquant_layer * L, const float * x, void * y,
                           int64_t k) {
    const int n = 1 << L->bits;
    if (b->k_block) {
        for (int64_t i = 0; i < k / KVQ_BLOCK; i++) {
            uint8_t * blk = (uint8_t *) y + i * L->v_row_size;
            if (key_block_scaled(b, L, x + i * KVQ_BLOCK, key_channel0(b, blk, L->v_row_size), blk) != 0) {
                memset(blk, 0, L->v_row_size);
                const uint16_t nan[2] = { 0x7e00, 0 };  // a NaN block, as for values
                memcpy(blk + L->dense_bytes, nan, sizeof(nan));
            }
        }
        return;
    }
    for (int64_t i = 0; i < k / KVQ_BLOCK; i++) {
        uint8_t *     blk = (uint8_t *) y + i * L->v_row_size;
        const int64_t c0  = key_channel0(b, blk, L->v_row_size);
        memset(blk, 0, L->v_row_size);
        uint16_t w[4]   = { 0x0000, 0x3c00, 0, 0 };  // fp16 0 and 1, no slots
        int      out[2] = { -1, -1 };                 // the two largest excesses beyond the thresholds
        float    ex[2]  = { 0.0f, 0.0f };
        bool     nan    = false;
        for (int c = 0; c < KVQ_BLOCK; c++) {
            const float v = x[i * KVQ_BLOCK + c];
            if (!isfinite(v)) {
                nan = true;  // a NaN block, as for values
                continue;
            }
            const float xn = (v - b->k_mid[c0 + c]) / b->k_half[c0 + c];
            ggml_ext_kvquant_set(blk, L->bits, KVQ_BLOCK, c, nearest_level(L->v_mids, n, xn));
            const float e = fabsf(xn) - 1.0f;
            if (b->outliers && e > 0.0f) {  // ties keep the lower channel (the one found first)
                if (e > ex[0]) {
                    out[1] = out[0], ex[1] = ex[0];
                    out[0] = c, ex[0] = e;
                } else if (e > ex[1]) {
                    out[1] = c, ex[1] = e;
                }
            }
        }
        if (nan) {
            w[0] = 0x7e00, w[1] = 0x3c00;
        } else {
            // slots in ascending channel order
            const int first = out[1] >= 0 && out[1] < out[0] ? 1 : 0;
            for (int s = 0, j = first; s < 2; s++, j = 1 - j) {
                if (out[j] >= 0) {
                    w[2 * s]     = KVQ_TAG(out[j]);
                    w[2 * s + 1] = ggml_ext_fp32_to_fp16(x[i * KVQ_BLOCK + out[j]]);
                }
            }
            if (out[0] < 0 && out[1] < 0) {
                w[0] = 0x0000, w[1] = 0x3c00;
            }
        }
        memcpy(blk + L->dense_bytes, w, sizeof(w));
    }
}

// Values with one outlier slot: the block's minimum or maximum, whichever leaves the narrower range, goes to the
// slot; mid / half come from the other 63 values. -1 for a NaN or infinity (nothing written).
static int value_block_with_slot(const struct ggml_ext_kvquant_layer * L, const float * x, uint8_t * blk) {
    int imin = 0, imax = 0;
    for (int c = 0; c < KVQ_BLOCK; c++) {
        if (!isfinite(x[c])) {
            return -1;
        }
        imin = x[c] < x[imin] ? c : imin;
        imax = x[c] > x[imax] ? c : imax;
    }
    float min2 = INFINITY, max2 = -INFINITY;  // the extremes without imin / without imax
    for (int c = 0; c < KVQ_BLOCK; c++) {
        if (c != imin) {
            min2 = fminf(min2, x[c]);
        }
        if (c != imax) {
            max2 = fmaxf(max2, x[c]);
        }
    }
    const bool  drop_max = x[imax] - max2 >= min2 - x[imin];
    const int   slot     = drop_max ? imax : imin;
    float       lo = INFINITY, hi = -INFINITY;
    for (int c = 0; c < KVQ_BLOCK; c++) {
        if (c != slot) {
            lo = fminf(lo, x[c]);
            hi = fmaxf(hi, x[c]);
        }
    }
    const float mid  = (hi + lo) / 2;
    const float half = fmaxf((hi - lo) / 2, 1e-8f);
    const int   n    = 1 << L->bits;
    memset(blk, 0, L->v_row_size);
    for (int c = 0; c < KVQ_BLOCK; c++) {
        ggml_ext_kvquant_set(blk, L->bits, KVQ_BLOCK, c, nearest_level(L->v_mids, n, (x[c] - mid) / half));
    }
    const uint16_t w[4] = { ggml_ext_fp32_to_fp16(mid), ggml_ext_fp32_to_fp16(half), KVQ_TAG(slot),
                            ggml_ext_fp32_to_fp16(x[slot]) };
    memcpy(blk + L->dense_bytes, w, sizeof(w));
    return 0;
}

// ggml's row functions: k values (a multiple of 64) = k / 64 value rows of the one-head layer
static void to_float(int type, const void * x, float * y, int64_t k) {
    const struct binding *            b;
    const struct ggml_ext_kvquant_layer * L = binding_at(x, type, &b);
    if (b && b->row_blocks) {
        key_to_float(b, L, x, y, k);
        return;
    }
    // runs of blocks outside sink rows through the block decoder (mid / half from each block), then each
    // block's outlier slot over it; a sink row's blocks from its float copy
    const ggml_ext_kvquant_decode_fn decode = atomic_load_explicit(&decoder, memory_order_relaxed);
    for (int64_t i = 0, nb = k / KVQ_BLOCK; i < nb;) {
        const uint8_t * blk = (const uint8_t *) x + i * L->v_row_size;
        int64_t         off;
        const float *   sink = sink_at(b, blk, L->v_row_size, &off);
        if (sink) {
            memcpy(y + i * KVQ_BLOCK, sink + off, sizeof(float) * KVQ_BLOCK);
            i++;
            continue;
        }
        int64_t n = 1;
        while (i + n < nb && !sink_at(b, blk + n * L->v_row_size, L->v_row_size, &off)) {
            n++;
        }
        decode(L->bits, blk, n, L->v_row_size, L->v_values, NULL, NULL, y + i * KVQ_BLOCK);
        for (int64_t j = 0; j < n; j++) {
            uint16_t w[4];
            memcpy(w, blk + j * L->v_row_size + L->dense_bytes, sizeof(w));
            if (KVQ_IS_TAG(w[2])) {
                y[(i + j) * KVQ_BLOCK + (w[2] & 63)] = ggml_ext_fp16_to_fp32(w[3]);
            }
        }
        i += n;
    }
}

// a sink row keeps the floats too (the blocks are written as well: the bytes stay valid rows)
static void keep_sink(const struct binding * b, const float * x, const void * y, size_t block_bytes, int64_t k) {
    for (int64_t i = 0; b && b->n_sink && i < k / KVQ_BLOCK; i++) {
        int64_t off;
        float * sink = sink_at(b, (const char *) y + i * block_bytes, block_bytes, &off);
        if (sink) {
            memcpy(sink + off, x + i * KVQ_BLOCK, sizeof(float) * KVQ_BLOCK);
        }
    }
}

static void from_float(int type, const float * x, void * y, int64_t k) {
    const struct binding *            b;
    const struct ggml_ext_kvquant_layer * L = binding_at(y, type, &b);
    keep_sink(b, x, y, L->v_row_size, k);
    if (b && b->row_blocks) {
        key_from_float(b, L, x, y, k);
        return;
    }
    for (int64_t i = 0; i < k / KVQ_BLOCK; i++) {
        char *    row = (char *) y + i * L->v_row_size;
        const int rc  = b && b->outliers ? value_block_with_slot(L, x + i * KVQ_BLOCK, (uint8_t *) row)
                                         : ggml_ext_kvquant_quantize_v(L, x + i * KVQ_BLOCK, row);
        if (rc != 0) {
            // a NaN or infinity: ggml's own types store it as it comes; the block keeps no scale of its
            // own then, so it becomes a NaN block (mid NaN) the attention shows as it would show the input
            memset(row, 0, L->v_row_size);
            const uint16_t nan[2] = { 0x7e00, 0 };
            memcpy(row + L->dense_bytes, nan, sizeof(nan));
        }
    }
}

// ---- the sink's marks and the state's side blob (ggml-ext-kvquant.h) ----

bool ggml_ext_kvquant_is_cache_type(int type) {
    return type_bits(type) != 0;
}

// the binding whose memory holds p (any type), under bind_lock
static struct binding * binding_of(const void * p) {
    const char * c = p;
    for (int i = 0, used = atomic_load(&n_bindings); i < used; i++) {
        const char * lo = atomic_load(&bindings[i].lo);
        if (lo && c >= lo && c < atomic_load(&bindings[i].hi)) {
            return &bindings[i];
        }
    }
    return NULL;
}

static int64_t row_of(const struct binding * b, const void * p) {
    const size_t bb = (size_t) ggml_ext_type_info_by_id(b->type)->type_size;
    return (int64_t) ((size_t) ((const char *) p - atomic_load(&b->lo)) / ((size_t) (b->row_values / KVQ_BLOCK) * bb));
}

// marks row as a sink (its data slot allocated) or not; -1: no room / memory. *changed |= 1 when the marks changed.
static int mark_row(struct binding * b, int64_t row, bool sink, bool * changed) {
    int free_i = -1;
    for (int i = 0; i < b->sink_cap; i++) {
        if (b->sinks[i].row == row) {
            if (!sink) {
                b->sinks[i].row = -1;
                *changed        = true;
            }
            return 0;
        }
        if (free_i < 0 && b->sinks[i].row < 0) {
            free_i = i;
        }
    }
    if (!sink) {
        return 0;
    }
    if (free_i < 0) {
        return -1;
    }
    if (!b->sinks[free_i].data) {
        b->sinks[free_i].data = calloc((size_t) b->row_values, sizeof(float));
        if (!b->sinks[free_i].data) {
            return -1;
        }
    }
    b->sinks[free_i].row = row;
    b->sink_hw           = free_i + 1 > b->sink_hw ? free_i + 1 : b->sink_hw;
    *changed             = true;
    return 0;
}

// tells a device backend the binding's sink marks (under bind_lock)
static void sinks_changed(const struct binding * b) {
    if (!dev_hooks || !b->sink_cap) {
        return;
    }
    int64_t rows[GGML_EXT_KVQUANT_MAX_SINK * 256];
    for (int i = 0; i < b->sink_hw; i++) {
        rows[i] = b->sinks[i].row;
    }
    dev_hooks->sinks_changed(atomic_load(&b->lo), b->serial, rows, b->sink_hw);
}

void ggml_ext_kvquant_rows_written(const void * data, size_t row_stride, const uint32_t * cells, const int32_t * pos,
                                   uint32_t n) {
    if (!data || !n) {
        return;
    }
    pthread_mutex_lock(&bind_lock);
    struct binding * b = binding_of(data);
    if (b && b->n_sink) {
        bool changed = false;
        for (uint32_t i = 0; i < n; i++) {
            const char * p = (const char *) data + (size_t) cells[i] * row_stride;
            if (mark_row(b, row_of(b, p), pos[i] >= 0 && pos[i] < b->n_sink, &changed) != 0) {
                // more sink rows than room: the row stays quantized (a quality, not a correctness matter)
                fprintf(stderr, "ggml_ext: KVQuant sink: no room for another sink row; row kept quantized\n");
            }
        }
        if (changed) {
            sinks_changed(b);
        }
    }
    pthread_mutex_unlock(&bind_lock);
}

size_t ggml_ext_kvquant_side_get(const void * data, size_t row_stride, const uint32_t * cells, uint32_t n, void * buf,
                                 size_t cap) {
    pthread_mutex_lock(&bind_lock);
    struct binding * b    = data ? binding_of(data) : NULL;
    const uint32_t   rv   = b ? (uint32_t) b->row_values : 0;
    uint32_t         rows = 0;
    size_t           need = 8;
    for (uint32_t pass = 0; pass < 2; pass++) {
        uint8_t * out = buf;
        if (pass == 1) {
            if (!buf || cap < need) {
                break;
            }
            memcpy(out, &rows, 4);
            memcpy(out + 4, &rv, 4);
            out += 8;
        }
        for (uint32_t i = 0; b && b->n_sink && i < n; i++) {
            const int64_t row = row_of(b, (const char *) data + (size_t) cells[i] * row_stride);
            for (int j = 0; j < b->sink_cap; j++) {
                if (b->sinks[j].row == row) {
                    if (pass == 0) {
                        rows++;
                        need += 4 + sizeof(float) * rv;
                    } else {
                        if (dev_hooks) {  // a device cache's sink floats live in device memory
                            dev_hooks->sink_download(atomic_load(&b->lo), b->serial, j, b->sinks[j].data);
                        }
                        memcpy(out, &i, 4);
                        memcpy(out + 4, b->sinks[j].data, sizeof(float) * rv);
                        out += 4 + sizeof(float) * rv;
                    }
                    break;
                }
            }
        }
    }
    pthread_mutex_unlock(&bind_lock);
    return need;
}

int ggml_ext_kvquant_side_set(const void * data, size_t row_stride, const uint32_t * cells, uint32_t n, const void * buf,
                              size_t size) {
    uint32_t rows, rv;
    if (!buf || size < 8) {
        return -1;
    }
    memcpy(&rows, buf, 4);
    memcpy(&rv, (const char *) buf + 4, 4);
    if (rows > n || (rows && (rv == 0 || size != 8 + (size_t) rows * (4 + sizeof(float) * (size_t) rv))) ||
        (!rows && size != 8)) {
        fprintf(stderr, "ggml_ext: KVQuant state: malformed side data (%u rows of %u values in %zu bytes)\n", rows,
                rv, size);
        return -1;
    }
    pthread_mutex_lock(&bind_lock);
    struct binding * b  = data ? binding_of(data) : NULL;
    int              rc = 0;
    if (b && b->n_sink) {
        if (rows && rv != (uint32_t) b->row_values) {
            fprintf(stderr, "ggml_ext: KVQuant state: sink rows of %u values, the cache has %lld\n", rv,
                    (long long) b->row_values);
            rc = -1;
            goto done;
        }
        bool changed = false;
        for (uint32_t i = 0; i < n; i++) {  // the destination cells lose their marks, then get the blob's
            mark_row(b, row_of(b, (const char *) data + (size_t) cells[i] * row_stride), false, &changed);
        }
        const uint8_t * in = (const uint8_t *) buf + 8;
        for (uint32_t r = 0; r < rows; r++, in += 4 + sizeof(float) * rv) {
            uint32_t i;
            memcpy(&i, in, 4);
            if (i >= n) {
                fprintf(stderr, "ggml_ext: KVQuant state: sink row for cell %u of %u\n", i, n);
                rc = -1;
                goto done;
            }
            const int64_t row = row_of(b, (const char *) data + (size_t) cells[i] * row_stride);
            if (mark_row(b, row, true, &changed) != 0) {
                rc = -1;
                goto done;
            }
            for (int j = 0; j < b->sink_cap; j++) {
                if (b->sinks[j].row == row) {
                    memcpy(b->sinks[j].data, in + 4, sizeof(float) * rv);
                    if (dev_hooks) {
                        dev_hooks->sink_upload(atomic_load(&b->lo), b->serial, j, b->sinks[j].data);
                    }
                    break;
                }
            }
        }
    }
    // a cache without a sink restores the rows' blocks alone (the sink floats are dropped)
done:
    if (b && b->n_sink) {
        sinks_changed(b);
    }
    pthread_mutex_unlock(&bind_lock);
    return rc;
}

// ---- the device backends' view (kvquant_device.h) ----

void ggml_ext_kvquant_set_device_hooks(const struct ggml_ext_kvquant_device_hooks * hooks) {
    pthread_mutex_lock(&bind_lock);
    dev_hooks = hooks;
    for (int i = 0, used = atomic_load(&n_bindings); hooks && i < used; i++) {
        if (atomic_load(&bindings[i].lo)) {
            struct ggml_ext_kvquant_binding_desc d;
            describe(&bindings[i], atomic_load(&bindings[i].layer), &d);
            hooks->bound(&d);
            sinks_changed(&bindings[i]);
        }
    }
    pthread_mutex_unlock(&bind_lock);
}

bool ggml_ext_kvquant_binding_find(const void * p, int type, struct ggml_ext_kvquant_binding_desc * out) {
    if (!type_bits(type)) {
        return false;
    }
    pthread_mutex_lock(&bind_lock);  // the binding's fields are read whole (a bind may be replacing it)
    const struct binding *            b;
    const struct ggml_ext_kvquant_layer * L = binding_at(p, type, &b);
    describe(b, L, out);
    out->type = type;
    pthread_mutex_unlock(&bind_lock);
    return true;
}

int ggml_ext_kvquant_binding_sinks(const void * lo, uint64_t serial, int64_t * rows, int cap) {
    int hw = -1;
    pthread_mutex_lock(&bind_lock);
    for (int i = 0, used = atomic_load(&n_bindings); i < used; i++) {
        if (atomic_load(&bindings[i].lo) == lo && bindings[i].serial == serial) {
            hw = bindings[i].sink_hw < cap ? bindings[i].sink_hw : cap;
            for (int j = 0; j < hw; j++) {
                rows[j] = bindings[i].sinks[j].row;
            }
            break;
        }
    }
    pthread_mutex_unlock(&bind_lock);
    return hw;
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
size_t ggml_ext_kvquant_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                               int64_t n_per_row, const float * imatrix) {
    (void) src, (void) dst, (void) start, (void) nrows, (void) n_per_row, (void) imatrix;
    fprintf(stderr, "ggml_ext: %s is a KV cache type (-ctk/-ctv), not a weight type\n",
            ggml_ext_type_info_by_id(type)->ggml_name);
    return 0;
}

// a row is valid when every block's first two words (value mid / half, or a key's first slot) are finite and its
// last two are 0 / 0 (no slot) or an outlier slot (0x8000 | channel < 64, a finite fp16 value)
bool ggml_ext_kvquant_validate_row_data(int type, const void * data, size_t nbytes) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    const size_t dense = (size_t) KVQ_BLOCK * t->layout / 8;
    if (nbytes % (size_t) t->type_size) {
        return false;
    }
    for (size_t off = 0; off < nbytes; off += (size_t) t->type_size) {
        uint16_t h[4];
        memcpy(h, (const char *) data + off + dense, sizeof(h));
        const bool slot_ok = (!h[2] && !h[3]) || (KVQ_IS_TAG(h[2]) && (h[3] & 0x7c00) != 0x7c00);
        if ((h[0] & 0x7c00) == 0x7c00 || (h[1] & 0x7c00) == 0x7c00 || !slot_ok) {
            fprintf(stderr, "ggml_ext: %s block %zu: non-finite scale or bad outlier slot\n", t->ggml_name,
                    off / (size_t) t->type_size);
            return false;
        }
    }
    return true;
}
