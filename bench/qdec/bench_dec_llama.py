#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "QDEC": NLL, top-1 and KL in llama.cpp on the CPU against k_chunk.
"""QDEC in llama.cpp on the CPU (docs/RESULTS.md "QDEC"): the default model requantized to
Q4_0 by our llama-quantize, a side file of every decoder layer (`calibrate dec`, wiki-train), and a decode
loop through llama-cpp-python on our libllama: windows of wiki-test fed one token per llama_decode (so
every linear runs DEC_MUL_MAT at the k_chunk under test), the f16 model (our converter) the reference.
Per setting: mean NLL of the next token, top-1 agreement with the f16 model's argmax, mean KL(f16 || it).

    PYTHONPATH=python python bench/qdec/bench_dec_llama.py [--windows 2] [--tokens 128] [--k 0,8,16,32,64,128,1024]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per window")
    ap.add_argument("--k", default="0,8,16,32,64,128,1024")
    ap.add_argument("--calib", default="16x512", help="calibration samples x length")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import convert_support as cs
    from ggml_ext import assets, tools
    from ggml_ext.cache import cache_root
    from ggml_ext.llama_cpp_glue import Llama, set_dec
    from ggml_ext.qdec import calibration

    cache = cache_root() / "bench-dec-llama"
    cache.mkdir(parents=True, exist_ok=True)
    base = cache / "smollm2-q4_0.gguf"
    if not base.exists():
        tmp = base.with_suffix(".tmp.gguf")
        subprocess.run(tools.command("llama-quantize", "--allow-requantize", assets.path("smollm2-gguf"), tmp, "Q4_0",
                                     str(args.threads)), env=tools.tool_env(), check=True, capture_output=True)
        tmp.rename(base)
    n, L = (int(v) for v in args.calib.split("x"))
    side = cache / f"smollm2-q4_0.c{n}x{L}.dec.gguf"
    if not side.exists():
        t0 = time.time()
        calibration.calibrate(base, assets.path("smollm2-hf"), None, n, L, progress=False).save(side)
        print(f"calibrate dec: {time.time() - t0:.0f} s", file=sys.stderr)
    f16 = cs.default_converted("f16")

    vocab = Llama(f16, n_ctx=64, vocab_only=True)
    text = assets.path("wiki-test").read_text(encoding="utf-8")
    ids = vocab.tokenize(text.encode(), add_bos=False)
    stride = len(ids) // (args.windows + 1)
    windows = [[vocab.token_bos()] + ids[i * stride:i * stride + args.tokens - 1] for i in range(args.windows)]

    def run(model, dec=None, k=None):
        set_dec(dec, k=k)
        try:
            out, t_tok = [], 0.0
            for w in windows:
                llm = Llama(model, n_ctx=args.tokens + 8, n_batch=64, n_threads=args.threads, logits_all=True)
                t0 = time.time()
                for t in w:
                    llm.eval([t])
                t_tok += (time.time() - t0) / len(w)
                out.append(np.array(llm.scores[:len(w)], dtype=np.float64))
                llm.close()
            return out, t_tok / len(windows)
        finally:
            set_dec(None)

    def logsm(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    ref, _ = run(f16)
    rows = []

    def stats(name, lg, t):
        nll, agree, kl, cnt = 0.0, 0, 0.0, 0
        for w, r, g in zip(windows, ref, lg):
            lp, lq = logsm(r[:-1]), logsm(g[:-1])
            nxt = np.array(w[1:])
            nll += float(-lq[np.arange(len(nxt)), nxt].sum())
            agree += int((r[:-1].argmax(-1) == g[:-1].argmax(-1)).sum())
            kl += float((np.exp(lp) * (lp - lq)).sum())
            cnt += len(nxt)
        rows.append((name, nll / cnt, agree / cnt, kl / cnt, 1e3 * t))

    stats("f16 (reference)", ref, 0.0)
    lg, t = run(base)
    stats("Q4_0, no side file", lg, t)
    for k in args.k.split(","):
        lg, t = run(base, side, k)
        stats(f"Q4_0 + DEC k_chunk {k}", lg, t)
    print(f"{args.windows} windows x {args.tokens} tokens of wiki-test, one token per llama_decode, {args.threads} threads")
    print("| model | NLL | exp(NLL) | top-1 = f16 | KL(f16 ‖ it) | ms/token (loaded machine) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, nll, a, kl, ms in rows:
        print(f"| {name} | {nll:.4f} | {np.exp(nll):.2f} | {100 * a:.1f} % | {kl:.4f} | {ms:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
