// ggml-ext public C API: what the patched llama.cpp and the Python layer call.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#    define GGML_EXT_API __declspec(dllexport)
#else
#    define GGML_EXT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Version of the ggml-ext sources compiled into this build ("0.1.0").
GGML_EXT_API const char * ggml_ext_version(void);

// Version of the GGUF conventions ggml-ext writes (key ggml_ext.format_version).
GGML_EXT_API int ggml_ext_format_version(void);

// Pinned llama.cpp commit these sources were patched into.
GGML_EXT_API const char * ggml_ext_llama_cpp_commit(void);

// One line for llama_print_system_info():
// "GGML_EXT : VERSION = 0.1.0 | FORMAT = 1 | ARCH = x86 | CUDA_BACKEND = 0 | LLAMA_CPP = 0c1e57098 | "
GGML_EXT_API const char * ggml_ext_system_info(void);

// Whether this build includes llama.cpp's CUDA backend (configured with GGML_EXT_CUDA=ON), and with
// it the CUDA kernels of ggml-ext's ops (ggml_ext/src/cuda). ggml-ext's types have no CUDA kernels:
// the interleaved types (ggml-ext-types.def) run on the CPU in every build (ggml-cuda does not support
// them, so the model loader keeps those weights in host memory).
GGML_EXT_API bool ggml_ext_has_cuda(void);

// Model checks for the loader: NULL when the values are usable, else a message
// naming the bad GGUF key (valid until the next call on the same thread).
GGML_EXT_API const char * ggml_ext_check_block_count(uint32_t n_layer, uint32_t max_layers);
GGML_EXT_API const char * ggml_ext_check_hparams(uint32_t n_ctx_train, float f_norm_eps, float f_norm_rms_eps,
                                                  float rope_freq_base, float rope_freq_scale);

// ---- the type registry: one entry per row of ggml-ext-types.def (beside this header) ----
// Types are passed as int (enum ggml_type values) so this header does not need ggml.h.

// Families: the code a type's bytes and kernels belong to (FAMILY column of the .def).
enum ggml_ext_family {
    GGML_EXT_FAMILY_INTERLEAVED4 = 1,  // 4-bit values (Q4_0 or IQ4_NL) of 4 or 8 rows interleaved
    GGML_EXT_FAMILY_CODEBOOKS    = 2,  // group-wise codebooks CB2 / CB3 (docs/formats/codebooks.md), rows alone
    GGML_EXT_FAMILY_ANYPREC      = 3,  // any-precision bitplanes APQ (docs/formats/anyprec.md), plane-major
    GGML_EXT_FAMILY_KVQUANT      = 4,  // KVQuant KV cache types NUQ4/3/2 (docs/KVQUANT.md), blocks of 64 values
    GGML_EXT_FAMILY_COUNT,             // size of the family tables (src/common/families.h); 0 is no family
};
#define GGML_EXT_FAMILY_NAME_INTERLEAVED4 "interleaved4"
#define GGML_EXT_FAMILY_NAME_CODEBOOKS    "codebooks"
#define GGML_EXT_FAMILY_NAME_ANYPREC      "anyprec"
#define GGML_EXT_FAMILY_NAME_KVQUANT      "kvquant"

struct ggml_ext_type_info {
    const char * name;          // "Q4_0_4_4" (GGML_TYPE_Q4_0_4_4)
    const char * ggml_name;     // ggml's type_name: "q4_0_4x4"
    int          id;            // GGUF / ggml type id
    int          blck_size;     // weights per block
    int          type_size;     // bytes per block
    int          row_group;     // rows interleaved per group (ne[1] must be a multiple)
    int          chunk;         // bytes per round-robin chunk of the interleave
    int          family;        // enum ggml_ext_family
    const char * family_name;   // "interleaved4"
    int          layout;        // layout number inside the family
    int          base_type;     // the stock type whose values it stores (2: Q4_0, 20: IQ4_NL)
    const char * base_name;     // "Q4_0"
    int          vec_dot_type;  // the type activations are quantized to on the CPU (8: Q8_0)
    const char * shape_rule;    // why a row count that is not a multiple of row_group is refused
    bool         rowwise;       // the ROWWISE column: rows stand alone, ggml has row-wise to_float / from_float_ref
};

