// ggml-ext's hooks in llama.cpp's graph and KV cache (patch 0300), compiled into libllama:
// ggml_ext/src/llama. Both default to changing nothing; ggml-ext's formats add their rules in src/llama,
// and a program (or a test) may register a callback that sees every call.
#pragma once

#include "ggml-ext.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_context;
struct ggml_tensor;
struct gguf_context;

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

// ---- KVQuant cache types (NUQ4 / NUQ3 / NUQ2; patch 0320; docs/KVQUANT.md "In llama.cpp's cache") ----

// Called for every K / V tensor a llama_kv_cache allocates (its name "cache_<tag>k_l<il>" / "..v_l<il>"
// says which), after allocation (t->data NULL: nothing allocated, the calibration is checked only). For a
// KVQuant type it loads layer il's nuqB table from the KV calibration (ggml_ext_llama_kv_calib) and binds
// the tensor's memory to it (ggml_ext_kvquant_bind). 0, or -1 with err saying why (no calibration given, not
// a KVQuant calibration, another model's shape, no nuqB tables); keys are bound with their per-channel
// scales (ggml_ext_kvquant_bind_keys); llama.cpp
// throws it, so context creation fails with that message.
GGML_EXT_API int ggml_ext_llama_kv_bind(struct ggml_tensor * t, uint32_t n_layer, char * err, size_t n);

// The llama_kv_cache is being destroyed: forget its bindings (t: each of its K / V tensors).
GGML_EXT_API void ggml_ext_llama_kv_unbind(struct ggml_tensor * t);

// Whether upstream's Hadamard rotation of a quantized K / V cache applies to `type`: not to ggml-ext's
// KVQuant types (their tables are calibrated on the unrotated activations).
GGML_EXT_API bool ggml_ext_llama_kv_rotate(int type);

// ---- pre-RoPE keys (KVQuant K cache; patch 0322) ----

// ggml_ext_kvquant_bind (ggml-ext.h) for a pre-RoPE key cache: defined in ggml-base beside it, declared here
// (its one caller is src/llama) so that ggml.c and the other ggml sources that include ggml-ext.h need no
// rebuild for it.
// Keys per channel: rows of row_values channels (a multiple
// of 64) lie back to back in [data, data + nbytes); channel c of every row is normalised with the
// calibrated mid[c] / half[c] (row_values each: (k_hi + k_lo) / 2 and (k_hi - k_lo) / 2 in the cache's
// channel order), rounded to `levels` and read back as values[i] * half[c] + mid[c]. The blocks keep the
// value blocks' bytes (indices in channel order; their own mid / half fp16 0 / 1, counts 0).
GGML_EXT_API int ggml_ext_kvquant_bind_keys(const void * data, size_t nbytes, int type, int64_t row_values,
                                            const float * levels, const float * values, const float * mid,
                                            const float * half, char * err, size_t n);

// Whether a K cache of `type` holds keys before RoPE (the KVQuant types): build_attn then stores the K its
// model had before RoPE and ropes the dequantized cache at attention, with the positions of the cells.
GGML_EXT_API bool ggml_ext_llama_kv_pre_rope(int type);

// The K tensor that build_attn got (the output of the model's ggml_rope_ext of K) before RoPE: its source,
// or, when that source is the model's K norm (rms_norm(k) * w: Qwen3, Gemma-3), the K before the norm (where
// `ggml-ext calibrate kv` measures the keys).
// Aborts with a message when K was not roped by ggml_rope_ext in normal or NEOX mode right before build_attn
// (an architecture whose K the pre-RoPE cache cannot take yet).
GGML_EXT_API struct ggml_tensor * ggml_ext_llama_k_unroped(struct ggml_tensor * k_roped);

// The cache's pre-RoPE key view k (get_k: [head_dim, n_head_kv, n_kv, n_stream] of a KVQuant type)
// dequantized to F32, normed by the model's K norm if it has one, and roped as k_roped was (its mode,
// dimensions, frequencies and factors), each cell at its position k_pos (I32, n_kv * n_stream:
// llama_kv_cache::set_input_k_pos). Same shape as k.
GGML_EXT_API struct ggml_tensor * ggml_ext_llama_k_rope(struct ggml_context * ctx, struct ggml_tensor * k,
                                                        const struct ggml_tensor * k_roped, struct ggml_tensor * k_pos);

// The KV calibration file (`ggml-ext calibrate kv ... -o FILE`, a GGUF) the KVQuant cache types read:
// set here (llama tools: --kv-calib FILE), else the environment's GGML_EXT_KV_CALIB. set: NULL goes back
// to the environment; returns 0. get: NULL when none is given.
GGML_EXT_API int          ggml_ext_llama_set_kv_calib(const char * path);
GGML_EXT_API const char * ggml_ext_llama_kv_calib(void);

