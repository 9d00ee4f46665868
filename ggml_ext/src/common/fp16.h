// IEEE binary16 <-> binary32 in plain C, bit-exact with F16C and NEON conversions: the
// scalar references' and the layout transforms' conversions, for every family.
#pragma once

#include "common/blocks.h"

#include <stdint.h>
#include <string.h>

static inline float ggml_ext_fp16_to_fp32(ggml_ext_fp16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000) << 16;
    const uint32_t e    = (h >> 10) & 0x1f;
    uint32_t       m    = h & 0x3ff;
    uint32_t       x;
    if (e == 0x1f) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        x = sign | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        x = sign;
    } else {  // subnormal m * 2^-24: normalise
        uint32_t shift = 0;
        while (!(m & 0x400)) {
            m <<= 1;
            shift++;
        }
        x = sign | ((113 - shift) << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

static inline ggml_ext_fp16_t ggml_ext_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    const uint32_t sign = (x >> 16) & 0x8000;
    uint32_t       ax   = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (ggml_ext_fp16_t) (sign | 0x7e00 | ((ax >> 13) & 0x3ff));  // NaN stays NaN
    }
    if (ax >= 0x477ff000u) {  // >= 65520 rounds to infinity
        return (ggml_ext_fp16_t) (sign | 0x7c00);
    }
    if (ax >= 0x38800000u) {  // normal half: rebias the exponent, round the mantissa
        ax += 0xfffu + ((ax >> 13) & 1);
        return (ggml_ext_fp16_t) (sign | ((ax - 0x38000000u) >> 13));
    }
    const uint32_t e = ax >> 23;
    if (e < 102) {  // below half the smallest subnormal (or a float subnormal): zero
        return (ggml_ext_fp16_t) sign;
    }
    // subnormal half: round (1.m * 2^(e-127)) / 2^-24 = M >> (126 - e) to nearest even
    const uint32_t mant  = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 .. 24
    const uint32_t rem   = mant & ((1u << shift) - 1);
    const uint32_t half  = 1u << (shift - 1);
    uint32_t       q     = mant >> shift;
    if (rem > half || (rem == half && (q & 1))) {
        q++;
    }
    return (ggml_ext_fp16_t) (sign | q);
}
