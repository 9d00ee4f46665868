// The bodies of the KVQuant hooks in llama.cpp's KV cache (ggml-ext-kvquant-cache.h; patches 0322 and 0323 keep
// only the calls): the positions input of a pre-RoPE K cache, the rows each KVQuant tensor was written (its
// attention sink follows their positions) and the tensors' side data in the cache state. C++ in libllama: they
// read llama.cpp's cache types (cells, slot info, ubatch, state I/O).
#include "ggml-ext-kvquant-cache.h"

#include "ggml-ext-kvquant.h"
#include "ggml-ext-llama.h"
#include "llama-impl.h"

ggml_tensor * ggml_ext_llama_k_pos_input(ggml_context * ctx, ggml_type type_k, int64_t n) {
    if (!ggml_ext_llama_kv_pre_rope(type_k)) {
        return nullptr;
    }
    ggml_tensor * res = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    ggml_set_input(res);
    ggml_set_name(res, "attn_inp_k_pos");
    return res;
}

void ggml_ext_llama_k_pos_set(ggml_tensor * dst, const llama_kv_cells * cells, uint32_t n_stream) {
    GGML_ASSERT(ggml_backend_buffer_is_host(dst->buffer));

    int32_t * data = (int32_t *) dst->data;

    const int64_t n_kv = ggml_nelements(dst)/n_stream;

    for (uint32_t s = 0; s < n_stream; ++s) {
        const llama_kv_cells & c = cells[s];

        for (int64_t i = 0; i < n_kv; ++i) {
            data[s*n_kv + i] = c.is_empty(i) ? 0 : c.pos_get(i);
        }
    }
}

void ggml_ext_llama_kvq_rows_written(const std::vector<ggml_tensor *> & k_stream,
                                     const std::vector<ggml_tensor *> & v_stream,
                                     const llama_kv_cache::slot_info & sinfo, const llama_ubatch & ubatch) {
    std::vector<int32_t> pos(sinfo.size());
    for (uint32_t s = 0; s < sinfo.n_stream(); ++s) {
        ggml_tensor * k = k_stream.empty() ? nullptr : k_stream[sinfo.strm[s]];
        ggml_tensor * v = v_stream.empty() ? nullptr : v_stream[sinfo.strm[s]];
        const bool    kq = k && ggml_ext_kvquant_is_cache_type(k->type);
        const bool    vq = v && ggml_ext_kvquant_is_cache_type(v->type);
        if (!kq && !vq) {
            continue;
        }
        for (uint32_t ii = 0; ii < sinfo.size(); ++ii) {
            pos[ii] = ubatch.pos[s*sinfo.size() + ii];
        }
        if (kq) {
            ggml_ext_kvquant_rows_written(k->data, k->nb[1], sinfo.idxs[s].data(), pos.data(), sinfo.size());
        }
        if (vq) {
            ggml_ext_kvquant_rows_written(v->data, v->nb[1], sinfo.idxs[s].data(), pos.data(), sinfo.size());
        }
    }
}

std::vector<uint32_t> ggml_ext_llama_kvq_side_cells(const ggml_tensor * k0, const ggml_tensor * v0,
                                                    const std::vector<std::pair<uint32_t, uint32_t>> & ranges) {
    std::vector<uint32_t> cells;
    if ((k0 && ggml_ext_kvquant_is_cache_type(k0->type)) || (v0 && ggml_ext_kvquant_is_cache_type(v0->type))) {
        for (const auto & range : ranges) {
            for (uint32_t i = range.first; i < range.second; ++i) {
                cells.push_back(i);
            }
        }
    }
    return cells;
}

void ggml_ext_llama_kvq_state_write_side(llama_io_write_i & io, ggml_tensor * t, const std::vector<uint32_t> & cells) {
    if (!ggml_ext_kvquant_is_cache_type(t->type)) {
        return;
    }
    std::vector<uint8_t> blob(ggml_ext_kvquant_side_get(t->data, t->nb[1], cells.data(), cells.size(), nullptr, 0));
    ggml_ext_kvquant_side_get(t->data, t->nb[1], cells.data(), cells.size(), blob.data(), blob.size());
    const uint64_t size = blob.size();
    io.write(&size, sizeof(size));
    io.write(blob.data(), blob.size());
}

bool ggml_ext_llama_kvq_state_read_side(llama_io_read_i & io, ggml_tensor * t, const llama_kv_cache::slot_info & sinfo,
                                        uint32_t cell_count) {
    if (!ggml_ext_kvquant_is_cache_type(t->type)) {
        return true;
    }
    // the log lines name this step "ggml_ext_state_read_side", as llama.cpp's name their function
    uint64_t size;
    io.read(&size, sizeof(size));
    if (size < 8 || size > 8 + (uint64_t) cell_count * (4 + sizeof(float) * (uint64_t) t->ne[0])) {
        LLAMA_LOG_ERROR("%s: ggml-ext: bad KVQuant side data size %llu for %s\n", "ggml_ext_state_read_side",
                        (unsigned long long) size, t->name);
        return false;
    }
    std::vector<uint8_t> blob(size);
    io.read(blob.data(), size);
    if (ggml_ext_kvquant_side_set(t->data, t->nb[1], sinfo.idxs[0].data(), cell_count, blob.data(), size) != 0) {
        LLAMA_LOG_ERROR("%s: ggml-ext: KVQuant side data of %s refused\n", "ggml_ext_state_read_side", t->name);
        return false;
    }
    return true;
}
