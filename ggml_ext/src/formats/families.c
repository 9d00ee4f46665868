// The kernel report's family table (common/families.h): which kernel implementation runs a registered type on
// this CPU (ggml_ext_dispatched_kernel, ggml-ext.h). Compiled into ggml-cpu beside the families' dispatch.c
// files, and into the standalone kernel libraries (scripts/kernel_sources.py).
#include "common/families.h"

// The cache rows' quantize / dequantize (formats/kvquant) are scalar C.
static const char * scalar_only(int type, int gemm) {
    (void) type, (void) gemm;
    return "generic";
}

static const struct ggml_ext_family_kernels families[GGML_EXT_FAMILY_COUNT] = {
    [GGML_EXT_FAMILY_INTERLEAVED4] = { ggml_ext_interleaved4_dispatched_kernel },
    [GGML_EXT_FAMILY_CODEBOOKS]    = { ggml_ext_codebooks_dispatched_kernel },
    [GGML_EXT_FAMILY_ANYPREC]      = { ggml_ext_anyprec_dispatched_kernel },
    [GGML_EXT_FAMILY_KVQUANT]      = { scalar_only },
};

const struct ggml_ext_family_kernels * ggml_ext_family_kernels_of(int type) {
    const int family = ggml_ext_type_family(type);
    return family ? &families[family] : NULL;
}

const char * ggml_ext_dispatched_kernel(int type, int gemm) {
    const struct ggml_ext_family_kernels * f = ggml_ext_family_kernels_of(type);
    return f && f->dispatched_kernel ? f->dispatched_kernel(type, gemm) : NULL;
}
