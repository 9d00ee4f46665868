// The registered types with a stock twin (interleaved4: Q4_0_4_4 .. IQ4_NL_8_8, ggml_ext_base_layout_type)
// on CUDA. Their bytes are plain Q4_0 / IQ4_NL rows interleaved for CPU SIMD, so a CUDA buffer keeps them
// de-interleaved: writes are turned back into the base layout on the way in, reads re-interleaved on the way
// out, and for the length of a graph computation the tensors carry their base type, so upstream's own
// kernels (MMVQ, MMQ, dequantize + cuBLAS) run them unchanged. The file on disk and every byte a caller
// reads back stay interleaved; only GPU memory holds the base layout. Patch 0400 calls these from
// ggml-cuda.cu (buffer and async set/get, supports_op, graph_optimize and graph_compute).
//
// Relayout works on whole row groups (N rows: the bytes of one group are the same byte range in both
// layouts), so a write that starts or ends inside a group first reads the rest of that group back: any
// chunking of a tensor's upload (llama.cpp's loader sends 1 MiB pieces) gives the same GPU bytes.
#include "ggml-ext-cuda.cuh"

#include "ggml-cuda/common.cuh"
#include "ggml-ext.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

namespace {

// Byte range [begin, end) of whole row groups covering [offset, offset + size) of t.
struct group_span {
    size_t begin, end, group;
};

group_span covering_groups(const ggml_tensor * t, size_t offset, size_t size) {
    const size_t group = (size_t) ggml_ext_type_row_group(t->type) * t->nb[1];
    const size_t begin = offset / group * group;
    const size_t end   = std::min((offset + size + group - 1) / group * group, ggml_nbytes(t));
    return { begin, end, group };
}

void check_tensor(const ggml_tensor * t, size_t offset, size_t size) {
    if (!ggml_is_contiguous(t) || t->ne[1] % ggml_ext_type_row_group(t->type) != 0 ||
        ggml_nbytes(t) % ((size_t) ggml_ext_type_row_group(t->type) * t->nb[1]) != 0) {
        GGML_ABORT("ggml-ext: %s tensor '%s' (%lld x %lld) is not whole contiguous row groups of %d rows: "
                   "it cannot be held on CUDA", ggml_type_name(t->type), t->name, (long long) t->ne[0],
                   (long long) t->ne[1], ggml_ext_type_row_group(t->type));
    }
    GGML_ASSERT(offset + size <= ggml_nbytes(t));
}

// GPU bytes [begin, end) of t (whole groups, base layout) -> interleaved at dst.
void read_groups(const ggml_tensor * t, size_t begin, size_t end, uint8_t * dst) {
    std::vector<uint8_t> base(end - begin);
    CUDA_CHECK(cudaMemcpyAsync(base.data(), (const char *) t->data + begin, end - begin, cudaMemcpyDeviceToHost,
                               cudaStreamPerThread));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    const int rc = ggml_ext_from_base_layout(t->type, dst, base.data(), (int64_t) ((end - begin) / t->nb[1]), t->ne[0]);
    GGML_ASSERT(rc == 0);
}

}  // namespace

// ggml_ext_base_layout_type by type id, looked up once: graph_compute asks for every source of every node
// on every token
static int base_layout_type(ggml_type type) {
    static const std::array<int, GGML_TYPE_COUNT> table = [] {
        std::array<int, GGML_TYPE_COUNT> a{};
        for (int i = 0; i < GGML_TYPE_COUNT; i++) {
            a[i] = ggml_ext_base_layout_type(i);
        }
        return a;
    }();
    return (unsigned) type < (unsigned) GGML_TYPE_COUNT ? table[type] : -1;
}

bool ggml_ext_cuda_keeps_base_layout(const ggml_tensor * t) {
    return t != nullptr && base_layout_type(t->type) >= 0;
}

void ggml_ext_cuda_set_base_layout(ggml_tensor * t, const void * data, size_t offset, size_t size) {
    if (size == 0) {
        return;
    }
    check_tensor(t, offset, size);
    const group_span s = covering_groups(t, offset, size);
    std::vector<uint8_t> inter(s.end - s.begin);
    // a write that starts or ends inside a group: the group's other bytes as they are now (once, when
    // the write lies inside a single group)
    const bool head = s.begin < offset, tail = offset + size < s.end;
    if (head) {
        read_groups(t, s.begin, s.begin + s.group, inter.data());
    }
    if (tail && !(head && s.end - s.group == s.begin)) {
        read_groups(t, s.end - s.group, s.end, inter.data() + (s.end - s.group - s.begin));
    }
    std::memcpy(inter.data() + (offset - s.begin), data, size);
    std::vector<uint8_t> base(inter.size());
    const int rc = ggml_ext_to_base_layout(t->type, base.data(), inter.data(), (int64_t) ((s.end - s.begin) / t->nb[1]),
                                           t->ne[0]);
    GGML_ASSERT(rc == 0);
    CUDA_CHECK(cudaMemcpyAsync((char *) t->data + s.begin, base.data(), base.size(), cudaMemcpyHostToDevice,
                               cudaStreamPerThread));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
}

