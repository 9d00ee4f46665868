// ggml-base side of the codebooks family (CB2 / CB3): ggml's row-wise type traits (to_float,
// from_float_ref: patch 0100 through the .def's ROWWISE column), ggml_quantize_chunk with the
// importance matrix, and row validation.
#include "common/fp16.h"
#include "formats/codebooks/codebooks.h"
#include "ggml-ext.h"
#include "common/families.h"

#include <stdio.h>

static const struct ggml_ext_type_info * codebooks(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_CODEBOOKS ? t : NULL;
}

// One pair per row of the .def of this family (whose LAYOUT column is the code width).
#define ROW_FUNCTIONS_CODEBOOKS(NAME, BITS)                                                                          \
    void ggml_ext_to_float_##NAME(const void * restrict x, float * restrict y, int64_t k) {                \
        ggml_ext_codebooks_dequantize(BITS, x, y, k / GGML_EXT_QK_CB);                                            \
    }                                                                                                      \
    void ggml_ext_from_float_ref_##NAME(const float * restrict x, void * restrict y, int64_t k) {          \
        if (ggml_ext_codebooks_quantize(BITS, x, y, 1, k, NULL) == 0) {                                           \
            fprintf(stderr, "ggml_ext_from_float_ref_" #NAME ": %lld values are not whole blocks of 256 "  \
                            "or not finite\n", (long long) k);                                             \
        }                                                                                                  \
    }
#define ROW_FUNCTIONS_INTERLEAVED4(NAME, BITS)
#define ROW_FUNCTIONS_ANYPREC(NAME, BITS)
#define ROW_FUNCTIONS_KVQUANT(NAME, BITS)  // backend/kvquant_base.c
#define GGML_EXT_TYPE(NAME, ID, BLCK, TYPE_SIZE, ROWS, CHUNK, GGML_NAME, FAMILY, LAYOUT, ...) \
    ROW_FUNCTIONS_##FAMILY(NAME, LAYOUT)
#include "ggml-ext-types.def"

size_t ggml_ext_codebooks_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                                 int64_t n_per_row, const float * imatrix) {
    const struct ggml_ext_type_info * t = codebooks(type);
    if (!t || n_per_row <= 0 || start % n_per_row != 0) {
        return 0;
    }
    if (n_per_row % GGML_EXT_QK_CB != 0) {
        fprintf(stderr, "ggml_ext_quantize_chunk: %s needs rows of a multiple of %d weights, not %lld\n", t->name,
                GGML_EXT_QK_CB, (long long) n_per_row);
        return 0;
    }
    const size_t row_bytes = (size_t) (n_per_row / GGML_EXT_QK_CB) * (size_t) t->type_size;
    const size_t q         = ggml_ext_codebooks_quantize(t->layout, src + start, (char *) dst + (start / n_per_row) * row_bytes,
                                                         nrows, n_per_row, imatrix);
    if (q == 0 && nrows > 0) {
        fprintf(stderr, "ggml_ext_quantize_chunk: %s: a weight or importance value is not finite (or < 0)\n",
                t->name);
    }
    return q;
}

bool ggml_ext_codebooks_validate_row_data(int type, const void * data, size_t nbytes) {
    const struct ggml_ext_type_info * t = codebooks(type);
    if (!t) {
        return true;
    }
    const size_t bs = (size_t) t->type_size;
    if (nbytes % bs != 0) {
        fprintf(stderr, "ggml_validate_row_data: %zu bytes are not whole %s blocks of %zu bytes\n", nbytes, t->name,
                bs);
        return false;
    }
    const uint8_t * p = (const uint8_t *) data;
    for (size_t i = 0; i < nbytes / bs; i++) {
        ggml_ext_fp16_t d;
        memcpy(&d, p + i * bs, sizeof(d));
        if ((d & 0x7c00) == 0x7c00) {
            fprintf(stderr, "ggml_validate_row_data: found %s value at %s block %zu\n", (d & 0x3ff) ? "nan" : "inf",
                    t->name, i);
            return false;
        }
    }
    return true;
}
