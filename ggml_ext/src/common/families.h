// Internal: each family's branch of the hooks ggml-ext.h declares. The public hook functions
// (backend/families_base.c for ggml-base, backend/families_cpu.c for ggml-cpu) look the type up
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

// interleaved4 (src/backend/interleaved4_base.c, interleaved4_cpu.c, formats/interleaved4/dispatch.c)
size_t       ggml_ext_interleaved4_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                                int64_t n_per_row, const float * imatrix);
bool         ggml_ext_interleaved4_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_interleaved4_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_interleaved4_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_interleaved4_dispatched_kernel(int type, int gemm);

// codebooks (src/backend/codebooks_base.c, codebooks_cpu.c, formats/codebooks/dispatch.c)
size_t       ggml_ext_codebooks_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                                int64_t n_per_row, const float * imatrix);
bool         ggml_ext_codebooks_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_codebooks_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_codebooks_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_codebooks_dispatched_kernel(int type, int gemm);

// anyprec (src/backend/anyprec_base.c, anyprec_cpu.c; the op: src/ops/apq_mul_mat*.c)
size_t       ggml_ext_anyprec_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start,
                                                 int64_t nrows, int64_t n_per_row, const float * imatrix);
bool         ggml_ext_anyprec_validate_row_data(int type, const void * data, size_t nbytes);
bool         ggml_ext_anyprec_cpu_supports_op(const struct ggml_tensor * op);
bool         ggml_ext_anyprec_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
const char * ggml_ext_anyprec_dispatched_kernel(int type, int gemm);  // formats/anyprec/dispatch.c

// kvquant cache types (src/backend/kvquant_base.c, kvquant_cpu.c)
size_t ggml_ext_kvquant_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                           int64_t n_per_row, const float * imatrix);
bool   ggml_ext_kvquant_validate_row_data(int type, const void * data, size_t nbytes);
bool   ggml_ext_kvquant_cpu_supports_op(const struct ggml_tensor * op);
bool   ggml_ext_kvquant_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
