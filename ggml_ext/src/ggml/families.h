// Internal: each family's branch of the hooks ggml-ext.h declares. The public hook functions
// (src/ggml/registry_base.c for ggml-base, src/ggml/registry_cpu.c for ggml-cpu) look the type up
// in the registry and call its family's function here; a family answers only for its own types.
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

// interleaved4 (src/ggml/interleaved4_base.c, interleaved4_cpu.c, formats/interleaved4/dispatch.c)
size_t       ggml_ext_i4_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                                int64_t n_per_row, const float * imatrix);
bool         ggml_ext_i4_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_i4_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_i4_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_i4_dispatched_kernel(int type, int gemm);

// codebooks (src/ggml/codebooks_base.c, codebooks_cpu.c, formats/codebooks/dispatch.c)
size_t       ggml_ext_cb_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                                int64_t n_per_row, const float * imatrix);
bool         ggml_ext_cb_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_cb_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_cb_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_cb_dispatched_kernel(int type, int gemm);

// anyprec (src/ggml/anyprec_base.c, anyprec_cpu.c; the op: src/ops/apq_mul_mat*.c)
size_t       ggml_ext_apq_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start,
                                                 int64_t nrows, int64_t n_per_row, const float * imatrix);
bool         ggml_ext_apq_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_apq_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_apq_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_apq_dispatched_kernel(int type, int gemm);  // formats/anyprec/dispatch.c

// kvquant cache types (src/ggml/kvquant_base.c, kvquant_cpu.c)
size_t ggml_ext_kvq_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                           int64_t n_per_row, const float * imatrix);
bool   ggml_ext_kvq_validate_row_data(int type, const void * data, size_t nbytes);
bool   ggml_ext_kvq_cpu_supports_op(const struct ggml_tensor * op);
bool   ggml_ext_kvq_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
