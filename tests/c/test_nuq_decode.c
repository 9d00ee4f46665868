// NUQ block decode (formats/kvquant/kvquant_decode.h): every compiled-in SIMD decoder against the scalar
// reference, bit for bit, on random blocks of 2, 3 and 4 bits (value blocks with their own fp16 scales,
// a NaN block among them; key blocks with per-channel scales; runs of 1..7 blocks), and the reference
// against the kvquant row kernel's dequantization (ggml_ext_kvquant_dequantize_v of a one-head 64-channel
// layer, whose value rows these blocks are) on rows that kernel quantized. Prints "implementations: ..."
// and "N passed, M failed"; exit status 1 on a failure. Built by tests/kernels/test_kvquant_c_kernels.py (program "nuq_decode").
#include "common/simd.h"
#include "formats/kvquant/kvquant.h"
#include "formats/kvquant/kvquant_decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t) (rng >> 32);
}
static float uni(void) {
    return (float) (next() >> 8) * (1.0f / 16777216.0f);
}

static void check(int ok, const char * what, int bits, int n) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL %s bits %d n_blocks %d\n", what, bits, n);
    }
}

struct impl {
    const char *           name;
    ggml_ext_kvquant_decode_fn fn;
};

static const struct impl impls[] = {
#ifdef GGML_EXT_HAVE_NEON
    { "neon", ggml_ext_kvquant_block_decode_neon },
#endif
#ifdef GGML_EXT_HAVE_AVX2
    { "avx2", ggml_ext_kvquant_block_decode_avx2 },
#endif
    { NULL, NULL },
};

#define MAXB 7

static void random_case(int bits, int n, int keys) {
    const size_t bb = (size_t) GGML_EXT_KVQUANT_BLOCK * bits / 8 + 8;
    // blocks exactly at the end of a buffer: a decoder reading past its blocks reads past the allocation
    uint8_t *    blocks = malloc(bb * n);
    float        table[16], mid[MAXB * 64], half[MAXB * 64], want[MAXB * 64], got[MAXB * 64];
    for (int i = 0; i < 16; i++) {
        table[i] = i < (1 << bits) ? 2 * uni() - 1 : 1e30f;  // entries past 2^B must never be read
    }
    for (size_t i = 0; i < bb * n; i++) {
        blocks[i] = (uint8_t) next();
    }
    for (int i = 0; i < n; i++) {
        uint16_t s[4] = { ggml_ext_fp32_to_fp16(4 * uni() - 2), ggml_ext_fp32_to_fp16(3 * uni()), 0, 0 };
        if (!keys && i == 1) {
            s[0] = 0x7e00;  // a NaN block stays NaN
        }
        memcpy(blocks + i * bb + bb - 8, s, sizeof(s));
    }
    for (int c = 0; c < n * 64; c++) {
        mid[c]  = 4 * uni() - 2;
        half[c] = 0.1f + 3 * uni();
    }
    ggml_ext_kvquant_block_decode_ref(bits, blocks, n, bb, table, keys ? mid : NULL, keys ? half : NULL, want);
    // the reference itself: slot c of block i at its documented bit field
    int ok = 1;
    for (int i = 0; i < n; i++) {
        const uint8_t * b = blocks + i * bb;
        uint16_t        s[2];
        memcpy(s, b + bb - 8, 4);
        for (int c = 0; c < 64; c++) {
            int q;
            if (bits == 4) {
                q = (b[c % 32] >> (4 * (c / 32))) & 15;
            } else {
                q = (b[c % 16] >> (2 * (c / 16))) & 3;
                if (bits == 3) {
                    q |= ((b[16 + c % 8] >> (c / 8)) & 1) << 2;
                }
            }
            const float h = keys ? half[i * 64 + c] : ggml_ext_fp16_to_fp32(s[1]);
            const float m = keys ? mid[i * 64 + c] : ggml_ext_fp16_to_fp32(s[0]);
            volatile float p = table[q] * h;  // rounded before the sum
            const float    e = p + m;
            ok &= memcmp(&e, &want[i * 64 + c], 4) == 0;
        }
    }
    check(ok, keys ? "reference keys" : "reference values", bits, n);
    for (const struct impl * im = impls; im->name; im++) {
        memset(got, 0, sizeof(got));
        im->fn(bits, blocks, n, bb, table, keys ? mid : NULL, keys ? half : NULL, got);
        char what[64];
        snprintf(what, sizeof what, "%s %s", im->name, keys ? "keys" : "values");
        check(memcmp(got, want, sizeof(float) * 64 * n) == 0, what, bits, n);
    }
    free(blocks);
}

// the reference against the row kernel: ggml_ext_kvquant_quantize_v rows of a one-head 64-channel layer
static void kernel_case(int bits) {
    const int n = 1 << bits;
    float     lo[64], hi[64], lv[16] = { 0 }, vals[16] = { 0 };
    for (int c = 0; c < 64; c++) {
        lo[c] = -1;
        hi[c] = 1;
    }
    for (int i = 0; i < n; i++) {
        lv[i]   = -1 + 2.0f * i / (n - 1) + (i > 0 && i < n - 1 ? 0.05f * (uni() - 0.5f) : 0);
        vals[i] = lv[i] * 1.03f;
    }
    const struct ggml_ext_kvquant_config cfg = { bits, 1, 64, 0, 0, 0, GGML_EXT_KVQUANT_ROPE_NORM, 0, 10000.0f, 1.0f,
                                             NULL, lo, hi, lv, vals, lv, vals };
    char                             err[200];
    struct ggml_ext_kvquant_layer *      L = ggml_ext_kvquant_layer_new(&cfg, err, sizeof err);
    if (!L) {
        printf("FAIL layer: %s\n", err);
        failed++;
        return;
    }
    const size_t rs = ggml_ext_kvquant_v_row_size(L);
    check(rs == (size_t) 64 * bits / 8 + 8, "row size", bits, 1);
    uint8_t * rows = malloc(rs * 5);
    float     x[64], want[5 * 64], got[5 * 64];
    for (int r = 0; r < 5; r++) {
        for (int c = 0; c < 64; c++) {
            x[c] = (2 * uni() - 1) * (0.1f + 3 * r);
        }
        ggml_ext_kvquant_quantize_v(L, x, rows + r * rs);
        ggml_ext_kvquant_dequantize_v(L, rows + r * rs, want + r * 64);
    }
    ggml_ext_kvquant_block_decode_ref(bits, rows, 5, rs, vals, NULL, NULL, got);
    check(memcmp(got, want, sizeof(got)) == 0, "reference = kvq_dequantize_v", bits, 5);
    for (const struct impl * im = impls; im->name; im++) {
        im->fn(bits, rows, 5, rs, vals, NULL, NULL, got);
        check(memcmp(got, want, sizeof(got)) == 0, im->name, bits, 5);
    }
    free(rows);
    ggml_ext_kvquant_layer_free(L);
}

int main(void) {
    printf("implementations: generic");
    for (const struct impl * im = impls; im->name; im++) {
        printf(" %s", im->name);
    }
    printf("\n");
    for (int rep = 0; rep < 40; rep++) {
        for (int bits = 2; bits <= 4; bits++) {
            for (int n = 1; n <= MAXB; n += 3) {
                random_case(bits, n, 0);
                random_case(bits, n, 1);
            }
            kernel_case(bits);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
