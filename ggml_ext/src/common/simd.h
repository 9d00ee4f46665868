// What every CPU kernel file of every family shares: which SIMD implementations this build
// compiles in (decided from the compiler's target flags only, as ggml's own CPU variants
// are), and the inlining, unrolling and rounding controls the kernels are written with.
#pragma once

#if defined(__aarch64__) && defined(__ARM_NEON)
#    define GGML_EXT_HAVE_NEON 1  // every aarch64 target (kvquant's float kernels need nothing more)
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#    define GGML_EXT_HAVE_NEON_DOTPROD 1
#    if defined(__ARM_FEATURE_MATMUL_INT8)
#        define GGML_EXT_HAVE_NEON_I8MM 1
#    endif
#    if defined(__ARM_FEATURE_SVE) && defined(__ARM_FEATURE_SVE_MATMUL_INT8)
#        define GGML_EXT_HAVE_SVE_I8MM 1  // usable only with 256-bit vectors (arm/interleaved4_sve.c)
#    endif
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#    define GGML_EXT_HAVE_NEON 1  // plain Armv8 NEON (the any-precision GEMV)
#endif
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#    define GGML_EXT_HAVE_AVX2 1
#    if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#        define GGML_EXT_HAVE_AVX512VNNI 1
#    endif
#    if defined(__AVX512F__) && defined(__AVX512BW__)
#        define GGML_EXT_HAVE_AVX512 1  // byte masks and permutes (the any-precision GEMV)
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

