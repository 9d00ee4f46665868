// ggml-base side of the interleaved4 family (interleaved Q4_0 and IQ4_NL): what ggml.c,
// ggml-quants.c and gguf.cpp call through their hooks (shape rule, ggml_quantize_chunk,
// row validation), and the relayout to plain Q4_0 / IQ4_NL that the CUDA backend keeps.
#include "formats/interleaved4/interleaved4.h"
#include "ggml-ext.h"
#include "ggml-quants.h"  // quantize_q4_0: ggml's imatrix Q4_0, which the interleaved Q4_0 types take
#include "common/families.h"

#include <stdio.h>
#include <stdlib.h>

// Which family and layout a type is comes from the registry (ggml-ext-types.def); the
// layout traits tables live with the kernels in ggml-cpu, ggml-base needs only N and the name.
static const struct ggml_ext_type_info * interleaved4(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t && t->family == GGML_EXT_FAMILY_INTERLEAVED4 ? t : NULL;
}

int ggml_ext_type_row_group(int type) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    return t ? t->row_group : 0;
}

const char * ggml_ext_check_tensor_shape(int type, const int64_t * ne) {
    const struct ggml_ext_type_info * t = ggml_ext_type_info_by_id(type);
    if (!t || t->row_group <= 1) {
        return NULL;
    }
    // Each matrix (ne[0] x ne[1]) is interleaved on its own, so ne[1] carries the rule.
    if (ne[1] % t->row_group != 0) {
        return t->shape_rule;
    }
    return NULL;
}

int ggml_ext_base_layout_type(int type) {
    const struct ggml_ext_type_info * t = interleaved4(type);
    return t ? t->base_type : -1;
}

static int relayout(int type, void * dst, const void * src, int64_t nrows, int64_t n_per_row, int to_base) {
    const struct ggml_ext_type_info * t = interleaved4(type);
    if (!t || nrows % t->row_group != 0) {
        return -1;
    }
    const enum ggml_ext_interleaved4_layout layout = (enum ggml_ext_interleaved4_layout) t->layout;
    if (t->base_type == GGML_EXT_BASE_Q4_0) {
        return to_base ? ggml_ext_unpack_q4_0(layout, (ggml_ext_block_q4_0 *) dst, src, nrows, n_per_row)
                       : ggml_ext_repack_q4_0(layout, dst, (const ggml_ext_block_q4_0 *) src, nrows, n_per_row);
    }
    return to_base ? ggml_ext_unpack_iq4_nl(layout, (ggml_ext_block_iq4_nl *) dst, src, nrows, n_per_row)
                   : ggml_ext_repack_iq4_nl(layout, dst, (const ggml_ext_block_iq4_nl *) src, nrows, n_per_row);
}

int ggml_ext_to_base_layout(int type, void * dst, const void * src, int64_t nrows, int64_t n_per_row) {
    return relayout(type, dst, src, nrows, n_per_row, 1);
}

int ggml_ext_from_base_layout(int type, void * dst, const void * src, int64_t nrows, int64_t n_per_row) {
    return relayout(type, dst, src, nrows, n_per_row, 0);
}

size_t ggml_ext_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                               int64_t n_per_row) {
    const struct ggml_ext_type_info * t = interleaved4(type);
    if (!t || t->base_type != GGML_EXT_BASE_Q4_0 || n_per_row <= 0 || start % n_per_row != 0) {
        return 0;
    }
    const int     layout = t->layout;
    const int64_t first = start / n_per_row;
    const int     n     = t->row_group;
    if (first % n != 0) {
        fprintf(stderr, "ggml_ext_quantize_chunk: first row %lld is not a multiple of %d\n", (long long) first, n);
        return 0;
    }
    const size_t row_bytes = (size_t) (n_per_row / GGML_EXT_QK4_0) * sizeof(ggml_ext_block_q4_0);
    const int    rc        = ggml_ext_quantize_q4_0_interleaved((enum ggml_ext_interleaved4_layout) layout, src + start,
                                                                (char *) dst + first * row_bytes, nrows, n_per_row);
    if (rc != 0) {
        fprintf(stderr, "ggml_ext_quantize_chunk: %lld rows of %lld weights do not fit %s (error %d)\n",
                (long long) nrows, (long long) n_per_row, t->name, rc);
        return 0;
    }
    return (size_t) nrows * row_bytes;
}

