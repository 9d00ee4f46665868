// The family table: what each family (the FAMILY column of ggml-ext-types.def, enum ggml_ext_family in
// ggml-ext.h) implements for the hooks ggml-ext.h declares. A hook looks the type up in the registry
// (common/registry.c) and calls its family's entry; a family answers only for its own types.
//
// The operations are split by the library that holds them, one table per library, each indexed by family:
// ggml-base is loaded without ggml-cpu (gguf tools, byte checks), and the standalone kernel libraries
// (scripts/kernel_sources.py) hold no ggml at all, so no table may point into a library its holder lacks.
//   struct ggml_ext_family_base     ggml-base: quantize a chunk, validate a row        backend/families_base.c
//   struct ggml_ext_family_kernels  ggml-cpu and the kernel libraries: kernel report   formats/families.c
//   struct ggml_ext_family_cpu      ggml-cpu: supports_op, mul_mat                     backend/families_cpu.c
// ggml-cuda's per-family hooks are a table of the same kind (struct ggml_ext_cuda_family, cuda/ggml-ext-cuda.cuh).
// A family with nothing to say for an entry leaves it NULL: the hook then answers for "not ours".
//
// Adding a family: its enum value in ggml-ext.h, its rows in the .def, the functions below in its folders, and
// one line in each table (docs/DEVELOPING.md "Adding a type").
#pragma once

#include "ggml-ext.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;
struct ggml_tensor;

struct ggml_ext_family_base {
    // ggml_quantize_chunk of rows [start / n_per_row, + nrows): bytes written, 0 when the family cannot
    size_t (*quantize_chunk)(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                             int64_t n_per_row, const float * imatrix);
    // ggml_validate_row_data: false (with the reason on stderr) for bytes no kernel of the type may read
    bool (*validate_row)(int type, const void * data, size_t nbytes);
};

struct ggml_ext_family_kernels {
    // the implementation that runs the type's mat-vec (gemm 0) or mat-mat (gemm 1) on this CPU
    const char * (*dispatched_kernel)(int type, int gemm);
};

struct ggml_ext_family_cpu {
    // the CPU backend's supports_op for a node involving the family's types
    bool (*supports_op)(const struct ggml_tensor * op);
    // ggml-cpu's mul_mat of a weight of the family: false when it leaves the node to ggml
    bool (*mul_mat)(const struct ggml_compute_params * params, struct ggml_tensor * dst);
};

// The entry of a type's family in each table; NULL for a type that is not ggml-ext's.
const struct ggml_ext_family_base *    ggml_ext_family_base_of(int type);     // ggml-base
const struct ggml_ext_family_kernels * ggml_ext_family_kernels_of(int type);  // ggml-cpu, kernel libraries
const struct ggml_ext_family_cpu *     ggml_ext_family_cpu_of(int type);      // ggml-cpu

// ---- each family's entries ----

// interleaved4 (backend/interleaved4_base.c, interleaved4_cpu.c, formats/interleaved4/dispatch.c)
size_t       ggml_ext_interleaved4_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start,
                                                          int64_t nrows, int64_t n_per_row, const float * imatrix);
bool         ggml_ext_interleaved4_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_interleaved4_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_interleaved4_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_interleaved4_dispatched_kernel(int type, int gemm);

// codebooks (backend/codebooks_base.c, codebooks_cpu.c, formats/codebooks/dispatch.c)
size_t       ggml_ext_codebooks_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start,
                                                       int64_t nrows, int64_t n_per_row, const float * imatrix);
bool         ggml_ext_codebooks_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_codebooks_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_codebooks_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_codebooks_dispatched_kernel(int type, int gemm);

// anyprec (backend/anyprec_base.c, anyprec_cpu.c, formats/anyprec/dispatch.c; the op: ops/apq_mul_mat*.c)
size_t       ggml_ext_anyprec_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start,
                                                     int64_t nrows, int64_t n_per_row, const float * imatrix);
bool         ggml_ext_anyprec_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_anyprec_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_anyprec_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_anyprec_dispatched_kernel(int type, int gemm);

// kvquant cache types (backend/kvquant_base.c, kvquant_cpu.c; the cache rows are scalar C: formats/families.c)
size_t ggml_ext_kvquant_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                               int64_t n_per_row, const float * imatrix);
bool   ggml_ext_kvquant_validate_row_data(int type, const void * data, size_t nbytes);
bool   ggml_ext_kvquant_cpu_supports_op(const struct ggml_tensor * op);
bool   ggml_ext_kvquant_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