// The row-wise functions ggml's type traits get for each ROWWISE row of the .def (ggml.c, patch 0100):
// ggml_ext_to_float_<NAME>(blocks, k floats out) and ggml_ext_from_float_ref_<NAME>(k floats, blocks out,
// no importance), k a multiple of the type's block size.
#define GGML_EXT_DECLARE_ROWWISE(NAME)                                                                       \
    GGML_EXT_API void ggml_ext_to_float_##NAME(const void * GGML_EXT_RESTRICT_ x, float * GGML_EXT_RESTRICT_ y, \
                                               int64_t k);                                                   \
    GGML_EXT_API void ggml_ext_from_float_ref_##NAME(const float * GGML_EXT_RESTRICT_ x,                      \
                                                     void * GGML_EXT_RESTRICT_ y, int64_t k);
#define GGML_EXT_DECLARE_GROUPED(NAME)
#ifdef __cplusplus
#    define GGML_EXT_RESTRICT_ __restrict__
#else
#    define GGML_EXT_RESTRICT_ restrict
#endif
#define GGML_EXT_TYPE(NAME, ID, BLCK, TYPE_SIZE, ROWS, CHUNK, GGML_NAME, FAMILY, LAYOUT, BASE, BASE_ID, VEC_DOT, \
                      VEC_DOT_ID, ROWWISE)                                                                        \
    GGML_EXT_DECLARE_##ROWWISE(NAME)
#include "ggml-ext-types.def"
#undef GGML_EXT_DECLARE_ROWWISE
#undef GGML_EXT_DECLARE_GROUPED

// Number of registered types, and entry i (0 <= i < count, in .def order; NULL out of range).
GGML_EXT_API int                                ggml_ext_type_count(void);
GGML_EXT_API const struct ggml_ext_type_info * ggml_ext_type_info_at(int i);
// The entry of a type id, NULL when the id is not one of ggml-ext's types.
GGML_EXT_API const struct ggml_ext_type_info * ggml_ext_type_info_by_id(int id);
GGML_EXT_API bool                               ggml_ext_is_type(int type);
// The family of a type id (enum ggml_ext_family), 0 when the id is not one of ggml-ext's types.
GGML_EXT_API int                                ggml_ext_type_family(int type);
// ggml-ext's own id range (GGML_EXT_TYPE_FIRST_OWN .. GGML_EXT_TYPE_LAST_OWN of the .def).
GGML_EXT_API int                                ggml_ext_type_first_own(void);
GGML_EXT_API int                                ggml_ext_type_last_own(void);

// ---- hooks of the patched ggml (ggml_ext/patches/01xx): the registry's types ----

// Rows interleaved per group (the registry's row_group), 0 for a type not in the registry.
GGML_EXT_API int ggml_ext_type_row_group(int type);

// NULL when a tensor of `type` and shape `ne` (ggml order, 4 dims) is acceptable,
// otherwise a static message saying why not (row count not a multiple of the group).
GGML_EXT_API const char * ggml_ext_check_tensor_shape(int type, const int64_t * ne);

// ggml_quantize_chunk for the interleaved Q4_0 types (base Q4_0): float rows [start / n_per_row, + nrows) -> interleaved
// bytes at dst (row r of the tensor at dst + r * row_size, like every ggml type). The first
// row and the row count must be multiples of the type's row group; returns the bytes
// written, 0 on a shape the layout cannot hold.
GGML_EXT_API size_t ggml_ext_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                            int64_t n_per_row);

// ggml_quantize_chunk for every registered type, with its importance matrix (n_per_row
// values, or NULL; the Q4_0-based types ignore it, as ggml's Q4_0 does without one): for the
// IQ4_NL-based types plain IQ4_NL quantization of the rows, then the interleave. What the
// patched ggml_quantize_chunk calls.
GGML_EXT_API size_t ggml_ext_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start,
                                                    int64_t nrows, int64_t n_per_row, const float * imatrix);

// ---- the stock layout of a registered type (backends that keep weights as a stock type: CUDA) ----

