// ggml-cpu's runtime repack of plain Q4_0 weights into ggml-ext's interleaved layout,
// computed by ggml-ext's kernels (patch 0112 asks ggml_ext_cpu_repack_traits first in
// repack.cpp's ggml_repack_get_optimal_repack_type).
//
// Taken: 2-D Q4_0 weights whose row count divides by the layout's N, on CPUs where our
// kernels beat upstream's repack (x86 AVX2 / AVX-512: Q4_0_8_8). Everything else, and
// everything when GGML_EXT_RUNTIME_REPACK=0, gets upstream's choice.
#pragma once

#include <stdbool.h>

struct ggml_compute_params;
struct ggml_tensor;

#ifdef __cplusplus
extern "C" {
#endif

// interleaved4_cpu.c: mul_mat of a src0 whose bytes are in `layout` (enum
// ggml_ext_interleaved4_layout), whatever its type; the code the types 31-33 run.
void ggml_ext_cpu_mul_mat_q4_0_layout(const struct ggml_compute_params * params, struct ggml_tensor * dst, int layout);

#ifdef __cplusplus
}

namespace ggml::cpu {
class tensor_traits;
}

// Our traits for `cur` (repack at load + compute_forward), or nullptr: upstream decides.
const ggml::cpu::tensor_traits * ggml_ext_cpu_repack_traits(const struct ggml_tensor * cur);
#endif
