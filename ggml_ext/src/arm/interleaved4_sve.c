// SVE kernels of the interleaved Q4_0 family for 256-bit vectors (Neoverse V1 /
// Graviton3): GEMV and GEMM for Q4_0_8_8. A 32-byte vector holds one chunk of four
// columns, so one block of 8 columns is four loads; the GEMM's svmmla_s32 (SMMLA) works
// on both 128-bit segments at once (2 activation rows x 2 columns x 8 bytes each, 64
// MACs per instruction), the GEMV's svdot_s32 (SDOT) gives each column two int32 lanes.
//
// The code assumes 32-byte vectors (lane positions are constants), so the implementation
// is usable only where svcntb() == 32; elsewhere (SVE-128 on Neoverse V2 / Graviton4,
// SVE-512 on A64FX) the dispatcher keeps the NEON kernels. Compiled in when the target's
// flags enable SVE with int8 matrix multiply (-mcpu=neoverse-v1, -march=...+sve+i8mm).
//
// Weights as in interleaved4_arm.h: (byte << 4) and (byte & 0xf0) are the two weights
// times 16; SVE has no fixed-point convert, so the 1/16 goes into the activation delta
// (exact: a power of two). Scalar twins: ../generic/.
#include "arm/interleaved4_arm.h"

#if defined(GGML_EXT_HAVE_SVE_I8MM)

#    include <arm_sve.h>

static int sve256_usable(void) {
    return svcntb() == 32;
}

// Up to 8 fp16 deltas as float lanes: each zero-extended into a 32-bit container, whose
// low half is the f16 element that svcvt_f32_f16 reads.
INLINE svfloat32_t load_deltas(svbool_t pg, const ggml_ext_fp16_t * d) {
    return svcvt_f32_f16_x(pg, svreinterpret_f16_u32(svld1uh_u32(pg, d)));
}

INLINE svint8_t lo16_sve(svint8_t b) {
    return svlsl_n_s8_x(svptrue_b8(), b, 4);
}

INLINE svint8_t hi16_sve(svint8_t b) {
    return svand_n_s8_x(svptrue_b8(), b, (int8_t) 0xf0);
}

INLINE svint8_t bcast8(const int8_t * p) {  // 8 bytes in every doubleword (LD1RD)
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return svreinterpret_s8_s64(svdup_n_s64(v));
}

// ---------------------------------------------------------------- GEMV
// (SVE types are sizeless: no arrays of them, hence the spelled-out registers.)

// Vector h of chunk c (qs + 64c + 32h) holds columns 4h..4h+3, 8 bytes each: SDOT against
// the chunk's 8 activation bytes leaves column 4h + i in lanes 2i, 2i+1.
INLINE svint32_t dot_half(const int8_t * qs, int h, svint8_t A0, svint8_t A1, svint8_t A2, svint8_t A3) {
    const svint8_t c0 = svld1_s8(svptrue_b8(), qs + 32 * h);
    const svint8_t c1 = svld1_s8(svptrue_b8(), qs + 64 + 32 * h);
    svint32_t      p  = svdot_s32(svdup_n_s32(0), lo16_sve(c0), A0);
    p                 = svdot_s32(p, lo16_sve(c1), A1);
    p                 = svdot_s32(p, hi16_sve(c0), A2);
    return svdot_s32(p, hi16_sve(c1), A3);
}

// One block of one row group into acc: uzp1 + uzp2 of the two halves add each column's
// lane pair with the columns in order.
INLINE svfloat32_t gemv_block(svfloat32_t acc, const ggml_ext_block_q4_0x8 * wb, float da, svint8_t A0, svint8_t A1,
                              svint8_t A2, svint8_t A3) {
    const svbool_t    p32 = svptrue_b32();
    const int8_t *    qs  = (const int8_t *) wb->qs;
    const svint32_t   p0  = dot_half(qs, 0, A0, A1, A2, A3);
    const svint32_t   p1  = dot_half(qs, 1, A0, A1, A2, A3);
    const svint32_t   sum = svadd_s32_x(p32, svuzp1_s32(p0, p1), svuzp2_s32(p0, p1));
    const svfloat32_t sc  = svmul_n_f32_x(p32, load_deltas(p32, wb->d), da);
    return svmla_f32_x(p32, acc, svcvt_f32_s32_x(p32, sum), sc);
}

