// KVQuant cache: dense-and-sparse outliers and the attention sink (issue 20; docs/KVQUANT.md "In llama.cpp's
// cache", "Outliers and the sink"). A header of its own, included only by the KVQuant sources and the patched
// llama-kv-cache.cpp / arg.cpp (patch 0323), so changing it does not rebuild llama.cpp's graph code.
#pragma once

#include "ggml-ext.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- ggml-base (src/ggml/kvquant_base.c) ----

// Binds [data, data + nbytes) (a cache tensor of rows of row_values values) like ggml_ext_kvq_bind (values:
// k_mid = k_half = NULL) or ggml_ext_kvq_bind_keys (keys: per-channel k_mid / k_half), with
//   outliers: 1 = in-block outlier slots (keys: up to 2 per 64-channel block, the channels beyond the
//             calibrated thresholds k_mid +- k_half with the largest excess; values: 1 per 64-value block,
//             the element whose removal narrows the block's range most), 0 = none;
//   n_sink:   cells written at positions < n_sink also keep their row in float (the attention sink), read
//             back instead of the blocks (0..GGML_EXT_KVQ_MAX_SINK).
#define GGML_EXT_KVQ_MAX_SINK 16
GGML_EXT_API int ggml_ext_kvq_bind_opts(const void * data, size_t nbytes, int type, int64_t row_values,
                                        const float * levels, const float * values, const float * k_mid,
                                        const float * k_half, int outliers, int n_sink, char * err, size_t en);

// Whether `type` is a KVQuant cache type (its cache state carries the side blob below).
GGML_EXT_API bool ggml_ext_kvq_is_cache_type(int type);

// The cache wrote cells[i] (row address data + cells[i] * row_stride) at position pos[i]: the sink marks of
// a bound tensor with n_sink > 0 follow (called before the graph that writes the rows runs). A no-op for
// memory outside every binding or without a sink.
GGML_EXT_API void ggml_ext_kvq_rows_written(const void * data, size_t row_stride, const uint32_t * cells,
                                           const int32_t * pos, uint32_t n);

// State save / restore of the side data (the sink rows) of cells[0..n) of a bound tensor. side_get returns
// the blob's size and writes it to buf when cap suffices: u32 n_rows, u32 row_values, then n_rows x
// (u32 ordinal in cells, row_values f32). side_set reads such a blob for the destination cells (ordinal i ->
// cells[i]): the cells named get their sink rows, the others lose theirs; 0, or -1 (malformed: nothing kept).
GGML_EXT_API size_t ggml_ext_kvq_side_get(const void * data, size_t row_stride, const uint32_t * cells, uint32_t n,
                                          void * buf, size_t cap);
GGML_EXT_API int ggml_ext_kvq_side_set(const void * data, size_t row_stride, const uint32_t * cells, uint32_t n,
                                       const void * buf, size_t size);

// ---- libllama (src/glue/kvquant_cache.c) ----

// --kv-outliers F (GGML_EXT_KV_OUTLIERS): F = 0 off, else it must be the calibration's outlier fraction
// (kvquant.outlier_fraction): its thresholds and outlier tables are used. -1: invalid F.
GGML_EXT_API int   ggml_ext_llama_set_kv_outliers(float fraction);
// --kv-sink N (GGML_EXT_KV_SINK): the first N positions of every sequence in float. -1: N out of range.
GGML_EXT_API int   ggml_ext_llama_set_kv_sink(int n);

#ifdef __cplusplus
}
#endif
