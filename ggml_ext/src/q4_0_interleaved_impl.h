// Internal to the interleaved Q4_0 family: the one place that decides which SIMD
// implementations are compiled in, the fp16 helpers every implementation shares, and
// the implementation tables the dispatcher chooses from.
#pragma once

#include "q4_0_interleaved.h"

#include <string.h>

// ---- compiled-in implementations (decided from the compiler's target flags only) ----
#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#    define GGML_EXT_Q4_0_NEON_DOTPROD 1
#    if defined(__ARM_FEATURE_MATMUL_INT8)
#        define GGML_EXT_Q4_0_NEON_I8MM 1
#    endif
#    if defined(__ARM_FEATURE_SVE) && defined(__ARM_FEATURE_SVE_MATMUL_INT8)
#        define GGML_EXT_Q4_0_SVE_I8MM 1  // usable only with 256-bit vectors (arm/q4_0_interleaved_sve.c)
#    endif
#endif
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#    define GGML_EXT_Q4_0_AVX2 1
#    if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#        define GGML_EXT_Q4_0_AVX512VNNI 1
#    endif
#endif

// Helpers of the kernels are always inlined (constant layout parameters fold away), and
// the short loops inside block loops are unrolled completely (register-resident
// accumulators, constant lane indices); GCC and clang both read this pragma.
#if defined(_MSC_VER) && !defined(__clang__)
#    define GGML_EXT_INLINE static __forceinline
#    define GGML_EXT_UNROLL
#else
#    define GGML_EXT_INLINE static inline __attribute__((always_inline))
#    define GGML_EXT_UNROLL _Pragma("GCC unroll 8")
#endif

// Keeps the compiler from hoisting loads across it: without it GCC's pre-allocation
// scheduler issues every activation load of a tile first and spills accumulators.
#if defined(__GNUC__) || defined(__clang__)
#    define GGML_EXT_LOAD_BARRIER() __asm__ __volatile__("" ::: "memory")
#else
#    define GGML_EXT_LOAD_BARRIER()
#endif

// A function whose float expressions must round after every operation (no a * b + c -> fma).
// GCC ignores #pragma STDC FP_CONTRACT, so it gets the optimize attribute; clang reads the
// pragma inside the function; MSVC contracts only under /fp:fast or /fp:contract.
#if defined(__GNUC__) && !defined(__clang__)
#    define GGML_EXT_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#    define GGML_EXT_NO_FP_CONTRACT
#endif

#ifdef __cplusplus
extern "C" {
#endif

GGML_EXT_API extern const struct ggml_ext_q4_0_impl ggml_ext_q4_0_impl_generic;
#ifdef GGML_EXT_Q4_0_NEON_DOTPROD
GGML_EXT_API extern const struct ggml_ext_q4_0_impl ggml_ext_q4_0_impl_neon_dotprod;
#endif
#ifdef GGML_EXT_Q4_0_NEON_I8MM
GGML_EXT_API extern const struct ggml_ext_q4_0_impl ggml_ext_q4_0_impl_neon_i8mm;
#endif
#ifdef GGML_EXT_Q4_0_SVE_I8MM
GGML_EXT_API extern const struct ggml_ext_q4_0_impl ggml_ext_q4_0_impl_sve256_i8mm;
#endif
#ifdef GGML_EXT_Q4_0_AVX2
GGML_EXT_API extern const struct ggml_ext_q4_0_impl ggml_ext_q4_0_impl_avx2;
#endif
#ifdef GGML_EXT_Q4_0_AVX512VNNI
GGML_EXT_API extern const struct ggml_ext_q4_0_impl ggml_ext_q4_0_impl_avx512vnni;
#endif

#ifdef __cplusplus
}
#endif

// ---- IEEE binary16 <-> binary32, round to nearest even (what F16C and NEON do) ----

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
