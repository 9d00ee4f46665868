// The one-token any-precision GEMV's tensor-core path at b <= 4 (ggml_ext/src/cuda/anyprec_decode.cuh: the row
// table as byte planes, the B fragment from the codes by byte permutes, x scaled by a power of two and split into
// two fp16 parts in the A fragment's order, which lanes carry x, where each row's sum lands) on the host: a 32-row
// group's row-lane words go through those very functions and rl_codes (b = 4: the pair tables in shared memory's
// layout, read at the addresses apq_pair_addr makes), the warp's mma.sync.m16n8k16 is emulated from PTX's
// fragment layout (f32 sums of the exact fp16 products), and every row's sum must be within 1e-5 of sum |w x| of
// a double-precision dot product of the file's codes and tables (docs/formats/anyprec.md), for precisions 1..4,
// several row lengths, x of mixed magnitudes within a vector (1e-6 to 300 times its scale) and vectors of
// ordinary size, beyond fp16's range and far below it; two tokens per MMA (the second in A's spare rows). Also
// checks that every weight of a super-chunk is in exactly one MMA. Host code only: built with nvcc and run without a GPU by tests/cuda/test_anyprec_cuda.py. The
// kernel on a GPU against the CPU: tests/c/test_ext_ops.cpp and tests/cuda/anyprec_cuda_bench.cu.
#include "anyprec_decode.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static int failures = 0;

#define CHECK(cond, ...)                   \
    do {                                   \
        if (!(cond)) {                     \
            if (failures++ < 20) {         \
                std::printf("FAIL: ");     \
                std::printf(__VA_ARGS__);  \
                std::printf("\n");         \
            }                              \
        }                                  \
    } while (0)

static float half_bits_to_float(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short) h));
}

// one MMA of the warp: D[16][8] += A B with A, B given by the 32 lanes' fragments (PTX ISA, mma.m16n8k16 .f16:
// a0..a7 at rows gid (a0, a1, a4, a5) / gid + 8, columns 2 tig + (i & 1) (+ 8 for a4..a7); b0..b3 at rows
// 2 tig + (i & 1) (+ 8 for b2, b3), column gid)
static void emulate_mma(float (&D)[16][8], const uint4 (&a)[32], const uint32_t (&b0)[32], const uint32_t (&b1)[32]) {
    float A[16][16] = {}, Bm[16][8] = {};
    for (int l = 0; l < 32; l++) {
        const int      gid = l >> 2, tig = l & 3;
        const uint32_t ar[4] = { a[l].x, a[l].y, a[l].z, a[l].w };
        for (int i = 0; i < 8; i++) {
            const int row = gid + ((i >> 1) & 1) * 8;
            const int col = 2 * tig + (i & 1) + (i >> 2) * 8;
            A[row][col]   = half_bits_to_float((ar[i >> 1] >> (16 * (i & 1))) & 0xffff);
        }
        const uint32_t br[2] = { b0[l], b1[l] };
        for (int i = 0; i < 4; i++) {
            Bm[2 * tig + (i & 1) + (i >> 1) * 8][gid] = half_bits_to_float((br[i >> 1] >> (16 * (i & 1))) & 0xffff);
        }
    }
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 8; c++) {
            float s = 0.0f;  // the 16 products are exact in f32; their sum in f32
            for (int kk = 0; kk < 16; kk++) {
                s += A[r][kk] * Bm[kk][c];
            }
            D[r][c] += s;
        }
    }
}

