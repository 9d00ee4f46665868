// The KVQuant cache bindings (backend/kvquant_base.c, ggml-base) as a device backend sees them: the CUDA kernels of
// the NUQ cache types (cuda/kvquant_cuda.cu, ggml-cuda) find a cache tensor's tables by its ADDRESS as the CPU row
// functions do. ggml-base keeps the one list of bindings (a CUDA cache tensor is bound with its device address by
// the same llama-side call, ggml_ext_llama_kv_bind); a device module registers hooks that mirror what it needs in device
// memory (per-channel key scales, the sink rows' marks and floats): told when a binding is made or dropped, when
// the sink marks change (llama.cpp's apply_ubatch, before the graph that writes the rows), and around the state's
// side blob (the sink floats live in device memory for a device cache). docs/KVQUANT.md "The CUDA path".
#pragma once

#include "ggml-ext.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_EXT_KVQUANT_DEV_BLOCK 64

// One binding (or the uniform levels outside every binding: lo == NULL, serial 0), copied out under the lock.
struct ggml_ext_kvquant_binding_desc {
    const char * lo, * hi;       // the bound memory (a device address for a device cache)
    uint64_t     serial;         // unique per bind call (a binding made again at the same address is another)
    int          type, bits;     // NUQ4 / NUQ3 / NUQ2, 4 / 3 / 2
    size_t       block_bytes;    // 40 / 32 / 24
    float        values[16];     // the table's dequantization values (2^bits used)
    float        mids[15];       // the midpoints between levels (the quantizer's thresholds, 2^bits - 1 used)
    int64_t      row_blocks;     // > 0: a pre-RoPE key cache, rows of row_blocks blocks (per-channel scales)
    const float * k_mid, * k_half;  // row_blocks * 64 each (host memory, kept for the process), keys only
    int64_t      row_values;     // values per cache row (0: not known)
    int          outliers;       // 1: in-block outlier slots when quantizing
    int          n_sink;         // positions < n_sink keep their row in float
    int          sink_cap;       // sink slots (rows) the binding has room for
    int          k_block;        // keys: 1 = block-scaled (ggml_ext_kvquant_key_blocks, GGML_EXT_KV_KBLOCK): each block a
                                 // value block of the channel-normalised keys (own fp16 mid / half, one slot)
};

struct ggml_ext_kvquant_device_hooks {
    // a binding was made (for memory the module may not own: it checks); under the bindings' lock
    void (*bound)(const struct ggml_ext_kvquant_binding_desc * d);
    // the binding made with `serial` at lo is gone (unbound, or replaced by an overlapping one)
    void (*unbound)(const void * lo, uint64_t serial);
    // the sink marks changed: slot i holds cache row rows[i] (-1: free), i < hw (no slot past hw is in use)
    void (*sinks_changed)(const void * lo, uint64_t serial, const int64_t * rows, int hw);
    // the state's side blob: slot `slot`'s floats (row_values) out of / into the module's copy
    void (*sink_download)(const void * lo, uint64_t serial, int slot, float * dst);
    void (*sink_upload)(const void * lo, uint64_t serial, int slot, const float * src);
};

// Registers the hooks (NULL: none) and calls `bound` for every binding made so far.
GGML_EXT_API void ggml_ext_kvquant_set_device_hooks(const struct ggml_ext_kvquant_device_hooks * hooks);

// The binding of type `type` holding p, else the uniform levels (lo NULL); false for a type that is not a NUQ one.
GGML_EXT_API bool ggml_ext_kvquant_binding_find(const void * p, int type, struct ggml_ext_kvquant_binding_desc * out);

// The current sink marks of the binding at lo made with serial (rows: room for sink_cap); the number of slots
// in use up to the last one (hw), -1 when no such binding exists.
GGML_EXT_API int ggml_ext_kvquant_binding_sinks(const void * lo, uint64_t serial, int64_t * rows, int cap);

#ifdef __cplusplus
}
#endif
