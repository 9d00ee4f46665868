// Checks on a model's hyper-parameters as read from GGUF, called by the patched
// loader where upstream would GGML_ASSERT (abort the whole process, including
// a Python host) or accept a value that aborts later, at the first decode.
#include "ggml-ext.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

static _Thread_local char message[256];

const char * ggml_ext_check_block_count(uint32_t n_layer, uint32_t max_layers) {
    if (n_layer == 0 || n_layer > max_layers) {
        snprintf(message, sizeof(message), "invalid block_count %u (must be 1..%u)", n_layer, max_layers);
        return message;
    }
    return NULL;
}

const char * ggml_ext_check_hparams(uint32_t n_ctx_train, float f_norm_eps, float f_norm_rms_eps,
                                    float rope_freq_base, float rope_freq_scale) {
    if (n_ctx_train == 0 || n_ctx_train > INT32_MAX) {
        // llama.cpp hands n_ctx_train out as int32_t; 0 gives every slot an empty context
        snprintf(message, sizeof(message), "invalid context_length %u (must be 1..%d)", n_ctx_train, INT32_MAX);
        return message;
    }
    if (!isfinite(f_norm_eps) || f_norm_eps < 0.0f) {
        snprintf(message, sizeof(message), "invalid layer_norm_epsilon %g (must be finite and >= 0)", f_norm_eps);
        return message;
    }
    if (!isfinite(f_norm_rms_eps) || f_norm_rms_eps < 0.0f) {
        snprintf(message, sizeof(message), "invalid layer_norm_rms_epsilon %g (must be finite and >= 0)",
                 f_norm_rms_eps);
        return message;
    }
    // RoPE with base 0 (or NaN) turns every attention score into NaN: soft_max asserts, or the logits are NaN
    if (!isfinite(rope_freq_base) || rope_freq_base <= 0.0f) {
        snprintf(message, sizeof(message), "invalid rope.freq_base %g (must be finite and > 0)", (double) rope_freq_base);
        return message;
    }
    if (!isfinite(rope_freq_scale) || rope_freq_scale <= 0.0f) {
        snprintf(message, sizeof(message), "invalid RoPE frequency scale %g (must be finite and > 0)", (double) rope_freq_scale);
        return message;
    }
    return NULL;
}
