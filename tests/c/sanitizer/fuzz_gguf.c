// libFuzzer harness for the patched gguf.cpp parser and ggml's row validation (which reaches
// ggml_ext's checks for the interleaved Q4_0 ids through the patches' hooks).
//
// Per input:
//  1. gguf_init_from_buffer with no_alloc=false: the tensor data is read into a ggml context;
//     every tensor's rows go through ggml_validate_row_data (as llama.cpp's check_tensors does);
//  2. every key is read back with the getter of its type (arrays element by element);
//  3. the same bytes through a FILE (fmemopen + gguf_init_from_file_ptr) with no_alloc=true
//     must agree with (1) on the counts;
//  4. the parsed metadata is written (gguf_get_meta_data) and parsed again: same keys, same
//     tensor names, types, shapes and offsets.
// A failed parse is fine; an abort, a sanitizer report or a broken property is a crash.
#include "ggml.h"
#include "gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char * text, void * user) {
    (void) level; (void) text; (void) user;
}

#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "fuzz_gguf: property failed: %s (line %d)\n", #cond, __LINE__); abort(); } } while (0)

static volatile uint64_t sink;

// Bytes of one value of a non-string, non-array GGUF type (the GGUF spec's table).
static size_t value_size(enum gguf_type t) {
    switch (t) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
        case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
        case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
        default: return 0;
    }
}   // keeps the reads of step 2 from being optimised away

static void read_all_keys(const struct gguf_context * g) {
    const int64_t n_kv = gguf_get_n_kv(g);
    for (int64_t i = 0; i < n_kv; i++) {
        const char * key = gguf_get_key(g, i);
        CHECK(key != NULL && gguf_find_key(g, key) == i);
        const enum gguf_type t = gguf_get_kv_type(g, i);
        if (t == GGUF_TYPE_STRING) {
            sink += strlen(gguf_get_val_str(g, i));
        } else if (t == GGUF_TYPE_ARRAY) {
            const enum gguf_type at = gguf_get_arr_type(g, i);
            const size_t n = gguf_get_arr_n(g, i);
            if (at == GGUF_TYPE_STRING) {
                for (size_t j = 0; j < n; j++) {
                    sink += strlen(gguf_get_arr_str(g, i, j));
                }
            } else {
                const uint8_t * d = gguf_get_arr_data(g, i);
                const size_t sz = value_size(at);
                CHECK(sz > 0);
                for (size_t j = 0; j < n * sz; j++) {
                    sink += d[j];
                }
            }
        } else {
            const uint8_t * d = gguf_get_val_data(g, i);
            const size_t sz = value_size(t);
            CHECK(sz > 0);
            for (size_t j = 0; j < sz; j++) {
                sink += d[j];
            }
        }
    }
}

static void same_metadata(const struct gguf_context * a, const struct gguf_context * b) {
    CHECK(gguf_get_n_kv(a) == gguf_get_n_kv(b));
    CHECK(gguf_get_n_tensors(a) == gguf_get_n_tensors(b));
    CHECK(gguf_get_alignment(a) == gguf_get_alignment(b));
    for (int64_t i = 0; i < gguf_get_n_kv(a); i++) {
        CHECK(strcmp(gguf_get_key(a, i), gguf_get_key(b, i)) == 0);
        CHECK(gguf_get_kv_type(a, i) == gguf_get_kv_type(b, i));
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(a); i++) {
        CHECK(strcmp(gguf_get_tensor_name(a, i), gguf_get_tensor_name(b, i)) == 0);
        CHECK(gguf_get_tensor_type(a, i) == gguf_get_tensor_type(b, i));
        CHECK(gguf_get_tensor_offset(a, i) == gguf_get_tensor_offset(b, i));
        CHECK(memcmp(gguf_get_tensor_ne(a, i), gguf_get_tensor_ne(b, i), GGML_MAX_DIMS * sizeof(int64_t)) == 0);
    }
}

int LLVMFuzzerInitialize(int * argc, char *** argv) {
    (void) argc; (void) argv;
    ggml_log_set(quiet, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    // 1. allocating parse + row validation
    struct ggml_context * tctx = NULL;
    struct gguf_init_params p = { /*no_alloc =*/ false, /*ctx =*/ &tctx };
    struct gguf_context * g = gguf_init_from_buffer(data, size, p);

    // 3. the FILE path, metadata only
    struct gguf_context * gf = NULL;
    FILE * f = size ? fmemopen((void *) data, size, "rb") : NULL;
    if (f) {
        struct gguf_init_params pf = { /*no_alloc =*/ true, /*ctx =*/ NULL };
        gf = gguf_init_from_file_ptr(f, pf);
        fclose(f);
    }
    if (g == NULL) {
        gguf_free(gf);
        return 0;
    }
    CHECK(tctx != NULL);
    CHECK(gf != NULL);       // what parses with its data also parses without
    same_metadata(g, gf);
    gguf_free(gf);

    // The context holds the data blob, then the tensors in file order (by position, not by
    // name: a file may name a tensor like the blob).
    const size_t data_off = gguf_get_data_offset(g);
    struct ggml_tensor * t = ggml_get_first_tensor(tctx);
    for (int64_t i = 0; i < gguf_get_n_tensors(g); i++) {
        t = ggml_get_next_tensor(tctx, t);
        CHECK(t != NULL);
        CHECK(strcmp(t->name, gguf_get_tensor_name(g, i)) == 0);
        const size_t nbytes = ggml_nbytes(t);
        if (nbytes == 0) {
            continue;   // zero-element tensor: no data, data may be NULL
        }
        CHECK(t->data != NULL);
        CHECK(nbytes == gguf_get_tensor_size(g, i));
        CHECK(data_off + gguf_get_tensor_offset(g, i) + nbytes <= size);
        sink += ggml_validate_row_data(t->type, t->data, nbytes);
    }

    // 2. every key through its getter
    read_all_keys(g);

    // 4. metadata written and read back
    const size_t meta_size = gguf_get_meta_size(g);
    uint8_t * meta = malloc(meta_size);
    CHECK(meta != NULL);
    gguf_get_meta_data(g, meta);
    struct gguf_init_params pm = { /*no_alloc =*/ true, /*ctx =*/ NULL };
    struct gguf_context * g2 = gguf_init_from_buffer(meta, meta_size, pm);
    CHECK(g2 != NULL);
    same_metadata(g, g2);
    gguf_free(g2);
    free(meta);

    ggml_free(tctx);
    gguf_free(g);
    return 0;
}
