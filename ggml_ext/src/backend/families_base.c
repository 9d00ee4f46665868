// The ggml-base family table (common/families.h) and the hooks it answers: ggml.c's ggml_quantize_chunk and
// ggml-quants.c's row validation (patch 0100) for every registered type.
#include "common/families.h"

#include <stdio.h>

static const struct ggml_ext_family_base families[GGML_EXT_FAMILY_COUNT] = {
    [GGML_EXT_FAMILY_INTERLEAVED4] = { ggml_ext_interleaved4_quantize_chunk_imatrix,
                                       ggml_ext_interleaved4_validate_row_data },
    [GGML_EXT_FAMILY_CODEBOOKS]    = { ggml_ext_codebooks_quantize_chunk_imatrix, ggml_ext_codebooks_validate_row_data },
    [GGML_EXT_FAMILY_ANYPREC]      = { ggml_ext_anyprec_quantize_chunk_imatrix, ggml_ext_anyprec_validate_row_data },
    [GGML_EXT_FAMILY_KVQUANT]      = { ggml_ext_kvquant_quantize_chunk_imatrix, ggml_ext_kvquant_validate_row_data },
};

const struct ggml_ext_family_base * ggml_ext_family_base_of(int type) {
    const int family = ggml_ext_type_family(type);
    return family ? &families[family] : NULL;
}

size_t ggml_ext_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                       int64_t n_per_row, const float * imatrix) {
    const struct ggml_ext_family_base * f = ggml_ext_family_base_of(type);
    if (!f || !f->quantize_chunk) {
        fprintf(stderr, "ggml_ext_quantize_chunk_imatrix: type %d is not one of ggml-ext's\n", type);
        return 0;
    }
    return f->quantize_chunk(type, src, dst, start, nrows, n_per_row, imatrix);
}

bool ggml_ext_validate_row_data(int type, const void * data, size_t nbytes) {
    const struct ggml_ext_family_base * f = ggml_ext_family_base_of(type);
    return f && f->validate_row ? f->validate_row(type, data, nbytes) : true;  // not ours: ggml's own cases decide
}
