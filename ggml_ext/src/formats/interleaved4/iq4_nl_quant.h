// IQ4_NL quantizer of ggml-ext (plain IQ4_NL, ggml type 20): per 32-weight block the fp16
// scale d that minimises the importance-weighted squared error sum_i w_i (x_i - d * kvalues[q_i])^2.
// Bytes are ggml's block_iq4_nl: fp16 d, then 16 bytes, weight j in the low nibble of qs[j]
// and weight j + 16 in the high nibble (FORMATS.md).
#pragma once

#include "common/blocks.h"  // ggml_ext_block_iq4_nl, GGML_EXT_IQ4_NL_VALUES
#include "ggml-ext.h"

#include <stdint.h>

// One block of 32 finite floats with the default weighting; importance: the block's 32
// imatrix values or NULL. The row functions in ggml-ext.h are the API.
void ggml_ext_iq4_nl_quantize_block(const float * x, const float * importance, ggml_ext_block_iq4_nl * y);

// Dequantize n_blocks blocks (the reference the tests compare ggml's dequantizer with).
void ggml_ext_iq4_nl_dequantize(const ggml_ext_block_iq4_nl * x, float * y, int64_t n_blocks);
