// ggml-base side of the interleaved Q4_0 types 31-33 and IQ4_NL types 36-38: what ggml.c,
// ggml-quants.c and gguf.cpp call through their hooks (shape rule, ggml_quantize_chunk,
// row validation).
#include "../iq4_nl_interleaved.h"
#include "ggml-ext.h"

#include <stdio.h>
#include <stdlib.h>

// Type ids 31, 32, 33 and 36, 37, 38 are the layouts 0, 1, 2 (FORMATS.md). The layout
// traits tables live with the kernels in ggml-cpu; ggml-base needs only N and the name.
static const int          layout_rows[GGML_EXT_Q4_0_N_LAYOUTS]    = { 4, 4, 8 };
static const char * const layout_names[GGML_EXT_Q4_0_N_LAYOUTS]   = { "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8" };
static const char * const iq4_nl_names[GGML_EXT_Q4_0_N_LAYOUTS]   = { "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8" };

static int layout_of(int type) {
    if (type >= 31 && type <= 33) {
        return type - 31;
    }
    return type >= 36 && type <= 38 ? type - 36 : -1;
}

int ggml_ext_type_row_group(int type) {
    const int layout = layout_of(type);
    return layout < 0 ? 0 : layout_rows[layout];
}

const char * ggml_ext_check_tensor_shape(int type, const int64_t * ne) {
    const int n = ggml_ext_type_row_group(type);
    if (n == 0) {
        return NULL;
    }
    // Each matrix (ne[0] x ne[1]) is interleaved on its own, so ne[1] carries the rule.
    if (ne[1] % n != 0) {
        if (type >= 36) {
            return n == 4 ? "interleaved IQ4_NL type needs a row count (ne[1]) divisible by 4"
                          : "interleaved IQ4_NL type needs a row count (ne[1]) divisible by 8";
        }
        return n == 4 ? "interleaved Q4_0 type needs a row count (ne[1]) divisible by 4"
                      : "interleaved Q4_0 type needs a row count (ne[1]) divisible by 8";
    }
    return NULL;
}

size_t ggml_ext_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                               int64_t n_per_row) {
    const int layout = layout_of(type);
    if (layout < 0 || type > 33 || n_per_row <= 0 || start % n_per_row != 0) {
        return 0;
    }
    const int64_t first = start / n_per_row;
    const int     n     = ggml_ext_type_row_group(type);
    if (first % n != 0) {
        fprintf(stderr, "ggml_ext_quantize_chunk: first row %lld is not a multiple of %d\n", (long long) first, n);
        return 0;
    }
    const size_t row_bytes = (size_t) (n_per_row / GGML_EXT_QK4_0) * sizeof(ggml_ext_block_q4_0);
    const int    rc        = ggml_ext_quantize_q4_0_interleaved((enum ggml_ext_q4_0_layout) layout, src + start,
                                                                (char *) dst + first * row_bytes, nrows, n_per_row);
    if (rc != 0) {
        fprintf(stderr, "ggml_ext_quantize_chunk: %lld rows of %lld weights do not fit %s (error %d)\n",
                (long long) nrows, (long long) n_per_row, layout_names[layout], rc);
        return 0;
    }
    return (size_t) nrows * row_bytes;
}

size_t ggml_ext_quantize_chunk_imatrix(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                                       int64_t n_per_row, const float * imatrix) {
    const int layout = layout_of(type);
    if (layout < 0 || type < 36) {
        return type >= 31 && type <= 33 ? ggml_ext_quantize_chunk(type, src, dst, start, nrows, n_per_row) : 0;
    }
    if (n_per_row <= 0 || start % n_per_row != 0 || n_per_row % GGML_EXT_QK4_NL != 0) {
        return 0;
    }
    const int64_t first = start / n_per_row;
    const int     n     = layout_rows[layout];
    if (first % n != 0 || nrows <= 0 || nrows % n != 0) {
        fprintf(stderr, "ggml_ext_quantize_chunk: rows [%lld, +%lld) are not whole groups of %d for %s\n",
                (long long) first, (long long) nrows, n, iq4_nl_names[layout]);
        return 0;
    }
    const size_t row_bytes = (size_t) (n_per_row / GGML_EXT_QK4_NL) * sizeof(ggml_ext_block_iq4_nl);
    // quantize and interleave one row group at a time: a small scratch, whatever nrows
    ggml_ext_block_iq4_nl * tmp = malloc((size_t) n * row_bytes);
    if (!tmp) {
        fprintf(stderr, "ggml_ext_quantize_chunk: out of memory\n");
        return 0;
    }
    char * out = (char *) dst + first * row_bytes;
    for (int64_t g = 0; g < nrows / n; g++) {
        // plain IQ4_NL by ggml-ext's quantizer (the converter's iq4_nl), then the lossless interleave
        const size_t q = ggml_ext_quantize_iq4_nl(src + start + g * n * n_per_row, tmp, n, n_per_row, imatrix);
        const int rc = q == (size_t) n * row_bytes
                           ? ggml_ext_repack_iq4_nl((enum ggml_ext_q4_0_layout) layout, out + g * n * row_bytes, tmp, n, n_per_row)
                           : -1;
        if (rc != 0) {
            fprintf(stderr, "ggml_ext_quantize_chunk: %s of %lld weights per row failed (%d)\n", iq4_nl_names[layout],
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

bool ggml_ext_validate_row_data(int type, const void * data, size_t nbytes) {
    const int n = ggml_ext_type_row_group(type);
    if (n == 0) {
        return true;
    }
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