// The stock type whose bytes a tensor of `type` holds rearranged (interleaved4: rows de-interleaved
// give Q4_0 / IQ4_NL of the same size), or -1 when the type has no such stock twin.
GGML_EXT_API int ggml_ext_base_layout_type(int type);
// nrows x n_per_row weights of `type` (src) -> the same weights in the base type's layout (dst), and
// back. nrows must be a multiple of the type's row group, src and dst must not overlap; 0 on success.
GGML_EXT_API int ggml_ext_to_base_layout(int type, void * dst, const void * src, int64_t nrows, int64_t n_per_row);
GGML_EXT_API int ggml_ext_from_base_layout(int type, void * dst, const void * src, int64_t nrows, int64_t n_per_row);

// ggml_validate_row_data for the registered types: whole interleaved blocks, finite fp16 deltas.
GGML_EXT_API bool ggml_ext_validate_row_data(int type, const void * data, size_t nbytes);

// ggml-cpu's mul_mat for the registered types (src0), F32 src1 and dst, on ggml's threadpool.
// Returns false, having done nothing, for any other src0 type.
struct ggml_compute_params;
struct ggml_tensor;
GGML_EXT_API bool ggml_ext_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// ggml-cpu's supports_op for ops that involve a registered type (as a source or as the result):
// 1 for what ggml_ext_cpu_mul_mat runs (MUL_MAT of one 2-D interleaved matrix, F32
// activations and result), 0 for anything else (get_rows, copies, mul_mat_id, ...),
// -1 when no such type is involved (ggml decides).
GGML_EXT_API int ggml_ext_cpu_supports_op(const struct ggml_tensor * op);

// ggml-cpu's get_proc_address for ggml-ext's functions that other libraries call by name (patch 0113), NULL
// for any other name. With GGML_BACKEND_DL the CPU backend is a module that no library links (one per CPU
// variant, the best picked at run time), so libllama finds ggml_ext_kvquant_attn, whose graph nodes carry
// that variant's kernels, through the registry instead of the linker.
GGML_EXT_API void * ggml_ext_cpu_proc_address(const char * name);

// Which kernel implementation ggml-cpu's mul_mat runs on this CPU for a registered type:
// its GEMV (gemm = 0: activation rows left over after groups of four) or its GEMM (gemm != 0:
// groups of four rows). "generic" is the portable scalar C reference (the scalar fallback
// where this build for this CPU has no SIMD kernel for the entry); otherwise "neon-dotprod",
// "neon-i8mm", "sve256-i8mm", "avx2" or "avx512-vnni". NULL for any other type.
GGML_EXT_API const char * ggml_ext_dispatched_kernel(int type, int gemm);

// ---- IQ4_NL quantizer (plain IQ4_NL, ggml type 20; ggml_ext/src/iq4_nl_quant.c) ----

// How each weight counts in the squared error the per-block scale search minimises:
// w_i = imatrix[col] (1 without one) times f(x_i), sigma2 = mean x^2 of the 32-weight block.
enum ggml_ext_iq4_nl_weighting {
    GGML_EXT_IQ4_NL_W_DEFAULT   = 0,  // the measured best: see docs/RESULTS.md (IQ4_NL)
    GGML_EXT_IQ4_NL_W_ONE       = 1,  // f = 1 (plain squared error)
    GGML_EXT_IQ4_NL_W_X2        = 2,  // f = x^2
    GGML_EXT_IQ4_NL_W_SQRT_S2X2 = 3,  // f = sqrt(sigma2 + x^2)
    GGML_EXT_IQ4_NL_W_S2X2      = 4,  // f = sigma2 + x^2
};

// Float rows (nrows x n_per_row, n_per_row a multiple of 32) -> block_iq4_nl bytes (fp16 d +
// 16 bytes of nibbles per 32 weights, ggml's layout), row r at dst + r * (n_per_row / 32 * 18).
// imatrix: n_per_row importances (llama-imatrix's mean squared activations) or NULL.
// Per block the scale is the exact minimiser of the weighted squared error over all scales
// (then the best of the nearest fp16 values), d is clamped to fp16's range so it stays finite.
// Returns the bytes written; 0 when n_per_row is not a multiple of 32, or when src (or
// imatrix) holds a NaN or infinity, or imatrix a negative value.
GGML_EXT_API size_t ggml_ext_quantize_iq4_nl(const float * src, void * dst, int64_t nrows, int64_t n_per_row,
                                             const float * imatrix);

