// ggml-ext's ops, ggml-base side: which ids are ours (the rows of ggml-ext-ops.def, appended after
// upstream's ops by patch 0200).
#include "ggml-ext-ops.h"

bool ggml_ext_is_ext_op(int op) {
    return op >= (int) GGML_OP_COUNT - (int) GGML_EXT_OP_COUNT && op < (int) GGML_OP_COUNT;
}
