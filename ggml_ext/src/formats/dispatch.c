// Which kernel implementation runs a registered type on this CPU (ggml_ext_dispatched_kernel,
// ggml-ext.h): the registry says the family, the family's dispatcher answers. Compiled into
// ggml-cpu beside the families' dispatch.c files, and into the standalone kernel library
// (scripts/kernel_sources.py).
#include "ggml-ext.h"
#include "common/families.h"

const char * ggml_ext_dispatched_kernel(int type, int gemm) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    switch (t ? t->family : 0) {
        case GGML_EXT_FAMILY_INTERLEAVED4:
            return ggml_ext_interleaved4_dispatched_kernel(type, gemm);
        case GGML_EXT_FAMILY_CODEBOOKS:
            return ggml_ext_codebooks_dispatched_kernel(type, gemm);
        case GGML_EXT_FAMILY_ANYPREC:
            return ggml_ext_anyprec_dispatched_kernel(type, gemm);
        case GGML_EXT_FAMILY_KVQUANT:  // the cache rows' quantize / dequantize (formats/kvquant) are scalar C
            return "generic";
        default:
            return NULL;
    }
}
