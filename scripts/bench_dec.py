#!/usr/bin/env python3
"""QDEC perplexity ladder (docs/QDEC.md, docs/BENCHMARKS.md "QDEC"): a quantized base of a model plus the
dynamic error compensation at k_chunk in {0, 8, 16, 32, 64, 128}, dynamic (approximate top-k) vs exact
top-k vs static (calibration-chosen) vs random channels, all in torch (ggml_ext.methods.dec.simulate).

    PYTHONPATH=python python scripts/bench_dec.py [--model smollm2] [--types Q4_0,Q3_K] [--windows 4]
                                                  [--seq-len 256] [--calib-samples 8] [--calib-seq-len 256]

Bases are made by our llama-quantize from the asset's GGUF (--allow-requantize: the default model's GGUF
is Q4_1, its HF folder the same weights dequantized, so requantizing equals quantizing the HF weights);
side files by `calibrate dec` on wiki-train; perplexity on the first --windows windows of wiki-test.
Bases and side files are cached under ~/.cache/ggml-ext/dec/. Prints a markdown table per base, with
k = 0 (the base alone) and "full" (every channel's 4-bit residual: the ceiling) measured in the same run.
"""
from __future__ import annotations

import argparse
import collections
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

MODELS = {"smollm2": ("smollm2-gguf", "smollm2-hf"), "gemma3": ("gemma3-270m-gguf", "gemma3-hf")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    ap.add_argument("--types", default="Q4_0,Q3_K", help="llama-quantize types of the bases")
    ap.add_argument("--k", default="0,8,16,32,64,128", help="k_chunk values")
    ap.add_argument("--modes", default="dynamic,exact,static,random")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--calib-samples", type=int, default=8)
    ap.add_argument("--calib-seq-len", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on the CPU")
    args = ap.parse_args()

    import torch

    from ggml_ext import assets, tools
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.gguf import read_gguf
    from ggml_ext.methods.dec import calibration
    from ggml_ext.methods.dec.simulate import DecModel
    torch.set_num_threads(args.threads)
    gguf_asset, hf_asset = MODELS[args.model]
    src, hf = assets.path(gguf_asset), assets.path(hf_asset)
    if src.is_dir():
        src = next(src.glob("*.gguf"))
    from ggml_ext.cache import cache_root
    cache = cache_root() / "dec"
    cache.mkdir(parents=True, exist_ok=True)
    ks = [int(k) for k in args.k.split(",")]
    modes = args.modes.split(",")
    tokens = tokenize(hf, assets.path("wiki-test"), args.windows, args.seq_len).ids
    print(f"# QDEC perplexity ladder: {args.model}, {args.windows} x {args.seq_len} tokens of wiki-test; "
          f"calibration {args.calib_samples} x {args.calib_seq_len} of wiki-train; {platform.node()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, device {args.device}")
    print(f"# command: {' '.join(sys.argv)}")
    for t in args.types.split(","):
        base = cache / f"{args.model}-{t}.gguf"
        if not base.exists():
            tmp = base.with_suffix(".tmp.gguf")
            subprocess.run(tools.command("llama-quantize", "--allow-requantize", src, tmp, t, str(args.threads)),
                           env=tools.tool_env(), check=True, capture_output=True)
            tmp.rename(base)
        side = cache / f"{args.model}-{t}.c{args.calib_samples}x{args.calib_seq_len}.dec.gguf"
        t0 = time.time()
        if not side.exists():
            calibration.calibrate(base, hf, None, args.calib_samples, args.calib_seq_len, args.device).save(side)
        t_cal = time.time() - t0
        mix = collections.Counter(x.type_name for x in read_gguf(base).tensors
                                  if x.name.startswith("blk.") and not x.name.endswith("norm.weight"))
        m = DecModel(base, side, hf, device=args.device)
        print(f"\n## base {t} (linears: {', '.join(f'{n} {c}' for n, c in mix.most_common())}); "
              f"side file {side.stat().st_size / 2**20:.1f} MiB, calibrated in {t_cal:.0f} s (0 s: cached)\n")
        m.configure("none", 0)
        t0 = time.time()
        p0 = m.perplexity(tokens)
        m.configure("full", 0)
        pf = m.perplexity(tokens)
        print(f"base alone (k=0): {p0:.4f}; every channel compensated (4-bit residual ceiling): {pf:.4f}\n")
        print("| k_chunk | " + " | ".join(modes) + (" | recall of the approximate top-k |" if "dynamic" in modes else " |"))
        print("| --- |" + " --- |" * (len(modes) + ("dynamic" in modes)))
        for k in ks:
            cells, rec = [], ""
            for mode in modes:
                if k == 0:
                    cells.append(f"{p0:.4f}")
                    continue
                m.configure(mode, k)
                cells.append(f"{m.perplexity(tokens):.4f}")
                if mode == "dynamic":
                    rec = f"{m.recall:.3f}"
            if "dynamic" in modes:
                cells.append(rec or "-")
            print(f"| {k} | " + " | ".join(cells) + " |", flush=True)
        print(f"\n({time.time() - t0:.0f} s for this base)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
