# Host emulation of v16 (apq_gemv_tc16_kernel in ggml_ext/src/cuda/anyprec_cuda.cu): the tile relayout, the
# nibble codes, the byte-permute lookups and the mma.m16n8k16 fragment mapping (A rows 0/8 = x_hi/x_lo, B = the
# lanes' weight pairs, D rows 0 + 8), the H slices added as the kernel does; vs a direct GEMV.
# Pure Python, ~3 s: python3 tests/cuda/anyprec_tc_emul.py (mirrors the kernel: change both together).
import random, struct
random.seed(1)
def bp(x, y, s):
    b = [(x >> (8*i)) & 255 for i in range(4)] + [(y >> (8*i)) & 255 for i in range(4)]
    r = 0
    for i in range(4):
        sel = (s >> (4*i)) & 15
        assert sel < 8
        r |= b[sel] << (8*i)
    return r
def h2f(u): return struct.unpack('<e', struct.pack('<H', u & 0xffff))[0]
def f2h(f): return struct.unpack('<H', struct.pack('<e', f))[0]
def run(n, k, P, B, S=3, H=4):
    kb = k // 8
    planes = [[[random.randrange(256) for _ in range(kb)] for _ in range(n)] for _ in range(P)]
    TB = 1 << B
    tab = [[random.randrange(-64, 64) / 32 for _ in range(TB)] for _ in range(n)]
    x = [random.uniform(-2, 2) for _ in range(k)]  # not fp16-exact: x_lo matters
    code = lambda r, j: sum(((planes[p][r][j >> 3] >> (j & 7)) & 1) << (B - 1 - p) for p in range(B))
    want = [sum(tab[r][code(r, j)] * x[j] for j in range(k)) for r in range(n)]
    Q = k // 128; T = (n + 31) // 32 * 4
    def word(p, tile, q, lane):
        g, c = lane >> 2, lane & 3; r = 8*tile + g; v = 0
        if r < n:
            for j in range(8):
                for m in range(4):
                    col = 128*q + 16*(2*m + (j >> 2)) + 2*c + (j & 1) + (8 if j & 2 else 0)
                    v |= ((planes[p][r][col >> 3] >> (col & 7)) & 1) << (4*j + m)
        return v
    # x fragments: entry 4 st + c = (hi, lo of x[16st+2c..+1], hi, lo of x[16st+2c+8..+9])
    xa = {}
    for st in range(k // 16):
        for c in range(4):
            wv = []
            for u in range(2):
                j0 = 16*st + 2*c + 8*u
                h0, h1 = h2f(f2h(x[j0])), h2f(f2h(x[j0+1]))
                wv += [f2h(h0) | f2h(h1) << 16, f2h(x[j0] - h0) | f2h(x[j0+1] - h1) << 16]
            xa[4*st + c] = wv
    got = [None]*n
    for blk in range((n + 31)//32):
        red = [[0.0]*32 for _ in range(H)]
        for warp in range(4 * H):
            h = warp >> 2; tile = blk*4 + (warp & 3)
            ni = (Q - h + H - 1)//H if Q > h else 0
            regs = []
            for lane in range(32):
                r = 8*tile + (lane >> 2); hv = [0]*8
                if r < n:
                    for e in range(TB): hv[e] = f2h(tab[r][e])
                vx, vy, vz, vw = [hv[2*i] | hv[2*i+1] << 16 for i in range(4)]
                regs.append((bp(vx, vy, 0x6420), bp(vz, vw, 0x6420), bp(vx, vy, 0x7531), bp(vz, vw, 0x7531)))
            acc = [[0.0]*8 for _ in range(16)]  # D[row][col]
            for i in range(ni):
                q = h + H*i
                for m in range(4):
                    for hh in range(2):
                        A = [[0.0]*16 for _ in range(16)]; Bm = [[0.0]*8 for _ in range(16)]
                        for lane in range(32):
                            g, c = lane >> 2, lane & 3
                            w = [word(p, tile, q, lane) for p in range(B)]
                            o = 0
                            for kk in range(B): o |= ((w[kk] >> m) & 0x11111111) << (B - 1 - kk)
                            s = (o >> 16) if hh else (o & 0xffff)
                            tl0, tl1, th0, th1 = regs[lane]
                            L = bp(tl0, tl1, s); Hh = bp(th0, th1, s)
                            b0 = bp(L, Hh, 0x5140); b1 = bp(L, Hh, 0x7362)
                            Bm[2*c][g] = h2f(b0); Bm[2*c+1][g] = h2f(b0 >> 16)
                            Bm[2*c+8][g] = h2f(b1); Bm[2*c+9][g] = h2f(b1 >> 16)
                            a0, a1, a2, a3 = xa[(q*8 + 2*m + hh)*4 + c]
                            A[g][2*c] = h2f(a0); A[g][2*c+1] = h2f(a0 >> 16)
                            A[g+8][2*c] = h2f(a1); A[g+8][2*c+1] = h2f(a1 >> 16)
                            A[g][2*c+8] = h2f(a2); A[g][2*c+9] = h2f(a2 >> 16)
                            A[g+8][2*c+8] = h2f(a3); A[g+8][2*c+9] = h2f(a3 >> 16)
                        for rr in range(16):
                            for cc in range(8):
                                acc[rr][cc] += sum(A[rr][kk2]*Bm[kk2][cc] for kk2 in range(16))
            for c in range(4):
                red[h][(warp & 3)*8 + 2*c] = acc[0][2*c] + acc[8][2*c]
                red[h][(warp & 3)*8 + 2*c + 1] = acc[0][2*c+1] + acc[8][2*c+1]
        for t in range(32):
            r = blk*32 + t
            if r < n: got[r] = sum(red[hh][t] for hh in range(H))
    err = max(abs(a - b) for a, b in zip(got, want))
    print(n, k, B, "max abs err", err)
    mag = max(sum(abs(tab[r][code(r, j)] * x[j]) for j in range(k)) for r in range(n))
    print("  relative to sum|w x|:", err / mag)
    assert err < 1e-5 * mag, (err, mag)
run(40, 256, 3, 3)
run(33, 640, 3, 2)
run(8, 128, 3, 1)
run(40, 1280, 3, 3, H=8)
print("ok")
