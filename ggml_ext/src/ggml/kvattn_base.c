// Which node of the KVQuant decode op (ggml-ext-kvattn.h) a tensor is, for every backend: the op's three
// GGML_OP_CUSTOM nodes carry, as their userdata, the address of one of the tags below (ggml-base: the CPU
// functions in ggml-cpu set them, ggml-cuda's supports_op and compute_forward recognise them without linking
// ggml-cpu). The CPU functions ignore their userdata.
#include "ggml-ext-kvattn.h"
#include "ggml-impl.h"

#include <string.h>

static char kva_tags[3] = { 't', 'p', 'c' };  // only their addresses matter

void * ggml_ext_kvq_attn_tag(int kind) {
    return kind >= GGML_EXT_KVA_TABLE && kind <= GGML_EXT_KVA_COMBINE ? &kva_tags[kind - 1] : NULL;
}

int ggml_ext_kvq_attn_node_kind(const struct ggml_tensor * node) {
    if (!node || node->op != GGML_OP_CUSTOM) {
        return 0;
    }
    struct ggml_custom_op_params cp;
    memcpy(&cp, node->op_params, sizeof(cp));
    for (int kind = GGML_EXT_KVA_TABLE; kind <= GGML_EXT_KVA_COMBINE; kind++) {
        if (cp.userdata == &kva_tags[kind - 1]) {
            return kind;
        }
    }
    return 0;
}
