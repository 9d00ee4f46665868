// Which node of the KVQuant decode op (ggml-ext-kvquant.h) a tensor is, for every backend: the op's three
// GGML_OP_CUSTOM nodes carry, as their userdata, the address of one of the tags below (ggml-base: the CPU
// functions in ggml-cpu set them, ggml-cuda's supports_op and compute_forward recognise them without linking
// ggml-cpu). The CPU functions ignore their userdata.
#include "common/settings.h"
#include "ggml-ext-kvquant.h"
#include "ggml-impl.h"

#include <stdlib.h>
#include <string.h>

static char kva_tags[3] = { 't', 'p', 'c' };  // only their addresses matter

void * ggml_ext_kvquant_attn_tag(int kind) {
    return kind >= GGML_EXT_KVQUANT_ATTN_TABLE && kind <= GGML_EXT_KVQUANT_ATTN_COMBINE ? &kva_tags[kind - 1] : NULL;
}

int ggml_ext_kvquant_attn_node_kind(const struct ggml_tensor * node) {
    if (!node || node->op != GGML_OP_CUSTOM) {
        return 0;
    }
    struct ggml_custom_op_params cp;
    memcpy(&cp, node->op_params, sizeof(cp));
    for (int kind = GGML_EXT_KVQUANT_ATTN_TABLE; kind <= GGML_EXT_KVQUANT_ATTN_COMBINE; kind++) {
        if (cp.userdata == &kva_tags[kind - 1]) {
            return kind;
        }
    }
    return 0;
}

// Whether the lane kernel of the decode op on CUDA (cuda/kvquant_attn_cuda.cu's k_lanes) takes NUQ K and V rows of head
// dim hd (== hd_v): at 64, 128 and 256, unless GGML_EXT_KV_ATTN_SPLIT=0 (debug, read at every call:
// tests/c/test_kvattn_cuda.cpp runs the block kernel, its fallback, that way). One rule for the kernel's launch and
// llama/kvquant_cache.c's cell ranges (which it sizes for the kernel that will run); declared by its two callers, so
// the sources that include ggml-ext-kvquant.h need no rebuild.
GGML_EXT_API bool ggml_ext_kvquant_attn_cells(int64_t hd);
bool ggml_ext_kvquant_attn_cells(int64_t hd) {
    return ggml_ext_settings_kv_attn_split() != 0 && (hd == 64 || hd == 128 || hd == 256);
}
