// The stock blocks ggml-ext reads and writes, defined once: ggml's Q4_0, IQ4_NL and Q8_0
// (same bytes as ggml-common.h's block_q4_0 / block_iq4_nl / block_q8_0), and the IQ4_NL
// codebook. Families build their interleaved blocks from these (src/formats/<family>/).
#pragma once

#include <stdint.h>

typedef uint16_t ggml_ext_fp16_t;  // IEEE binary16 bits

#define GGML_EXT_QK4_0  32
#define GGML_EXT_QK4_NL 32
#define GGML_EXT_QK8_0  32

// Q4_0: weight j in the low nibble of qs[j], weight j + 16 in the high nibble; value (q - 8) * d.
typedef struct {
    ggml_ext_fp16_t d;
    uint8_t         qs[GGML_EXT_QK4_0 / 2];
} ggml_ext_block_q4_0;

// IQ4_NL has Q4_0's bytes (fp16 d, 16 bytes of nibbles in the same places); a nibble q
// stands for GGML_EXT_IQ4_NL_VALUES[q] * d instead of (q - 8) * d.
typedef ggml_ext_block_q4_0 ggml_ext_block_iq4_nl;

typedef struct {
    ggml_ext_fp16_t d;
    int8_t          qs[GGML_EXT_QK8_0];
} ggml_ext_block_q8_0;

// The IQ4_NL codebook (ggml's kvalues_iq4nl), the one copy of its values: a list, so each
// kernel file can make the constant it needs (an int8_t array, _mm_setr_epi8(...)) and the
// compiler still sees constants.
#define GGML_EXT_IQ4_NL_VALUES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