// G = 1 or 2 row groups of 8 columns at once, sharing the activation broadcasts.
INLINE void gemv_8x8_pass(int G, const ggml_ext_block_q4_0x8 * w, int nb, const ggml_ext_block_q8_0 * a, float * out) {
    svfloat32_t acc0 = svdup_n_f32(0.0f), acc1 = svdup_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const svint8_t A0 = bcast8(a[b].qs), A1 = bcast8(a[b].qs + 8), A2 = bcast8(a[b].qs + 16), A3 = bcast8(a[b].qs + 24);
        const float    da = vgetq_lane_f32(dup_d(&a[b].d), 0) * (1.0f / 16);  // FCVT, not the portable helper
        acc0              = gemv_block(acc0, w + b, da, A0, A1, A2, A3);
        if (G == 2) {
            acc1 = gemv_block(acc1, w + (size_t) nb + b, da, A0, A1, A2, A3);
        }
    }
    svst1_f32(svptrue_b32(), out, acc0);
    if (G == 2) {
        svst1_f32(svptrue_b32(), out + 8, acc1);
    }
}

static void gemv_q4_0_8x8_sve256(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    const int nb = n / 32, ng = nc / 8;
    for (int y = 0; y < nr; y++) {
        const ggml_ext_block_q8_0 *   a = (const ggml_ext_block_q8_0 *) vy + (size_t) y * nb;
        const ggml_ext_block_q4_0x8 * w = (const ggml_ext_block_q4_0x8 *) vx;
        int                           g = 0;
        for (; g + 2 <= ng; g += 2) {
            gemv_8x8_pass(2, w + (size_t) g * nb, nb, a, s + (size_t) y * bs + (size_t) g * 8);
        }
        if (g < ng) {
            gemv_8x8_pass(1, w + (size_t) g * nb, nb, a, s + (size_t) y * bs + (size_t) g * 8);
        }
    }
}

// ---------------------------------------------------------------- GEMM

// Unpacked weights of one block: vector [c][h] = chunk c, columns 4h..4h+3; per 128-bit
// segment that is the 2 columns x 8 bytes SMMLA takes. Low (l) and high (h) nibbles.
#    define W_VARS svint8_t wl00, wl01, wl10, wl11, wh00, wh01, wh10, wh11

// Rows 2rp, 2rp+1 of a 4-row tile against the block: activation line 2c' + rp (chunk c')
// is replicated into both segments (LD1RQ); chunks c' = 0, 1 meet the low nibbles of
// weight chunks 0, 1, c' = 2, 3 the high ones. acc_h, segment j: [r0 c0, r0 c1, r1 c0,
// r1 c1] for columns 4h + 2j + {0, 1}; dwh: the matching weight deltas, dar the rows'.
INLINE void mmla_rows(const int8_t * q, int rp, svint8_t wl00, svint8_t wl01, svint8_t wl10, svint8_t wl11, svint8_t wh00,
                      svint8_t wh01, svint8_t wh10, svint8_t wh11, svfloat32_t dwh0, svfloat32_t dwh1, svfloat32_t dar,
                      svfloat32_t * acc0, svfloat32_t * acc1) {
    const svbool_t p8 = svptrue_b8(), p32 = svptrue_b32();
    GGML_EXT_LOAD_BARRIER();  // four activation lines live at a time
    const svint8_t A0 = svld1rq_s8(p8, q + 16 * rp);
    const svint8_t A1 = svld1rq_s8(p8, q + 16 * (2 + rp));
    const svint8_t A2 = svld1rq_s8(p8, q + 16 * (4 + rp));
    const svint8_t A3 = svld1rq_s8(p8, q + 16 * (6 + rp));
    svint32_t      p  = svmmla_s32(svdup_n_s32(0), A0, wl00);
    p                 = svmmla_s32(p, A1, wl10);
    p                 = svmmla_s32(p, A2, wh00);
    p                 = svmmla_s32(p, A3, wh10);
    svint32_t r       = svmmla_s32(svdup_n_s32(0), A0, wl01);
    r                 = svmmla_s32(r, A1, wl11);
    r                 = svmmla_s32(r, A2, wh01);
    r                 = svmmla_s32(r, A3, wh11);
    *acc0 = svmla_f32_x(p32, *acc0, svcvt_f32_s32_x(p32, p), svmul_f32_x(p32, dwh0, dar));
    *acc1 = svmla_f32_x(p32, *acc1, svcvt_f32_s32_x(p32, r), svmul_f32_x(p32, dwh1, dar));
}

