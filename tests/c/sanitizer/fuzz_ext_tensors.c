// libFuzzer harness for loading and validating ggml-ext's own tensor types: CB2 / CB3 (codebooks), APQ with
// its tables (any-precision), the interleaved Q4_0 / IQ4_NL types. The input is a GGUF file:
//  1. gguf_init_from_buffer with the data (as llama.cpp's loader reads it);
//  2. what the model loader checks first: the file's format versions and any-precision keys against its
//     tensors (ggml_ext_llama_check_model_file);
//  3. each tensor's rows through ggml_validate_row_data (llama.cpp's check_tensors);
//  4. a weight's companions attached as the loader does (an APQ weight's tables, an OOC side-car:
//     ggml_ext_llama_companion_name / ggml_ext_llama_attach_companion);
//  5. what validated is read: small tensors through their type's to_float, an APQ weight with usable
//     tables dequantized and multiplied (reference GEMV) at every precision it serves.
// A refusal is fine; an abort or a sanitizer report is a crash.
#include "fuzz_file.h"  // fuzz_quiet
#include "formats/anyprec/anyprec.h"
#include "ggml-ext-llama.h"
#include "ggml-ext-ops.h"
#include "ggml.h"
#include "gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VALUES (1 << 16)  // values dequantized per tensor: the seeds' tensors are small

static float out[MAX_VALUES], xs[MAX_VALUES];

int LLVMFuzzerInitialize(int * argc, char *** argv) {
    (void) argc; (void) argv;
    ggml_log_set(fuzz_quiet, NULL);
    for (int i = 0; i < MAX_VALUES; i++) {
        xs[i] = (float) ((i * 37) % 17) / 8.0f - 1.0f;
    }
    return 0;
}

static void read_apq(const struct ggml_tensor * w, const struct ggml_tensor * tables) {
    const int S = ggml_ext_anyprec_seed_bits(w, tables), P = ggml_ext_anyprec_parent_bits((int) w->type);
    const int64_t k = w->ne[0], n = w->ne[1];
    if (S < 1 || k % 32 != 0 || k > MAX_VALUES || n < 1 || ggml_nbytes(w) < ggml_ext_anyprec_planes_size(P, n, k)) {
        return;
    }
    for (int b = S; b <= P; b++) {
        for (int64_t r = 0; r < n && r < 8; r++) {
            ggml_ext_anyprec_dequantize(w->data, tables->data, r, 1, n, k, S, P, b, out);
        }
        const int64_t nr = n < MAX_VALUES ? n : MAX_VALUES;
        ggml_ext_anyprec_gemv_ref(w->data, tables->data, 0, nr, n, k, S, b, xs, out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    struct ggml_context *   ctx = NULL;
    struct gguf_init_params gp  = { /*.no_alloc =*/ false, /*.ctx =*/ &ctx };
    struct gguf_context *   g   = gguf_init_from_buffer(data, size, gp);
    if (g == NULL) {
        return 0;
    }
    const char * refused = ggml_ext_llama_check_model_file(g, ctx, "fuzz.gguf");
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (!ggml_validate_row_data(t->type, t->data, ggml_nbytes(t))) {
            continue;
        }
        const struct ggml_type_traits * tr = ggml_get_type_traits(t->type);
        if (ggml_ext_type_info_by_id((int) t->type) == NULL) {
            continue;  // stock types: fuzz_gguf's
        }
        if (tr->to_float && ggml_nelements(t) <= MAX_VALUES) {
            tr->to_float(t->data, out, ggml_nelements(t));
        }
        bool required = false;
        for (int ci = 0;; ci++) {
            const char * cname = ggml_ext_llama_companion_name(t, ci, &required);
            if (cname == NULL) {
                break;
            }
            struct ggml_tensor * c = ggml_get_tensor(ctx, cname);
            if (c == NULL || !ggml_validate_row_data(c->type, c->data, ggml_nbytes(c)) ||
                ggml_ext_llama_attach_companion(t, c) != NULL) {
                continue;
            }
            if (refused == NULL && ggml_ext_anyprec_parent_bits((int) t->type) > 0) {
                read_apq(t, c);
            }
        }
    }
    gguf_free(g);
    ggml_free(ctx);
    return 0;
}
