// Generated from codebooks_tables.json by `ggml-ext codebooks header`: do not edit (docs/formats/codebooks.md).
// Discovery (Algorithm 1): seed 0, 200000 sub-groups of 16,
// 16 histogram bins, scikit-learn 1.9.1; inputs: smollm2-hf/model.safetensors (sha256 a672150fb4f9), gemma3-hf/model.safetensors (sha256 cf4e53823019).
#pragma once

#include <stdint.h>

#define GGML_EXT_CODEBOOKS_TABLES_VERSION 1

// CB2: 4 codebooks of 4 signed int8 entries, each sorted ascending;
// weight = d * (local scale + 1) * table[codebook][code].
#define GGML_EXT_CB2_N_CODEBOOKS 4
#define GGML_EXT_CB2_N_ENTRIES   4
static const int8_t ggml_ext_cb2_tables[4][4] = {
    { -100,  -37,   16,   88 },
    {  -98,  -36,   30,   94 },
    {  -93,  -25,   31,   98 },
    {  -88,  -16,   35,  100 },
};

// CB3: 4 codebooks of 8 signed int8 entries, each sorted ascending;
// weight = d * (local scale + 1) * table[codebook][code].
#define GGML_EXT_CB3_N_CODEBOOKS 4
#define GGML_EXT_CB3_N_ENTRIES   8
static const int8_t ggml_ext_cb3_tables[4][8] = {
    { -121,  -81,  -50,  -22,    9,   40,   75,  119 },
    { -121,  -81,  -49,  -19,    8,   35,   69,  116 },
    { -120,  -76,  -42,  -10,   17,   43,   76,  120 },
    { -118,  -77,  -44,  -11,   23,   50,   82,  119 },
};