// A 4-row tile's block: both row pairs. The rows' deltas (times 1/16) [a0 a1 a2 a3] become
// [a0 a0 a1 a1] and [a2 a2 a3 a3] in each segment, the order of SMMLA's results.
INLINE void mmla_tile(const ggml_ext_block_q8_0x4 * at, svint8_t wl00, svint8_t wl01, svint8_t wl10, svint8_t wl11,
                      svint8_t wh00, svint8_t wh01, svint8_t wh10, svint8_t wh11, svfloat32_t dwh0, svfloat32_t dwh1,
                      svfloat32_t * acc0, svfloat32_t * acc1, svfloat32_t * acc2, svfloat32_t * acc3) {
    const svfloat32_t da = svmul_n_f32_x(svptrue_b32(), load_deltas(svptrue_pat_b32(SV_VL4), at->d), 1.0f / 16);
    const svfloat32_t dd = svzip1_f32(da, da);
    // the quants as a register of their own: LD1RQB's immediate offsets (multiples of 16)
    // then reach every line, where from the block's start (qs at +8) each load needs an ADD
    const int8_t * q = at->qs;
    __asm__("" : "+r"(q));
    mmla_rows(q, 0, wl00, wl01, wl10, wl11, wh00, wh01, wh10, wh11, dwh0, dwh1, svdupq_lane_f32(dd, 0), acc0, acc1);
    mmla_rows(q, 1, wl00, wl01, wl10, wl11, wh00, wh01, wh10, wh11, dwh0, dwh1, svdupq_lane_f32(dd, 1), acc2, acc3);
}

// 64-bit lanes of acc h: [r0 c0-1, r1 c0-1, r0 c2-3, r1 c2-3]; uzp1 of h = 0, 1 gives row
// r0's 8 columns in order, uzp2 row r1's.
INLINE void store_rows(float * o, size_t bs, svfloat32_t acc0, svfloat32_t acc1) {
    const svuint64_t h0 = svreinterpret_u64_f32(acc0), h1 = svreinterpret_u64_f32(acc1);
    svst1_f32(svptrue_b32(), o, svreinterpret_f32_u64(svuzp1_u64(h0, h1)));
    svst1_f32(svptrue_b32(), o + bs, svreinterpret_f32_u64(svuzp2_u64(h0, h1)));
}

