// libFuzzer harness for llama.cpp's model loader up to the vocabulary (vocab_only): the input is
// a GGUF file (passed through a memfd, as llama_model_load_from_file wants a path). When it
// loads, a fixed text is tokenized and every token converted back to text, which walks the
// vocabulary's tables. A refused file is fine; an abort or a sanitizer report is a crash.
#include "fuzz_file.h"
#include "llama.h"

#include <string.h>

static int fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int * argc, char *** argv) {
    (void) argc; (void) argv;
    llama_log_set(fuzz_quiet, NULL);
    llama_backend_init();
    fd = fuzz_file_open("fuzz.gguf", path, sizeof path);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    fuzz_file_write(fd, data, size);
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (model == NULL) {
        return 0;
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    static const char text[] = "Hello, world! 123 <s> \xc3\xa9t\xc3\xa9\n  x";
    llama_token toks[64];
    const int n = llama_tokenize(vocab, text, (int) strlen(text), toks, 64, true, true);
    char piece[256];
    for (int i = 0; i < n; i++) {
        llama_token_to_piece(vocab, toks[i], piece, sizeof piece, 0, true);
    }
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (int i = 0; i < n_vocab && i < 512; i++) {
        llama_token_to_piece(vocab, i, piece, sizeof piece, 0, true);
    }
    llama_model_free(model);
    return 0;
}