void ggml_ext_cuda_get_base_layout(const ggml_tensor * t, void * data, size_t offset, size_t size) {
    if (size == 0) {
        return;
    }
    check_tensor(t, offset, size);
    const group_span     s = covering_groups(t, offset, size);
    std::vector<uint8_t> inter(s.end - s.begin);
    read_groups(t, s.begin, s.end, inter.data());
    std::memcpy(data, inter.data() + (offset - s.begin), size);
}

void ggml_ext_cuda_set_base_layout_2d(ggml_tensor * t, const void * data, size_t offset, size_t size, size_t n_copies,
                                      size_t stride_tensor, size_t stride_data) {
    for (size_t i = 0; i < n_copies; i++) {
        ggml_ext_cuda_set_base_layout(t, (const char *) data + i * stride_data, offset + i * stride_tensor, size);
    }
}

void ggml_ext_cuda_get_base_layout_2d(const ggml_tensor * t, void * data, size_t offset, size_t size, size_t n_copies,
                                      size_t stride_tensor, size_t stride_data) {
    for (size_t i = 0; i < n_copies; i++) {
        ggml_ext_cuda_get_base_layout(t, (char *) data + i * stride_data, offset + i * stride_tensor, size);
    }
}

const ggml_tensor * ggml_ext_cuda_base_layout_op(const ggml_tensor * op, ggml_ext_cuda_node_copy & copy) {
    bool involved = ggml_ext_cuda_keeps_base_layout(op);
    for (int j = 0; j < GGML_MAX_SRC; j++) {
        involved = involved || ggml_ext_cuda_keeps_base_layout(op->src[j]);
    }
    if (!involved) {
        return op;
    }
    // the tensors themselves and views of them compute nothing (the scheduler asks about a weight that
    // sits in a CUDA buffer with the weight as the op)
    switch (op->op) {
        case GGML_OP_NONE:
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return op;
        default:
            break;
    }
    // what the base layout serves: a matrix product with the registered type as the weights (src0),
    // whole contiguous row groups (get_rows, copies and views would need the interleaved row order)
    const ggml_tensor * w = op->src[0];
    if (op->op != GGML_OP_MUL_MAT || ggml_ext_cuda_keeps_base_layout(op) || !ggml_ext_cuda_keeps_base_layout(w) ||
        !ggml_is_contiguous(w) || w->ne[1] % ggml_ext_type_row_group(w->type) != 0) {
        return nullptr;
    }
    for (int j = 1; j < GGML_MAX_SRC; j++) {
        if (ggml_ext_cuda_keeps_base_layout(op->src[j])) {
            return nullptr;
        }
    }
    copy.node       = *op;
    copy.src0       = *w;
    copy.src0.type  = (ggml_type) base_layout_type(w->type);
    copy.node.src[0] = &copy.src0;
    return &copy.node;
}

ggml_ext_cuda_base_layout_graph::ggml_ext_cuda_base_layout_graph(ggml_cgraph * cgraph) {
    // a graph the scheduler hands over again unchanged (same uid: llama.cpp reuses its decode graph) has
    // the same sources: the walk over every node is done once per graph, not once per token
    thread_local const ggml_cgraph *     last_graph = nullptr;
    thread_local uint64_t                last_uid   = 0;
    thread_local std::vector<ggml_tensor *> last_sources;
    if (cgraph->uid == 0 || cgraph != last_graph || cgraph->uid != last_uid) {
        last_sources.clear();
        const int n = ggml_graph_n_nodes(cgraph);
        for (int i = 0; i < n; i++) {
            ggml_tensor * node = ggml_graph_node(cgraph, i);
            for (int j = 0; j < GGML_MAX_SRC; j++) {
                if (ggml_ext_cuda_keeps_base_layout(node->src[j])) {
                    last_sources.push_back(node->src[j]);
                }
            }
        }
        last_graph = cgraph;
        last_uid   = cgraph->uid;
    }
    changed.reserve(last_sources.size());
    for (ggml_tensor * src : last_sources) {
        if (ggml_ext_cuda_keeps_base_layout(src)) {  // a weight used by several nodes is listed once per use
            changed.emplace_back(src, src->type);
            src->type = (ggml_type) base_layout_type(src->type);
        }
    }
}

ggml_ext_cuda_base_layout_graph::~ggml_ext_cuda_base_layout_graph() {
    for (auto it = changed.rbegin(); it != changed.rend(); ++it) {
        it->first->type = it->second;
    }
}