// The same with an explicit weighting (enum ggml_ext_iq4_nl_weighting); 0 for an unknown one.
GGML_EXT_API size_t ggml_ext_quantize_iq4_nl_weighted(const float * src, void * dst, int64_t nrows,
                                                      int64_t n_per_row, const float * imatrix, int weighting);

// ---- KVQuant KV cache (docs/formats/kvquant.md; ggml_ext/src/formats/kvquant) ----
// One layer's KV cache quantized as KVQuant does: keys per channel *before RoPE* with calibrated
// per-channel thresholds, values per token with online thresholds, both as indices into a per-layer
// non-uniform table (nuq2/3/4 from `ggml-ext calibrate kv`), outliers beyond the thresholds kept in
// fp16 in a fixed number of slots per token (dense-and-sparse). A token's key or value is one
// fixed-size row (ggml_ext_kvquant_k_row_size / _v_row_size bytes): a cache is rows at a constant stride.
// The kernels read the rows of one KV head and compute attention scores q . RoPE(pos, k) (RoPE
// applied on the fly to the dequantized pre-RoPE keys) and weighted sums of values; the query heads
// of one KV head (grouped-query attention) go through in one call.

enum ggml_ext_kvquant_rope_mode {
    GGML_EXT_KVQUANT_ROPE_NORM = 0,  // llama.cpp's LLAMA_ROPE_TYPE_NORM: pairs (2i, 2i + 1)
    GGML_EXT_KVQUANT_ROPE_NEOX = 2,  // LLAMA_ROPE_TYPE_NEOX: pairs (i, i + n_dims / 2)
};

struct ggml_ext_kvquant_config {
    int           bits;             // 2, 3 or 4 (keys and values)
    int           n_kv_heads;
    int           head_dim;         // a multiple of 8, at most 512
    int           k_slots;          // key outlier slots per token (>= 0; extra outliers are clamped)
    int           v_slots;          // value outlier slots per token (>= 2 * v_outliers_per_side)
    int           v_outliers_per_side;  // k: the k largest and k smallest of a value token are outliers (0: none)
    int           rope_mode;        // enum ggml_ext_kvquant_rope_mode
    int           rope_n_dims;      // rotated channels per head (even, <= head_dim)
    float         rope_freq_base;   // llama.cpp's freq_base, freq_scale and optional freq_factors
    float         rope_freq_scale;  // (rope_n_dims / 2 values, or NULL); no YaRN (ext_factor 0)
    const float * rope_freq_factors;
    const float * k_lo;             // n_kv_heads * head_dim per-channel key thresholds (calibration
    const float * k_hi;             //   k_lo/k_hi with outliers, k_lo0/k_hi0 without)
    const float * k_levels;         // 2^bits ascending rounding levels on [-1, 1], and the values
    const float * k_values;         //   they dequantize to (Q-Norm; = levels without it)
    const float * v_levels;
    const float * v_values;
};

struct ggml_ext_kvquant_layer;

// A layer's quantizer, or NULL with a message in err (err_size bytes, may be 0) naming the bad field.
GGML_EXT_API struct ggml_ext_kvquant_layer * ggml_ext_kvquant_layer_new(const struct ggml_ext_kvquant_config * cfg, char * err,
                                                                        size_t err_size);
GGML_EXT_API void   ggml_ext_kvquant_layer_free(struct ggml_ext_kvquant_layer * layer);
GGML_EXT_API size_t ggml_ext_kvquant_k_row_size(const struct ggml_ext_kvquant_layer * layer);
GGML_EXT_API size_t ggml_ext_kvquant_v_row_size(const struct ggml_ext_kvquant_layer * layer);

