// Load one GGUF model the way our tools do (mmap, tensor data validated: check_tensors, which
// runs ggml_validate_row_data and ggml_ext's checks), then tokenize "hi" and decode it.
// Exit 0: loaded and decoded; 1: refused with a message on stderr; 2: usage. Anything else
// (a signal, a sanitizer report) is a bug. Built with ASan/UBSan by tests/fuzz/fuzz_gguf_c.py.
#include "llama.h"

#include <stdio.h>
#include <string.h>

static int refuse(const char * path, const char * what) {
    fprintf(stderr, "load_gguf_model: %s: refused: %s\n", path, what);
    return 1;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    const char * path = argv[1];
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.check_tensors = true;
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (model == NULL) {
        return refuse(path, "llama_model_load_from_file failed");
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 64;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    // ggml's flash-attention kernel (C++) calls ggml_vec_dot_f16 through ggml_vec_dot_t, a cast
    // function type that UBSan's -fsanitize=function reports on every decode (ops.cpp:8976, an
    // upstream pattern, harmless on the ABIs we build for); the plain attention path is C
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == NULL) {
        llama_model_free(model);
        return refuse(path, "llama_init_from_model failed");
    }

    int rc = 0;
    llama_token toks[8];
    const int n = llama_tokenize(llama_model_get_vocab(model), "hi", 2, toks, 8, true, false);
    if (n <= 0) {
        rc = refuse(path, "tokenize failed");
    } else if (llama_decode(ctx, llama_batch_get_one(toks, n)) != 0) {
        rc = refuse(path, "decode failed");
    } else {
        const float * logits = llama_get_logits_ith(ctx, -1);
        const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        double sum = 0;
        for (int i = 0; i < n_vocab; i++) {
            sum += logits[i];
        }
        printf("load_gguf_model: %s: ok, %d tokens decoded, logit sum %g\n", path, n, sum);
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
