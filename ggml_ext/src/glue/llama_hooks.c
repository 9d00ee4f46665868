// What patch 0300 calls from llama.cpp: ggml_ext_llama_linear for each weight matmul of the graph,
// ggml_ext_llama_kv_type for the K/V types of each KV cache; patch 0301: the names of ggml-ext's file
// types; patch 0302: which types -sm tensor must not cut. Compiled into libllama.
//
// ggml-ext's own rules go first (none yet: no format of ours needs a side-car or its own KV type, so
// both answer with what llama.cpp asked for); then a registered callback, which tests use to see
// every call and programs may use to try a rule before it becomes one here.
#include "ggml-ext-llama.h"
#include "ggml.h"

#include <stddef.h>
#include <stdio.h>

static ggml_ext_llama_linear_fn  linear_fn;
static void *                    linear_user;
static ggml_ext_llama_kv_type_fn kv_type_fn;
static void *                    kv_type_user;

void ggml_ext_llama_set_linear_hook(ggml_ext_llama_linear_fn fn, void * user) {
    linear_fn   = fn;
    linear_user = user;
}

void ggml_ext_llama_set_kv_type_hook(ggml_ext_llama_kv_type_fn fn, void * user) {
    kv_type_fn   = fn;
    kv_type_user = user;
}

struct ggml_tensor * ggml_ext_llama_linear(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * cur,
                                           struct ggml_tensor * result) {
    if (linear_fn) {
        struct ggml_tensor * t = linear_fn(linear_user, ctx, w, cur, result);
        if (t) {
            result = t;
        }
    }
    return result;
}

int ggml_ext_llama_kv_type(int type, bool is_v, uint32_t n_layer, const char * name_tag) {
    if (kv_type_fn) {
        const int t = kv_type_fn(kv_type_user, type, is_v, n_layer, name_tag ? name_tag : "");
        if (t >= 0 && (t >= GGML_TYPE_COUNT || ggml_blck_size((enum ggml_type) t) == 0)) {
            // ggml_new_tensor would abort on it: say so and keep what was asked for
            fprintf(stderr, "ggml-ext: the KV type hook returned %d, not a ggml type; keeping %s\n", t,
                    ggml_type_name((enum ggml_type) type));
        } else if (t >= 0) {
            type = t;
        }
    }
    return type;
}

// llama_ftype values (llama.h): MOSTLY_Q4_0 is 2, MOSTLY_IQ4_NL 25; upstream removed 33-35
// (MOSTLY_Q4_0_4_4/4_8/8_8, in layout order) and keeps them reserved, and ggml-ext writes them again.
// The types of the other families (own ids 100-119, far above upstream's file types, 0-41) are their
// own file type: a file mostly of CB2 is file type 100, named "CB2 - 2.4375 bpw".
enum { FTYPE_MOSTLY_IQ4_NL = 25, FTYPE_Q4_0_INTERLEAVED_FIRST = 33 };

#define FTYPE_NAME_INTERLEAVED4(NAME, ID, BPW)
#define FTYPE_NAME_CODEBOOKS(NAME, ID, BPW) { ID, "(guessed) " #NAME " - " BPW " bpw" },

static const struct {
    int          ftype;
    const char * name;  // "(guessed) " + the type name: llama_ftype_name drops the prefix for a stored type
} ftype_names[] = {
    { FTYPE_Q4_0_INTERLEAVED_FIRST + 0, "(guessed) Q4_0_4_4" },
    { FTYPE_Q4_0_INTERLEAVED_FIRST + 1, "(guessed) Q4_0_4_8" },
    { FTYPE_Q4_0_INTERLEAVED_FIRST + 2, "(guessed) Q4_0_8_8" },
    // bits per weight: TYPE_SIZE * 8 / BLCK of the .def, written out (78 * 8 / 256, 110 * 8 / 256)
#define BPW_CB2 "2.4375"
#define BPW_CB3 "3.4375"
#define GGML_EXT_TYPE(NAME, ID, BLCK, TYPE_SIZE, ROWS, CHUNK, GGML_NAME, FAMILY, ...) \
    FTYPE_NAME_##FAMILY(NAME, ID, BPW_##NAME)
#include "ggml-ext-types.def"
};

const char * ggml_ext_llama_ftype_name(int ftype, bool guessed) {
    for (size_t i = 0; i < sizeof(ftype_names) / sizeof(ftype_names[0]); i++) {
        if (ftype_names[i].ftype == ftype) {
            return guessed ? ftype_names[i].name : ftype_names[i].name + sizeof("(guessed) ") - 1;
        }
    }
    return NULL;
}

int ggml_ext_llama_ftype_of_type(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    if (t == NULL) {
        return -1;
    }
    if (t->family != GGML_EXT_FAMILY_INTERLEAVED4) {
        return t->id;  // its own file type
    }
    return t->base_type == GGML_TYPE_Q4_0 ? FTYPE_Q4_0_INTERLEAVED_FIRST + t->layout : FTYPE_MOSTLY_IQ4_NL;
}

const char * ggml_ext_llama_split_tensor_refusal(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    if (t == NULL || t->row_group <= 1) {
        return NULL;
    }
    // the meta backend copies row r's bytes [a, b) for a column cut; in an interleaved tensor those
    // bytes hold pieces of row_group rows, so each device would get a mix of rows
    return "this type interleaves several rows per block, which split mode \"tensor\" cannot cut across "
           "devices; use --split-mode layer (the default), or make a plain file with "
           "`ggml-ext repack FILE OUT --layout q4_0` (or iq4_nl)";
}