// Append: one token's pre-RoPE key / its value (n_kv_heads * head_dim floats, llama.cpp's channel
// order) -> row. Returns the outliers that found no slot (clamped into the dense part; keys only,
// value slots always suffice), or -1 without writing when the vector holds a NaN or infinity.
GGML_EXT_API int ggml_ext_kvquant_quantize_k(const struct ggml_ext_kvquant_layer * layer, const float * k, void * row);
GGML_EXT_API int ggml_ext_kvquant_quantize_v(const struct ggml_ext_kvquant_layer * layer, const float * v, void * row);
// The row back as floats (keys before RoPE), channel order; outliers are their fp16 values.
GGML_EXT_API void ggml_ext_kvquant_dequantize_k(const struct ggml_ext_kvquant_layer * layer, const void * row, float * k);
GGML_EXT_API void ggml_ext_kvquant_dequantize_v(const struct ggml_ext_kvquant_layer * layer, const void * row, float * v);

// scores[g * n_tokens + t] = q_g . RoPE(pos[t], K_t) over KV head `head`, for the n_q query heads
// q_g = q + g * head_dim (already rotated to their own position, as llama.cpp's graph does), tokens
// t < n_tokens at k_rows + t * row_stride. Outliers included. head = -1: every KV head in one pass over
// the rows (faster: each row is read once, RoPE's cos/sin computed once per token), q holding
// n_kv_heads * n_q query heads, head-major (GQA's grouping), scores n_kv_heads * n_q rows of n_tokens.
GGML_EXT_API void ggml_ext_kvquant_k_scores(const struct ggml_ext_kvquant_layer * layer, int head, const float * q, int n_q,
                                            const void * k_rows, size_t row_stride, const int32_t * pos, int n_tokens,
                                            float * scores);
// out[g * head_dim + c] = sum_t w[g * n_tokens + t] * V_t[head * head_dim + c] (overwrites out);
// head = -1: every KV head, w and out holding n_kv_heads * n_q query heads, head-major.
GGML_EXT_API void ggml_ext_kvquant_v_accumulate(const struct ggml_ext_kvquant_layer * layer, int head, const float * w,
                                                int n_q, const void * v_rows, size_t row_stride, int n_tokens,
                                                float * out);

// The implementation the two kernels run for this layer ("generic", "avx2", "neon"), and a switch
// for tests and benchmarks: ggml_ext_kvquant_force("generic") runs the scalar reference from then on,
// NULL restores the choice by CPU. Returns 0, or -1 for a name this build does not have.
GGML_EXT_API const char * ggml_ext_kvquant_kernel(const struct ggml_ext_kvquant_layer * layer);
GGML_EXT_API int          ggml_ext_kvquant_force(const char * name);

// ---- KVQuant cache types in ggml: NUQ4 / NUQ3 / NUQ2 of ggml-ext-types.def (docs/KVQUANT.md) ----
// A block is the value row (docs/formats/kvquant.md) of a one-head, 64-channel layer without outlier
// slots: 64 B-bit indices, fp16 mid / half of the block, u16 kept / dropped (0). The nuqB table belongs to
// the cache layer. ggml's row functions (to_float, from_float) get only a pointer, so the table is found
// by address: ggml_ext_kvquant_bind makes the rows in [data, data + nbytes) use `levels` (2^B ascending
// rounding levels on [-1, 1]) and `values` (dequantization values); a binding that overlaps an earlier one
// replaces it (the memory of a freed cache, reused). Rows outside every binding use uniform levels.
// Returns 0, or -1 with err filled (type not a KVQuant cache type, a bad table, no room).
GGML_EXT_API int ggml_ext_kvquant_bind(const void * data, size_t nbytes, int type, const float * levels,
                                       const float * values, char * err, size_t n);
// Forgets the binding that starts at data (the cache is freed); 0, or -1 when there is none.
GGML_EXT_API int ggml_ext_kvquant_unbind(const void * data);
// The KV cache type called `name` (ggml's type name: "nuq4"), -1 when none: what -ctk / -ctv accept
// besides upstream's types (patch 0320).
GGML_EXT_API int ggml_ext_kv_cache_type_by_name(const char * name);

#ifdef __cplusplus
}
#endif
