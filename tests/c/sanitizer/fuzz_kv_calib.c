// libFuzzer harness for the KV-calibration reader (ggml_ext/src/llama/kvquant_cache.c): the input is a
// calibration side file (`ggml-ext calibrate kv`), passed through a memfd as --kv-calib would name it.
// The cache tensors are made the shape the file states (its layers x KV heads x head dim, bounded), of each
// KVQuant type, and bound with and without outliers and rotated keys, as llama.cpp's cache does at context
// creation, with no memory behind them: the reader loads, checks every key and table it would use, and
// refuses or accepts (binding real memory builds kernel tables that live for the process, by design, which
// a fuzzer would count as leaks). A refusal is fine; an abort or a sanitizer report is a crash.
#include "fuzz_file.h"
#include "ggml-ext-kvquant.h"
#include "ggml-ext-llama.h"
#include "gguf.h"

// Two files, used in turn: the reader keeps the file it loaded last by path, and each input must be read.
static int  fds[2] = { -1, -1 };
static char paths[2][64];
static int  turn;

int LLVMFuzzerInitialize(int * argc, char *** argv) {
    (void) argc; (void) argv;
    ggml_log_set(fuzz_quiet, NULL);
    for (int i = 0; i < 2; i++) {
        fds[i] = fuzz_file_open("kv-calib.gguf", paths[i], sizeof paths[i]);
    }
    return 0;
}

static uint32_t key_u32(const struct gguf_context * g, const char * key, uint32_t dflt) {
    const int64_t id = gguf_find_key(g, key);
    return id >= 0 && gguf_get_kv_type(g, id) == GGUF_TYPE_UINT32 ? gguf_get_val_u32(g, id) : dflt;
}

static float key_f32(const struct gguf_context * g, const char * key) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        return 0.0f;
    }
    const enum gguf_type t = gguf_get_kv_type(g, id);
    return t == GGUF_TYPE_FLOAT32 ? gguf_get_val_f32(g, id) : t == GGUF_TYPE_FLOAT64 ? (float) gguf_get_val_f64(g, id) : 0.0f;
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const int fd = fds[turn];
    const char * path = paths[turn];
    turn ^= 1;
    fuzz_file_write(fd, data, size);
    // the shape the file claims (the model's, when it is the right file): n_layer x (heads x head dim)
    uint32_t n_layer = 2, channels = 64;
    float    frac    = 0.0f;
    struct gguf_init_params gp = { /*.no_alloc =*/ true, /*.ctx =*/ NULL };
    struct gguf_context *   g  = gguf_init_from_file(path, gp);
    if (g) {
        n_layer  = key_u32(g, "kvquant.n_layers", 2);
        channels = key_u32(g, "kvquant.n_kv_heads", 1) * key_u32(g, "kvquant.head_dim", 64);
        frac     = key_f32(g, "kvquant.outlier_fraction");
        gguf_free(g);
    }
    if (n_layer < 1 || n_layer > 4) {
        n_layer = n_layer < 1 ? 1 : 4;  // the reader still checks the file's count against the model's
    }
    if (channels < 64 || channels > 4096 || channels % 64) {
        channels = 64;
    }
    struct ggml_init_params ip = { /*.mem_size =*/ 64 * ggml_tensor_overhead(), /*.mem_buffer =*/ NULL,
                                   /*.no_alloc =*/ true };
    struct ggml_context * ctx = ggml_init(ip);
    ggml_ext_llama_set_kv_calib(path);
    static const char * const types[] = { "nuq4", "nuq3", "nuq2" };
    char err[512];
    for (int pass = 0; pass < 2; pass++) {
        // without outliers, then at the file's own fraction (the reader refuses any other)
        const float f = pass ? (frac > 0.0f && frac < 0.5f ? frac : 0.01f) : 0.0f;
        if (ggml_ext_llama_set_kv_outliers(f) != 0) {
            continue;
        }
        for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
            const int type = ggml_ext_kv_cache_type_by_name(types[ti]);
            for (uint32_t il = 0; il < n_layer; il++) {
                for (int role = 0; role < 2; role++) {
                    struct ggml_tensor * t = ggml_new_tensor_2d(ctx, (enum ggml_type) type, channels, 32);
                    ggml_format_name(t, "cache_%c_l%u", role ? 'v' : 'k', il);
                    if (ggml_ext_llama_kv_bind(t, n_layer, err, sizeof(err)) == 0) {
                        ggml_ext_llama_kv_unbind(t);
                    }
                }
            }
            ggml_reset(ctx);
        }
    }
    ggml_ext_llama_set_kv_outliers(0.0f);
    ggml_free(ctx);
    return 0;
}