size_t ggml_ext_interleaved4_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                                    int64_t n_per_row, const float * imatrix) {
    const struct ggml_ext_type_info * t = interleaved4(type);
    if (!t) {
        return 0;
    }
    const int q4_0 = t->base_type == GGML_EXT_BASE_Q4_0;
    if (q4_0 && !imatrix) {
        return ggml_ext_quantize_chunk(type, src, dst, start, nrows, n_per_row);
    }
    if (!q4_0 && t->base_type != GGML_EXT_BASE_IQ4_NL) {
        return 0;
    }
    const int layout = t->layout;
    if (n_per_row <= 0 || start % n_per_row != 0 || n_per_row % GGML_EXT_QK4_NL != 0) {
        return 0;
    }
    const int64_t first = start / n_per_row;
    const int     n     = t->row_group;
    if (first % n != 0 || nrows <= 0 || nrows % n != 0) {
        fprintf(stderr, "ggml_ext_quantize_chunk: rows [%lld, +%lld) are not whole groups of %d for %s\n",
                (long long) first, (long long) nrows, n, t->name);
        return 0;
    }
    _Static_assert(sizeof(ggml_ext_block_q4_0) == sizeof(ggml_ext_block_iq4_nl) && GGML_EXT_QK4_0 == GGML_EXT_QK4_NL,
                   "one scratch row size serves both bases");
    const size_t row_bytes = (size_t) (n_per_row / GGML_EXT_QK4_NL) * sizeof(ggml_ext_block_iq4_nl);
    // quantize the plain type with the importance and interleave it, one row group at a time (a small scratch,
    // whatever nrows): Q4_0 by ggml's imatrix quantizer (llama-quantize --imatrix's values), IQ4_NL by
    // ggml-ext's (the converter's iq4_nl); the interleave is lossless
    void * tmp = malloc((size_t) n * row_bytes);
    if (!tmp) {
        fprintf(stderr, "ggml_ext_quantize_chunk: out of memory\n");
        return 0;
    }
    char * out = (char *) dst + first * row_bytes;
    for (int64_t g = 0; g < nrows / n; g++) {
        const float * rows = src + start + g * n * n_per_row;
        const size_t  q    = q4_0 ? quantize_q4_0(rows, tmp, n, n_per_row, imatrix)
                                  : ggml_ext_quantize_iq4_nl(rows, tmp, n, n_per_row, imatrix);
        const enum ggml_ext_interleaved4_layout l = (enum ggml_ext_interleaved4_layout) layout;
        const int rc = q != (size_t) n * row_bytes ? -1
                       : q4_0                      ? ggml_ext_repack_q4_0(l, out + g * n * row_bytes, tmp, n, n_per_row)
                                                   : ggml_ext_repack_iq4_nl(l, out + g * n * row_bytes, tmp, n, n_per_row);
        if (rc != 0) {
            fprintf(stderr, "ggml_ext_quantize_chunk: %s of %lld weights per row failed (%d)\n", t->name,
                    (long long) n_per_row, rc);
            free(tmp);
            return 0;
        }
    }
    free(tmp);
    return (size_t) nrows * row_bytes;
}

static bool fp16_finite(ggml_ext_fp16_t h, size_t block) {
    if ((h & 0x7c00) == 0x7c00) {
        fprintf(stderr, "ggml_validate_row_data: found %s value at interleaved block %zu\n",
                (h & 0x3ff) ? "nan" : "inf", block);
        return false;
    }
    return true;
}

bool ggml_ext_interleaved4_validate_row_data(int type, const void * data, size_t nbytes) {
    const struct ggml_ext_type_info * t = interleaved4(type);
    if (!t) {
        return true;
    }
    const int    n   = t->row_group;
    const size_t blk = (size_t) n * sizeof(ggml_ext_block_q4_0);
    if (nbytes % blk != 0) {
        fprintf(stderr, "ggml_validate_row_data: %zu bytes are not whole interleaved blocks of %zu bytes\n", nbytes,
                blk);
        return false;
    }
    const uint8_t * p = (const uint8_t *) data;
    for (size_t i = 0; i < nbytes / blk; i++) {
        const ggml_ext_fp16_t * d = (const ggml_ext_fp16_t *) (p + i * blk);
        for (int j = 0; j < n; j++) {
            if (!fp16_finite(d[j], i)) {
                return false;
            }
        }
    }
    return true;
}