// ---- file types: what llama.cpp calls a file mostly of one of ggml-ext's types (patch 0301) ----

// The name of the llama_ftype value ftype (general.file_type) when it is one of ggml-ext's, NULL when
// not: 33-35 are Q4_0_4_4/4_8/8_8 (the 2024 values, what `ggml-ext convert` and `repack` write).
// guessed: the loader guessed the type from the tensors; the name then starts "(guessed) ", as
// llama_ftype_name's own names do. Static strings.
GGML_EXT_API const char * ggml_ext_llama_ftype_name(int ftype, bool guessed);

// The llama_ftype value of a file whose most common tensor type is `type`, when that is one of
// ggml-ext's types (interleaved Q4_0: 33-35; interleaved IQ4_NL: 25, MOSTLY_IQ4_NL, for it never had its
// own); -1 for any other type.
GGML_EXT_API int ggml_ext_llama_ftype_of_type(int type);

// ---- weights of a cache-only type (patch 0321) ----

// The model loader asks this about every tensor of the file before anything is allocated: NULL when a
// weight may have `type`; else why not, which the load fails with (naming the tensor). ggml-ext's KVQuant
// types NUQ4 / NUQ3 / NUQ2 (ids 103-105) are KV cache types: their bytes mean something only with a
// cache's calibrated tables bound to the cache's memory, so a weight of them would silently compute with
// uniform levels. Static string.
GGML_EXT_API const char * ggml_ext_llama_weight_type_refusal(int type);

// ---- split mode "tensor": may a weight of this type be cut across devices? (patch 0302) ----

// -sm tensor (patch 0302): the meta backend cuts each weight into per-device slices by rows or by columns. NULL when a
// weight of `type` may be cut so; else the reason and what to do instead, which the load fails with: any-precision
// planes are plane-major over the whole matrix, so no slice is contiguous. The interleaved types are cut by whole
// groups of rows (patch 0102 in the meta backend; ggml_ext_llama_split_granularity for row cuts).
GGML_EXT_API const char * ggml_ext_llama_split_tensor_refusal(int type);
// The granularity of a row cut (split axis 1) of a weight of `type`: g, raised to a multiple of the rows the type
// interleaves per block.
GGML_EXT_API int64_t ggml_ext_llama_split_granularity(int type, int64_t g);

// ---- any-precision weights (APQ, docs/formats/anyprec.md; patch 0303 in the loader, 0310 in common) ----

// The i-th companion tensor the loader may create with weight w (i = 0, 1, ... until NULL), in w's
// context: "<w name>.apq_tables" for an APQ weight (its centroid tables; *required = true: a file without
// it is refused), "<w name>.ooc_idx" and "<w name>.ooc_s" for any other matrix (an OOC file's column
// side-car, y = W.x + S.x[idx]; *required = false: created only when the file has them). Per-thread
// static buffer.
GGML_EXT_API const char * ggml_ext_llama_companion_name(const struct ggml_tensor * w, int i, bool * required);

// The loader created a companion of w (as named above): remembers it for the linear hook, which turns
// ggml_mul_mat(w, x) into ggml_ext_apq_mul_mat(w, x, tables, b) for an APQ weight, and adds
// ggml_ext_col_sidecar(y, x, idx, s) for a weight with an OOC side-car. NULL when usable, else why not
// (the load fails with it): tables of the wrong type or length, a precision (ggml_ext_llama_apq_bits) the
// file does not serve, a side-car index that is not I32 [k] or values that are not F32 [k, rows of w].
GGML_EXT_API const char * ggml_ext_llama_attach_companion(struct ggml_tensor * w, struct ggml_tensor * companion);

// The precision APQ weights run at in graphs built from now on: bits in 1..8, or 0 to go back to the
// environment (GGML_EXT_APQ_BITS) and else each weight's parent precision. Process-wide (llama tools:
// --apq-bits B; llama-cpp-python: ggml_ext's apq_bits); set it before loading / creating a context.
// Returns 0, or -1 for a value outside 0..8.
GGML_EXT_API int ggml_ext_llama_set_apq_bits(int bits);

// The precision of graphs this thread builds from now on, over the process-wide one above: bits in
// 1..8, or 0 to go back to it. llama-server sets it per batch from the requests' "apq_bits" (patch
// 0311; requests of different precisions never share a batch). Returns 0, or -1 outside 0..8.
GGML_EXT_API int ggml_ext_llama_set_apq_bits_local(int bits);

// Whether every any-precision weight loaded so far serves bits: 0, else -1 with why in err (of size n):
// no APQ weights loaded, or bits outside [the highest seed, the lowest parent] of them. Weights of a model
// freed since still count (the check errs on the side of refusing).
GGML_EXT_API int ggml_ext_llama_apq_check(int bits, char * err, size_t n);

