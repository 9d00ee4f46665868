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

// The split kernel of the decode op on CUDA (cuda/kvquant_attn_cuda.cu's k_split) for NUQ K and V rows of head dim hd
// (== hd_v): its register build (4 or 2 blocks per SM), 0 where the block kernel runs. By default at head dim 64
// only (build 4): on the H100 it beat the block kernel on SmolLM2 (hd 64, depth 8192: 260 vs 208 t/s) and lost on
// Gemma-3-270M (hd 256: 276-288 vs 337-342 t/s), docs/RESULTS.md "KVQuant".
// GGML_EXT_KV_ATTN_SPLIT (debug, read at every call: tests/c/test_kvattn_cuda.cpp runs each build): 0 never,
// 2 / 4 that build at head dim 64, 128 or 256. One rule for the kernel's launch and llama/kvquant_cache.c's cell
// ranges (which it sizes for the kernel that will run); declared by its two callers, so the sources that include
// ggml-ext-kvquant.h need no rebuild.
GGML_EXT_API int ggml_ext_kvquant_attn_split_build(int64_t hd);
int ggml_ext_kvquant_attn_split_build(int64_t hd) {
    const int mode = ggml_ext_settings_kv_attn_split();
    if (mode == 0 || (hd != 64 && hd != 128 && hd != 256) || (mode < 0 && hd != 64)) {
        return 0;
    }
    return mode > 0 ? mode : 4;
}
