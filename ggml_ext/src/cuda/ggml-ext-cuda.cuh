// ggml-ext's ops in ggml-cuda (GGML_EXT_CUDA=ON): what patch 0200 calls from ggml-cuda.cu, and the
// table each op's <name>.cu fills when its ggml-ext-ops.def row says CUDA.
#pragma once

#include "ggml.h"
#include "ggml-backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>
#include <vector>

struct ggml_backend_cuda_context;

// Runs ggml-ext's op `dst` on ctx's stream; false when it is not one of ggml-ext's ops with a CUDA kernel.
bool ggml_ext_cuda_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// supports_op of ggml-cuda for ops past upstream's: true when `op` is one of ggml-ext's ops with a CUDA
// kernel that runs this node on `device`.
bool ggml_ext_cuda_supports_ext_op(int device, const ggml_tensor * op);

struct ggml_ext_cuda_op {
    bool (*supports)(int device, const ggml_tensor * op);
    void (*forward)(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
};

// ggml_ext_cuda_op_<name> for each row marked CUDA (extern: a namespace-scope const is internal in C++)
#define GGML_EXT_CUDA_DECL_CUDA(name) extern const ggml_ext_cuda_op ggml_ext_cuda_op_##name;
#define GGML_EXT_CUDA_DECL_NO_CUDA(name)
#define GGML_EXT_OP(NAME, name, symbol, cuda) GGML_EXT_CUDA_DECL_##cuda(name)
#include "ggml-ext-ops.def"
#undef GGML_EXT_OP
#undef GGML_EXT_CUDA_DECL_CUDA
#undef GGML_EXT_CUDA_DECL_NO_CUDA

// ---- QDEC's residuals in pinned, mapped host memory (dec_mul_mat.cu) ----
// cudaHostRegister (mapped, read-only where the device can) of a host range holding residuals (the
// loader's mapping of the side file), so DEC_MUL_MAT reads them zero-copy; unpin undoes it. A CUDA host
// buffer (ggml_backend_cuda_host_buffer_type) needs neither.
void ggml_ext_cuda_qdec_pin(void * ptr, size_t size);
void ggml_ext_cuda_qdec_unpin(void * ptr);
// true for the buffer type of a QDEC side file mapped by src/llama/qdec.c (GGML_EXT_DEC_Host, ggml-ext-qdec.h):
// ggml-cuda's supports_buft takes it (patch 0440), so the scheduler leaves r and scales in host memory and
// DEC_MUL_MAT pins the whole buffer with ggml_ext_cuda_qdec_pin at its first use
bool ggml_ext_cuda_qdec_host_buft(ggml_backend_buffer_type_t buft);

// ---- tensors held on the GPU in a layout of their own (device_layout.cu, patches 0400 and 0420) ----
// The file's bytes stay what every caller writes and reads back; only GPU memory holds the other layout:
// a registered type with a stock twin its base layout (interleaved4_cuda.cu, below), an any-precision APQ
// weight the row-lane layout of anyprec_cuda.h (apq_mul_mat.cu). Synchronous on cudaStreamPerThread, the
// device already current.

// A family whose tensors ggml-cuda may hold in a layout of their own: its entry in device_layout.cu's family
// table (indexed by enum ggml_ext_family, like the tables of common/families.h). set / get run only on a
// tensor holds_layout accepts; layout_alloc_size nullptr: the layout has the file's size.
struct ggml_ext_cuda_family {
    bool (*holds_layout)(const ggml_tensor * t);
    void (*set_layout)(ggml_tensor * t, const void * data, size_t offset, size_t size);
    void (*get_layout)(const ggml_tensor * t, void * data, size_t offset, size_t size);
    size_t (*layout_alloc_size)(const ggml_tensor * t);
};

// true for a tensor whose CUDA bytes are not the caller's
bool ggml_ext_cuda_device_layout(const ggml_tensor * t);
void ggml_ext_cuda_set_device_layout(ggml_tensor * t, const void * data, size_t offset, size_t size);
void ggml_ext_cuda_get_device_layout(const ggml_tensor * t, void * data, size_t offset, size_t size);
void ggml_ext_cuda_set_device_layout_2d(ggml_tensor * t, const void * data, size_t offset, size_t size,
                                        size_t n_copies, size_t stride_tensor, size_t stride_data);
void ggml_ext_cuda_get_device_layout_2d(const ggml_tensor * t, void * data, size_t offset, size_t size,
                                        size_t n_copies, size_t stride_tensor, size_t stride_data);
// the CUDA buffer type's allocation size for t, given upstream's `size`
size_t ggml_ext_cuda_device_layout_alloc_size(const ggml_tensor * t, size_t size);

// ---- any-precision APQ weights (apq_mul_mat.cu): the row-lane layout of anyprec_cuda.h ----

// true for an APQ weight held in the row-lane layout in a CUDA buffer (one contiguous 2-D matrix, not a view)
bool   ggml_ext_cuda_anyprec_layout(const ggml_tensor * t);
size_t ggml_ext_cuda_anyprec_alloc_size(const ggml_tensor * t);
void   ggml_ext_cuda_anyprec_set(ggml_tensor * t, const void * data, size_t offset, size_t size);
void   ggml_ext_cuda_anyprec_get(const ggml_tensor * t, void * data, size_t offset, size_t size);
// supports_op for a plain MUL_MAT of an APQ weight: what llama.cpp's loader asks to pick the weight's buffer
// (the linear hook replaces the node with APQ_MUL_MAT before a graph runs, as on the CPU)
bool   ggml_ext_cuda_anyprec_supports_mul_mat(int device, const ggml_tensor * op);
// a plain MUL_MAT of an APQ weight that reached ggml-cuda: stops with the weight's name (no tables, no precision)
[[noreturn]] void ggml_ext_cuda_anyprec_refuse_mul_mat(const ggml_tensor * src0);

// ---- registered types held in their base layout (interleaved4_cuda.cu) ----

// true for a tensor of a registered type with a stock twin (ggml_ext_base_layout_type >= 0)
bool ggml_ext_cuda_keeps_base_layout(const ggml_tensor * t);

// set/get of such a tensor in a CUDA buffer (the device already current): the caller's bytes are the
// registered layout, the GPU's the base layout; synchronous on cudaStreamPerThread.
void ggml_ext_cuda_set_base_layout(ggml_tensor * t, const void * data, size_t offset, size_t size);
void ggml_ext_cuda_get_base_layout(const ggml_tensor * t, void * data, size_t offset, size_t size);
void ggml_ext_cuda_set_base_layout_2d(ggml_tensor * t, const void * data, size_t offset, size_t size, size_t n_copies,
                                      size_t stride_tensor, size_t stride_data);
void ggml_ext_cuda_get_base_layout_2d(const ggml_tensor * t, void * data, size_t offset, size_t size, size_t n_copies,
                                      size_t stride_tensor, size_t stride_data);

// supports_op: the node as ggml-cuda holds it. `op` itself when no registered type is involved; a copy
// whose weights carry their base type for a MUL_MAT that reads them as whole row groups; nullptr (refuse)
// for anything else that involves them.
struct ggml_ext_cuda_node_copy {
    ggml_tensor node;
    ggml_tensor src0;
};
const ggml_tensor * ggml_ext_cuda_base_layout_op(const ggml_tensor * op, ggml_ext_cuda_node_copy & copy);

// For the lifetime of the object, every source of a node of `cgraph` with a registered type carries its
// base type (graph_optimize and graph_compute enqueue upstream's kernels for the base type); restored after.
struct ggml_ext_cuda_base_layout_graph {
    explicit ggml_ext_cuda_base_layout_graph(ggml_cgraph * cgraph);
    ~ggml_ext_cuda_base_layout_graph();
    ggml_ext_cuda_base_layout_graph(const ggml_ext_cuda_base_layout_graph &) = delete;
    ggml_ext_cuda_base_layout_graph & operator=(const ggml_ext_cuda_base_layout_graph &) = delete;