// T tiles of four activation rows (T = 1, 2) x 8 columns; the unpacked block (8 vectors)
// serves all 4T rows. Accumulator t r h: tile t, rows 2r, 2r+1, columns of half h; they
// go by pointer into the always-inlined helpers and stay in registers.
INLINE void gemm_8x8_sve_tiles(int T, const ggml_ext_block_q8_0x4 * a, int nb, const uint8_t * w8, float * s, size_t bs) {
    const ggml_ext_block_q4_0x8 * w   = (const ggml_ext_block_q4_0x8 *) w8;
    const svbool_t                p8  = svptrue_b8();
    const svbool_t                p32 = svptrue_b32();
    svfloat32_t acc000 = svdup_n_f32(0.0f), acc001 = acc000, acc010 = acc000, acc011 = acc000;
    svfloat32_t acc100 = acc000, acc101 = acc000, acc110 = acc000, acc111 = acc000;
    for (int b = 0; b < nb; b++) {
        const int8_t * qs = (const int8_t *) w[b].qs;
        W_VARS;
        svint8_t raw;
        raw = svld1_s8(p8, qs), wl00 = lo16_sve(raw), wh00 = hi16_sve(raw);
        raw = svld1_s8(p8, qs + 32), wl01 = lo16_sve(raw), wh01 = hi16_sve(raw);
        raw = svld1_s8(p8, qs + 64), wl10 = lo16_sve(raw), wh10 = hi16_sve(raw);
        raw = svld1_s8(p8, qs + 96), wl11 = lo16_sve(raw), wh11 = hi16_sve(raw);
        // weight deltas [w0 .. w7] as SMMLA's results lie: [w0 w1 w0 w1 | w2 w3 w2 w3] for
        // columns 0-3, [w4 w5 w4 w5 | w6 w7 w6 w7] for 4-7 (64-bit zips)
        const svuint64_t  dw   = svreinterpret_u64_f32(load_deltas(p32, w[b].d));
        const svfloat32_t dwh0 = svreinterpret_f32_u64(svzip1_u64(dw, dw));
        const svfloat32_t dwh1 = svreinterpret_f32_u64(svzip2_u64(dw, dw));
        mmla_tile(a + b, wl00, wl01, wl10, wl11, wh00, wh01, wh10, wh11, dwh0, dwh1, &acc000, &acc001, &acc010,
                  &acc011);
        if (T == 2) {
            mmla_tile(a + (size_t) nb + b, wl00, wl01, wl10, wl11, wh00, wh01, wh10, wh11, dwh0, dwh1, &acc100, &acc101,
                      &acc110, &acc111);
        }
    }
    store_rows(s, bs, acc000, acc001);
    store_rows(s + 2 * bs, bs, acc010, acc011);
    if (T == 2) {
        store_rows(s + 4 * bs, bs, acc100, acc101);
        store_rows(s + 6 * bs, bs, acc110, acc111);
    }
}

INLINE void tile_8x8_sve_8rows(const ggml_ext_block_q8_0x4 * a, int nb, const uint8_t * w, float * s, size_t bs) {
    gemm_8x8_sve_tiles(2, a, nb, w, s, bs);
}

INLINE void tile_8x8_sve_4rows(const ggml_ext_block_q8_0x4 * a, int nb, const uint8_t * w, float * s, size_t bs) {
    gemm_8x8_sve_tiles(1, a, nb, w, s, bs);
}

static void gemm_q4_0_8x8_sve256(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    ggml_ext_interleaved4_arm_gemm_driver(8, 2, tile_8x8_sve_8rows, tile_8x8_sve_4rows, n, s, bs, vx, vy, nr, nc);
}

const struct ggml_ext_interleaved4_impl ggml_ext_interleaved4_impl_sve256_i8mm = {
    .name                  = "sve256-i8mm",
    .quantize_row_q8_0     = NULL,
    .quantize_mat_q8_0_4x4 = NULL,
    .quantize_mat_q8_0_4x8 = NULL,
    .gemv                  = { { NULL, NULL, gemv_q4_0_8x8_sve256 } },  // Q4_0_8_8 only
    .gemm                  = { { NULL, NULL, gemm_q4_0_8x8_sve256 } },
    .usable                = sve256_usable,
};

#else
typedef int ggml_ext_interleaved4_arm_sve_not_compiled;  // ISO C: no empty translation unit
#endif
