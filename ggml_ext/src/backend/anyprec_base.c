// ggml-base side of the any-precision family (APQ, docs/formats/anyprec.md): what ggml.c and
// ggml-quants.c ask of every registered type. APQ's bytes are bitplanes, plane-major over the whole
// tensor, so ggml has no row-wise view of them: `ggml-ext convert --method anyprec` writes them (with
// the tables), ggml_quantize_chunk cannot, and every bit pattern is a valid code.
#include "ggml-ext.h"
#include "common/families.h"

#include <stdio.h>

static const struct ggml_ext_type_info * anyprec(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_ANYPREC ? t : NULL;
}

size_t ggml_ext_anyprec_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                               int64_t n_per_row, const float * imatrix) {
    (void) src, (void) dst, (void) start, (void) nrows, (void) n_per_row, (void) imatrix;
    const struct ggml_ext_type_info * t = anyprec(type);
    fprintf(stderr,
            "ggml_ext_quantize_chunk: %s holds a whole matrix's bitplanes plus a separate tables tensor; it is written "
            "by `ggml-ext convert --method anyprec`, not row by row\n",
            t ? t->name : "APQ");
    return 0;
}

bool ggml_ext_anyprec_validate_row_data(int type, const void * data, size_t nbytes) {
    (void) data;
    const struct ggml_ext_type_info * t = anyprec(type);
    if (t && nbytes % (size_t) t->type_size != 0) {
        fprintf(stderr, "ggml_validate_row_data: %zu bytes are not whole %s blocks of %d bytes\n", nbytes, t->name,
                t->type_size);
        return false;
    }
    return true;  // every bit pattern is a code; the tables are an F16 tensor, which ggml validates
}