    std::vector<std::pair<ggml_tensor *, ggml_type>> changed;
};

// ---- ggml-ext's own quantized types: the codebooks CB2 / CB3 (codebooks_cuda.cu, patch 0410), and APQ ----
// APQ is "own" too (no upstream kernel may see it), but a plain MUL_MAT of it only answers the loader's
// supports_op question (ggml_ext_cuda_anyprec_supports_mul_mat); APQ_MUL_MAT computes it (apq_mul_mat.cu).
// Their bytes are held as they are; ggml_cuda_mul_mat sends them here first: the mat-vec for up to
// GGML_EXT_CODEBOOKS_MMV_MAX tokens, else ggml-cuda's cuBLAS path on weights dequantized by the converters below.

#define GGML_EXT_CODEBOOKS_MMV_MAX 8

// true for CB2 / CB3 / APQ (no upstream kernel may see them: MMVQ / MMQ and their fusions are skipped)
bool ggml_ext_cuda_own_type(ggml_type type);
// supports_op for a MUL_MAT / MUL_MAT_ID node whose weights (src0) are of an own type
bool ggml_ext_cuda_supports_own_mul_mat(int device, const ggml_tensor * op);
// y = W x by the mat-vec kernel on ctx's stream; false (nothing run) when the node is not for it
// (more than GGML_EXT_CODEBOOKS_MMV_MAX tokens, f16 activations, ...): the caller runs cuBLAS instead.
bool ggml_ext_cuda_mul_mat_vec_own(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                                   ggml_tensor * dst);

// contiguous blocks -> k values (convert.cu's ggml_get_to_fp*_cuda for the own types; nullptr for others)
template <typename T> using ggml_ext_to_cuda_t = void (*)(const void * x, T * y, int64_t k, cudaStream_t stream);
ggml_ext_to_cuda_t<float>       ggml_ext_cuda_get_to_fp32(ggml_type type);
ggml_ext_to_cuda_t<half>        ggml_ext_cuda_get_to_fp16(ggml_type type);
ggml_ext_to_cuda_t<nv_bfloat16> ggml_ext_cuda_get_to_bf16(ggml_type type);

// ---- the KVQuant cache types NUQ4 / NUQ3 / NUQ2 with the cache in VRAM (kvquant_cuda.cu, patch 0421) ----
// true for a node with a NUQ tensor among itself and its sources: supports_op and compute_forward ask the two below
bool ggml_ext_cuda_kvquant_involved(const ggml_tensor * op);
// SET_ROWS / CPY f32 -> NUQ, CPY NUQ -> f32 / f16, GET_ROWS NUQ -> f32, FLASH_ATTN_EXT with a NUQ V; false for
// anything else with these types (the scheduler then keeps it off this device)
bool ggml_ext_cuda_kvquant_supports(int device, const ggml_tensor * op);
// runs such a node on ctx's stream; false when no NUQ tensor is involved (upstream's switch runs it)
bool ggml_ext_cuda_kvquant_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// ---- the KVQuant decode op's nodes with the cache in VRAM (kvquant_attn_cuda.cu; ggml-ext-kvquant.h) ----
// supports_op / compute_forward of the table, partial and combine nodes (ggml_ext_kvquant_attn_node_kind), through
// ggml_ext_cuda_kvquant_supports / _forward
bool ggml_ext_cuda_kvquant_attn_supports(int device, const ggml_tensor * op);
void ggml_ext_cuda_kvquant_attn_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
