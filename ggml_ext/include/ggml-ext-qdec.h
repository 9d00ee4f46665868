// QDEC in llama.cpp (docs/QDEC.md, "In llama.cpp"): the side file of `ggml-ext calibrate dec`, mapped by
// src/llama/qdec.c (in libllama); patch 0330 (the model loader), 0331 (common's
// --dec / --dec-k / --dec-ntb / --dec-config), 0440 (ggml-cuda reads the residual buffer in place).
// Its own header so that the llama sources including ggml-ext-llama.h need no rebuild for it.
#pragma once

#include "ggml-ext.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_context;
struct ggml_tensor;

// The side file (a GGUF of general.type "qdec") models loaded from now on use: set here (llama tools:
// --dec FILE), else the environment's GGML_EXT_DEC. NULL goes back to the environment. Returns 0.
GGML_EXT_API int          ggml_ext_llama_set_dec(const char * path);
GGML_EXT_API const char * ggml_ext_llama_dec(void);

// k_chunk (channels compensated per 1024 input channels; 0 = off) and n_tb (thread blocks of the CUDA
// kernel; 0 = one per SM) per linear type: "16" (every type) or "qkv=16,o=8,gateup=16,down=32" (types
// not named keep their value). Defaults: k_chunk 16, n_tb 0; then GGML_EXT_DEC_CONFIG (a tuner config,
// below), GGML_EXT_DEC_K, GGML_EXT_DEC_NTB; then what is set here (spec NULL: back to the environment).
// Graphs built from then on use them (a graph llama.cpp reuses keeps its values). 0, or -1 with why in err.
GGML_EXT_API int ggml_ext_llama_set_dec_k(const char * spec, char * err, size_t n);
GGML_EXT_API int ggml_ext_llama_set_dec_ntb(const char * spec, char * err, size_t n);

// A config of `ggml-ext tune dec` (JSON with string fields "dec_k" and "dec_ntb" in the syntax above): read
// now, its values under --dec-k / --dec-ntb. NULL: back to the environment. 0, or -1 with why in err.
GGML_EXT_API int ggml_ext_llama_set_dec_config(const char * path, char * err, size_t n);

// The model loader (patch 0330): each weight as it is created (NULL when it may be used, else why not: a
// side file that cannot be read, or not of this model), and once all are created (NULL, or why not: a
// side file covering linears this model lacks; partial: a model that takes part of its file's tensors, not
// checked for coverage). Nothing happens when no side file is given.
GGML_EXT_API const char * ggml_ext_llama_dec_attach(struct ggml_tensor * w);
GGML_EXT_API const char * ggml_ext_llama_dec_done(bool partial);

// The token count of the ubatch whose graph this thread builds from now on (patch 0330, llm_graph_context):
// QDEC compensates only in graphs of one token. A prefill's graph also feeds single rows to the last
// layer's linears when only the last token's logits are asked for: the count, not the rows, decides.
GGML_EXT_API void ggml_ext_llama_dec_graph_tokens(uint32_t n_tokens);

// The linear hook's QDEC rule (ggml_ext_llama_linear): result + the residual of w's selected channels
// when w has a residual in the side file, the graph is of one token (and cur one row), and w's k_chunk is
// not 0; else result.
GGML_EXT_API struct ggml_tensor * ggml_ext_llama_dec_linear(struct ggml_context * ctx, struct ggml_tensor * w,
                                                            struct ggml_tensor * cur, struct ggml_tensor * result);

// The name of the buffer type that holds the mapped side file (host memory; ggml-cuda reads it in place,
// pinned and mapped with ggml_ext_cuda_qdec_pin, patch 0440).
#define GGML_EXT_QDEC_HOST_BUFT_NAME "GGML_EXT_DEC_Host"

#ifdef __cplusplus
}
#endif
