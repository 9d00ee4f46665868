// libFuzzer harness for the QDEC side-file reader (ggml_ext/src/llama/qdec.c, compiled into this program so
// that each input is opened afresh: the library keeps every side file it opened mapped for the process).
// The input is a side file (`ggml-ext calibrate dec`), passed through a memfd as --dec would name it:
//  1. file_open: header, version, keys, every tensor inside the file;
//  2. for each residual "<w>.dec_r", a weight w of the shape the file states (outputs x inputs, of the base
//     type it records when that type can hold the row) is attached as the model loader would
//     (ggml_ext_llama_dec_attach: shape, scales, bounds, base type), the load finished (dec_done), and the
//     decode graph's op built for each weight that took a residual (ggml_ext_llama_dec_linear, no compute).
// A refusal is fine; an abort or a sanitizer report is a crash.
#include "fuzz_file.h"
#include "llama/qdec.c"

static int  fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int * argc, char *** argv) {
    (void) argc; (void) argv;
    ggml_log_set(fuzz_quiet, NULL);
    fd = fuzz_file_open("qdec.gguf", path, sizeof path);
    return 0;
}

// A weight type that can hold rows of k values: the recorded one when it can, else F32.
static enum ggml_type weight_type(int recorded, int64_t k) {
    if (recorded >= 0 && recorded < GGML_TYPE_COUNT && ggml_blck_size((enum ggml_type) recorded) > 0 &&
        k % ggml_blck_size((enum ggml_type) recorded) == 0) {
        return (enum ggml_type) recorded;
    }
    return GGML_TYPE_F32;
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    fuzz_file_write(fd, data, size);
    char              err[512];
    struct dec_file * f = file_open(path, err, sizeof(err));
    if (f == NULL) {
        return 0;
    }
    // the one side file of the process, as file_get would keep it
    dec_files[0] = f;
    dec_n_files  = 1;
    ggml_ext_llama_set_dec(path);
    struct ggml_init_params ip  = { /*.mem_size =*/ 1024 * ggml_tensor_overhead() + (1 << 20), /*.mem_buffer =*/ NULL,
                                    /*.no_alloc =*/ true };
    struct ggml_context *   ctx = ggml_init(ip);
    struct ggml_tensor *    ws[64];
    int                     n_w = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(f->gguf) && n_w < 64; i++) {
        const char * name = gguf_get_tensor_name(f->gguf, i);
        if (!has_suffix(name, ".dec_r")) {
            continue;
        }
        const struct ggml_tensor * r = ggml_get_tensor(f->meta, name);
        if (r->ne[0] > (1 << 24) || r->ne[1] > (1 << 24)) {
            continue;  // no linear of a model is this large; a weight of it would not fit ggml's sizes
        }
        char wname[GGML_MAX_NAME];
        snprintf(wname, sizeof(wname), "%.*s", (int) (strlen(name) - strlen(".dec_r")), name);
        const int64_t K = r->ne[1] > 0 ? r->ne[1] : 1, M = r->ne[0] > 0 ? 2 * r->ne[0] : 1;
        struct ggml_tensor * w = ggml_new_tensor_2d(ctx, weight_type(recorded_type(f, wname), K), K, M);
        ggml_set_name(w, wname);
        if (ggml_ext_llama_dec_attach(w) == NULL) {
            ws[n_w++] = w;
        }
    }
    ggml_ext_llama_dec_done(false);
    ggml_ext_llama_dec_graph_tokens(1);
    for (int i = 0; i < n_w; i++) {  // decode: one token through each compensated linear
        struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ws[i]->ne[0], 1);
        struct ggml_tensor * y = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ws[i]->ne[1], 1);
        ggml_ext_llama_dec_linear(ctx, ws[i], x, y);
    }
    ggml_ext_llama_dec_graph_tokens(0);
    // forget this input: the weights' entries, the side file
    dec_count     = 0;
    dec_n_files   = 0;
    dec_load_file = NULL;
    dec_matched   = 0;
    ggml_ext_llama_set_dec(NULL);
    file_free(f);
    ggml_free(ctx);
    return 0;
}