// The precision asked for: this thread's value (set_apq_bits_local), else the process-wide one, else
// GGML_EXT_APQ_BITS, else 0 (each weight's parent); -1 when GGML_EXT_APQ_BITS is not a number in 1..8.
GGML_EXT_API int ggml_ext_llama_apq_bits(void);

// llama-server's slot files (patch 0311): saving a slot to path records the precision its KV was computed at
// (its requests' apq_bits; 0 = the server's); restoring from path returns it, or -1 when this process saved
// no slot there (a request's precision never equals -1: the restored KV is recomputed, not reused at another
// precision). saved returns 0, or -1 when out of memory (the file then restores as unknown).
GGML_EXT_API int ggml_ext_llama_apq_slot_saved(const char * path, int bits);
GGML_EXT_API int ggml_ext_llama_apq_slot_restored(const char * path);

// Precision per llama context (patch 0312): a context keeps the precision in effect when it was made
// (ggml_ext_llama_apq_bits then: the thread's, the process-wide one, GGML_EXT_APQ_BITS) for its whole life,
// so two contexts of one process run at two precisions. bind at construction, unbind in the destructor;
// enter / leave around the building of each graph (process_ubatch, graph_reserve): enter sets the thread's
// precision to the context's unless the caller set one (llama-server's per-request precision wins) and
// returns whether it did; leave(entered) undoes it.
GGML_EXT_API void ggml_ext_llama_apq_context_bind(const void * ctx);
GGML_EXT_API void ggml_ext_llama_apq_context_unbind(const void * ctx);
GGML_EXT_API int  ggml_ext_llama_apq_context_enter(const void * ctx);
GGML_EXT_API void ggml_ext_llama_apq_context_leave(int entered);

// ---- what a file declares, checked when it is opened (patch 0304; side files: kvquant_cache.c, qdec.c) ----

// The version of the format named by key that this build reads ("ggml_ext.format_version",
// "ggml_ext.anyprec.version", "kvquant.format_version", ...); -1 for a key this build does not know.
GGML_EXT_API int ggml_ext_format_key_version(const char * key);

// Checks the version key of g against ggml_ext_format_key_version: 0, or -1 with err (of size n):
// "PATH: KEY: written by a newer ggml-ext (version N); this build reads M", a version below 1, a value
// that is not an integer, or (required set) a missing key.
GGML_EXT_API int ggml_ext_check_format_key(const struct gguf_context * g, const char * key, const char * path,
                                           int required, char * err, size_t n);

// The model loader calls this with a file's metadata and its tensors' metadata (ctx, may be NULL) before
// anything is allocated: NULL when usable, else why not (the load fails with it, naming the file): a
// ggml_ext.*version key newer than this build reads (or of a format it does not know), any-precision
// keys (seed / parent bits) that contradict the APQ tensors and their tables. Per-thread static buffer.
GGML_EXT_API const char * ggml_ext_llama_check_model_file(const struct gguf_context * g,
                                                          const struct ggml_context * ctx, const char * path);

// ---- flag values (ggml_ext/src/llama/flags.c; common's arguments of patches 0310, 0320, 0323) ----

// An integer lo..hi: 0 and *out, or -1 with err naming the flag, the value and the range (plus hint):
// "--apq-bits: 'abc' is not an integer; use 1..8".
GGML_EXT_API int ggml_ext_flag_int(const char * flag, const char * value, long lo, long hi, const char * hint,
                                   long * out, char * err, size_t n);

// A number lo <= x < below, as ggml_ext_flag_int.
GGML_EXT_API int ggml_ext_flag_fraction(const char * flag, const char * value, double lo, double below,
                                        const char * hint, double * out, char * err, size_t n);

// --apq-bits, --kv-outliers, --kv-sink: parse value and set it (ggml_ext_llama_set_apq_bits,
// ggml_ext_llama_set_kv_outliers, ggml_ext_llama_set_kv_sink); 0, or -1 with err as above.
GGML_EXT_API int ggml_ext_llama_flag_apq_bits(const char * value, char * err, size_t n);
GGML_EXT_API int ggml_ext_llama_flag_kv_outliers(const char * value, char * err, size_t n);
GGML_EXT_API int ggml_ext_llama_flag_kv_sink(const char * value, char * err, size_t n);

// -ctk / -ctv: the message for a name that is no cache type, listing stock's names (stock, comma-separated)
// and ggml-ext's (nuq4, nuq3, nuq2); returns snprintf's count.
GGML_EXT_API int ggml_ext_llama_cache_type_error(const char * value, const char * stock, char * err, size_t n);

#ifdef __cplusplus
}
#endif
