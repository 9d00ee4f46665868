// The ggml-base hooks (ggml.c's ggml_quantize_chunk, ggml-quants.c's row validation: patch 0100) for
// every registered type: the registry says the family, the family's code answers (common/families.h).
#include "ggml-ext.h"
#include "common/families.h"

#include <stdio.h>

size_t ggml_ext_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                       int64_t n_per_row, const float * imatrix) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    switch (t ? t->family : 0) {
        case GGML_EXT_FAMILY_INTERLEAVED4:
            return ggml_ext_interleaved4_quantize_chunk_imatrix(type, src, dst, start, nrows, n_per_row, imatrix);
        case GGML_EXT_FAMILY_CODEBOOKS:
            return ggml_ext_codebooks_quantize_chunk_imatrix(type, src, dst, start, nrows, n_per_row, imatrix);
        case GGML_EXT_FAMILY_ANYPREC:
            return ggml_ext_anyprec_quantize_chunk_imatrix(type, src, dst, start, nrows, n_per_row, imatrix);
        case GGML_EXT_FAMILY_KVQUANT:
            return ggml_ext_kvquant_quantize_chunk_imatrix(type, src, dst, start, nrows, n_per_row, imatrix);
        default:
            fprintf(stderr, "ggml_ext_quantize_chunk_imatrix: type %d is not one of ggml-ext's\n", type);
            return 0;
    }
}

bool ggml_ext_validate_row_data(int type, const void * data, size_t nbytes) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    switch (t ? t->family : 0) {
        case GGML_EXT_FAMILY_INTERLEAVED4:
            return ggml_ext_interleaved4_validate_row_data(type, data, nbytes);
        case GGML_EXT_FAMILY_CODEBOOKS:
            return ggml_ext_codebooks_validate_row_data(type, data, nbytes);
        case GGML_EXT_FAMILY_ANYPREC:
            return ggml_ext_anyprec_validate_row_data(type, data, nbytes);
        case GGML_EXT_FAMILY_KVQUANT:
            return ggml_ext_kvquant_validate_row_data(type, data, nbytes);
        default:
            return true;  // not ours: ggml's own cases decide
    }
}