template <int B> static void check_group(int64_t K, float xmag, std::mt19937 & rng) {
    const int TB = 1 << B;
    std::uniform_int_distribution<int>    code8(0, 255);
    std::normal_distribution<float>       nd(0.0f, 1.0f);
    std::uniform_int_distribution<int>    kind(0, 9);
    std::vector<uint8_t>                  codes(32 * K);  // 8-bit parent codes, row-major
    std::vector<uint16_t>                 tab(32 * TB);   // precision B's table of each row, fp16 bits
    std::vector<float>                    x(2 * K);  // two tokens, the second 1000 times smaller
    for (auto & c : codes) {
        c = (uint8_t) code8(rng);
    }
    for (auto & t : tab) {
        t = __half_as_ushort(__float2half_rn(nd(rng) * 0.05f));
    }
    for (int64_t j = 0; j < 2 * K; j++) {
        const int k = kind(rng);
        x[j]        = nd(rng) * xmag * (j >= K ? 1e-3f : 1.0f) * (k == 0 ? 1e-6f : k == 1 ? 300.0f : 1.0f);
    }
    float maxabs = 0.0f, xs, xinv;  // the kernel's power-of-two scale of x (one for both tokens)
    for (float v : x) {
        maxabs = std::fmax(maxabs, std::fabs(v));
    }
    apq_x_scale(maxabs, xs, xinv);
    // the row-lane words of the B planes (plane kk = bit B-1-kk of the B-bit code): word t of chunk q of lane l,
    // bit 8 i + m = weight 128 q + 32 t + 4 m + i
    const int64_t         Q = K / 128;
    std::vector<uint32_t> words((size_t) B * Q * 32 * 4, 0);  // [plane][q][lane][t]
    for (int kk = 0; kk < B; kk++) {
        for (int64_t q = 0; q < Q; q++) {
            for (int l = 0; l < 32; l++) {
                for (int t = 0; t < 4; t++) {
                    uint32_t v = 0;
                    for (int i = 0; i < 4; i++) {
                        for (int m = 0; m < 8; m++) {
                            const int code = codes[l * K + 128 * q + 32 * t + 4 * m + i] >> (8 - B);
                            v |= (uint32_t) ((code >> (B - 1 - kk)) & 1) << (8 * i + m);
                        }
                    }
                    words[((kk * Q + q) * 32 + l) * 4 + t] = v;
                }
            }
        }
    }
    // b = 4: the pair tables of the 32 rows in shared memory's layout, both buffers (buffer 1 holds junk that a
    // lookup must not reach), read through apq_pair_addr
    std::vector<uint8_t> smem(B == 4 ? 256 * 256 : 0);
    const int            buffer = (int) (K / 128) & 1;  // varies with K: both buffers get read
    if (B == 4) {
        for (auto & c : smem) {
            c = (uint8_t) code8(rng);
        }
        for (int l = 0; l < 32; l++) {
            for (int p = 0; p < 256; p++) {
                const uint32_t v = apq_pair(tab[l * 16 + (p & 15)], tab[l * 16 + (p >> 4)]);
                std::memcpy(&smem[apq_pair_offset(p, buffer, l)], &v, 4);
            }
        }
    }
    apq_reg_table tb[32];
    for (int l = 0; l < 32 && B <= 3; l++) {
        uint32_t h[8] = {};
        for (int e = 0; e < TB; e++) {
            h[e] = tab[l * TB + e];
        }
        tb[l] = apq_reg_table_of(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
    }
    float           D[2][16][8] = {};
    std::vector<int> seen(K, 0);
    for (int64_t q = 0; q < Q; q++) {
        for (int t = 0; t < 4; t++) {
            for (int m = 0; m < 4; m++) {
                uint32_t o[32];
                for (int l = 0; l < 32; l++) {
                    uint32_t w[B];
                    for (int kk = 0; kk < B; kk++) {
                        w[kk] = words[((kk * Q + q) * 32 + l) * 4 + t];
                    }
                    o[l] = rl_codes<B>(w, m, 0x11111111u);
                }
                for (int hh = 0; hh < 2; hh++) {
                    const int     u  = 8 * t + 2 * m + hh;
                    const int64_t j0 = 128 * q + apq_x_frag_j0(u);
                    for (int d : { 0, 1, 16, 17 }) {
                        seen[j0 + d]++;
                    }
                    uint4 xf[2];
                    for (int tok = 0; tok < 2; tok++) {
                        const float * xt = x.data() + tok * K;
                        xf[tok] = apq_x_frag(xt[j0] * xs, xt[j0 + 1] * xs, xt[j0 + 16] * xs, xt[j0 + 17] * xs);
                    }
                    uint4       a[32];
                    uint32_t    b0[32], b1[32];
                    for (int l = 0; l < 32; l++) {
                        a[l] = apq_diag_lane(l, 0) ? xf[0] : apq_diag_lane(l, 1) ? xf[1] : make_uint4(0, 0, 0, 0);
                        if (B == 4) {
                            const uint32_t lreg = (uint32_t) (l * 4 + buffer * 128);
                            const uint32_t a0 = apq_pair_addr(o[l], lreg, 2 * hh);
                            const uint32_t a1 = apq_pair_addr(o[l], lreg, 2 * hh + 1);
                            CHECK(a0 + 4 <= smem.size() && a1 + 4 <= smem.size(), "pair address out of range");
                            std::memcpy(&b0[l], &smem[a0], 4);
                            std::memcpy(&b1[l], &smem[a1], 4);
                        } else {
                            apq_b_frag(hh ? o[l] >> 16 : o[l], tb[l], b0[l], b1[l]);
                        }
                    }
                    emulate_mma(D[hh], a, b0, b1);
                }
            }
        }
    }
    for (int64_t j = 0; j < K; j++) {
        CHECK(seen[j] == 1, "b=%d K=%lld: weight %lld in %d MMAs", B, (long long) K, (long long) j, seen[j]);
    }
    for (int l = 0; l < 64; l++) {
        const int tok = l / 32, lane = l % 32;
        int       half;
        const int src = apq_acc_source(lane, tok, half);
        // the source lane's c[half] + c[half + 2]: D[gid][2 tig + half] + D[gid + 8][2 tig + half]
        const int gid = src >> 2, tig = src & 3;
        float     got = 0.0f;
        for (int hh = 0; hh < 2; hh++) {
            got += D[hh][gid][2 * tig + half] + D[hh][gid + 8][2 * tig + half];
        }
        got *= xinv;
        double want = 0.0, mag = 0.0;
        for (int64_t j = 0; j < K; j++) {
            const double w = half_bits_to_float(tab[lane * TB + (codes[lane * K + j] >> (8 - B))]);
            want += w * x[tok * K + j];
            mag += std::fabs(w * x[tok * K + j]);
        }
        CHECK(std::fabs(got - want) <= 1e-5 * mag,
              "b=%d K=%lld |x| ~%g token %d row %d: %.9g, reference %.9g (sum |w x| %.3g)", B, (long long) K, xmag, tok,
              lane, got, want, mag);
    }
}

int main() {
    std::mt19937 rng(12345);
    int          groups = 0;
    // x of ordinary size, beyond fp16's range (1e6 * 300), and so small that fp16 alone would be subnormal
    for (int64_t K : { 128, 384, 4096, 11008 }) {
        for (float xmag : { 1.0f, 1e6f, 1e-9f }) {
            check_group<1>(K, xmag, rng);
            check_group<2>(K, xmag, rng);
            check_group<3>(K, xmag, rng);
            check_group<4>(K, xmag, rng);
            groups += 4;
        }
    }
    std::printf("APQ tensor-core fragments: %d row groups checked\n", groups);
    std::printf("%s: %d failures\n", failures ? "FAIL" : "OK", failures);
    return failures ? 1 : 0;
}
