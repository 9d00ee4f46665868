// What the patched llama_kv_cache (llama-kv-cache.cpp) calls for the KVQuant cache types (patches 0322, 0323):
// the bodies of its hooks, in ggml_ext/src/llama/kvquant_cache_hooks.cpp (libllama). C++: the hooks take
// llama.cpp's own cache types, so this header is included by llama-kv-cache.cpp only (not by ggml-ext-llama.h,
// whose every change rebuilds all of llama).
#pragma once

#include "ggml.h"
#include "llama-batch.h"
#include "llama-io.h"
#include "llama-kv-cache.h"
#include "llama-kv-cells.h"

#include <cstdint>
#include <utility>
#include <vector>

// ---- pre-RoPE keys (patch 0322): attention ropes the cache at the positions of its cells ----
// The I32 input of n positions (n_kv cells x the ubatch's streams) for a cache whose K type is stored before
// RoPE (ggml_ext_llama_kv_pre_rope), else nullptr.
ggml_tensor * ggml_ext_llama_k_pos_input(ggml_context * ctx, ggml_type type_k, int64_t n);
// dst (that input, host memory) = the positions of the cells of n_stream streams, cells[s] the cells of the
// s-th one; an empty cell reads 0.
void ggml_ext_llama_k_pos_set(ggml_tensor * dst, const llama_kv_cells * cells, uint32_t n_stream);

// ---- outliers and the attention sink (patch 0323) ----
// apply_ubatch wrote the ubatch's rows into the cells of sinfo: each KVQuant tensor of a layer (k_stream /
// v_stream: the layer's per-stream views) learns the positions of the rows it got (its sink rows follow them).
void ggml_ext_llama_kvq_rows_written(const std::vector<ggml_tensor *> & k_stream,
                                     const std::vector<ggml_tensor *> & v_stream,
                                     const llama_kv_cache::slot_info & sinfo, const llama_ubatch & ubatch);
// The cells a state write covers, in order (ranges [first, second)), when the cache's first layer (k0, v0) has a
// KVQuant type, else none: a KVQuant tensor's side data names its cells by ordinal.
std::vector<uint32_t> ggml_ext_llama_kvq_side_cells(const ggml_tensor * k0, const ggml_tensor * v0,
                                                    const std::vector<std::pair<uint32_t, uint32_t>> & ranges);
// A KVQuant tensor's side data (its sink rows) after its rows in the cache state: u64 size, then the blob.
// Nothing for other types. The read checks the size against cell_count and returns false (logged) when the
// data is refused.
void ggml_ext_llama_kvq_state_write_side(llama_io_write_i & io, ggml_tensor * t, const std::vector<uint32_t> & cells);
bool ggml_ext_llama_kvq_state_read_side(llama_io_read_i & io, ggml_tensor * t, const llama_kv_cache::slot_info & sinfo,
                                        uint32_t cell_count);
