#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "QDEC": the torch perplexity ladder against k_chunk (dynamic, static, random channels).
"""QDEC perplexity ladder (docs/QDEC.md, docs/RESULTS.md "QDEC"): a quantized base of a model plus the
dynamic error compensation at k_chunk in {0, 8, 16, 32, 64, 128}, dynamic (approximate top-k) vs exact
top-k vs static (calibration-chosen) vs random channels, all in torch (ggml_ext.qdec.simulate).

    PYTHONPATH=python python bench/qdec/bench_dec.py [--model smollm2|gemma3] [--types Q4_0,Q3_K:pure]
        [--windows 8] [--seq-len 512] [--calib-samples 16] [--calib-seq-len 512] [--json OUT.json]

Bases are made by our llama-quantize from the asset's GGUF (--allow-requantize: each model's HF folder is
its GGUF's weights dequantized, so requantizing equals quantizing the HF weights), token embedding and
output in F32 (the simulation takes them from the HF folder, so llama.cpp and torch see the same model);
a type ``T:pure`` passes --pure (every linear T where its rows allow, llama-quantize's fallback elsewhere).
Side files by `calibrate dec` on wiki-train. Perplexity exactly as llama-perplexity -c SEQ_LEN --chunks
WINDOWS computes it: its windows (llama.cpp's tokenizer through llama-cpp-python, the first WINDOWS
windows of wiki-test, BOS over each window's first token where the vocabulary adds one), the second half
of each window scored. Bases and side files are cached under ~/.cache/ggml-ext/dec/. Prints a markdown
table per base, with k = 0 (the base alone) and "full" (every channel's 4-bit residual: the ceiling)
measured in the same run.

Validation of the simulator (unless --no-validate): our llama-perplexity on the base GGUF, same windows,
against the torch model's k = 0.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODELS = {"smollm2": ("smollm2-gguf", "smollm2-hf"), "gemma3": ("gemma3-270m-gguf", "gemma3-hf")}


def _llama_windows(base, text, n_ctx: int, n: int):
    """llama-perplexity's first ``n`` windows of ``text``: its tokenizer, its BOS rule (common_tokenize
    with add_special; BOS written over each window's first token where the vocabulary adds one)."""
    import torch

    from ggml_ext.llama_cpp_glue import Llama
    llm = Llama(str(base), vocab_only=True, verbose=False)
    toks = llm.tokenize(Path(text).read_bytes(), add_bos=True, special=False)
    bos = llm.token_bos()
    add_bos = bool(toks) and toks[0] == bos
    if len(toks) < n * n_ctx:
        raise SystemExit(f"{text}: {len(toks)} tokens, fewer than {n} windows of {n_ctx}")
    rows = torch.tensor(toks[:n * n_ctx], dtype=torch.int64).reshape(n, n_ctx)
    if add_bos:
        rows[:, 0] = bos
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    ap.add_argument("--types", default="Q4_0,Q3_K:pure",
                    help="llama-quantize types of the bases (T:pure passes --pure)")
    ap.add_argument("--k", default="0,8,16,32,64,128", help="k_chunk values")
    ap.add_argument("--modes", default="dynamic,static,random", help="of dynamic,exact,static,random")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--calib-seq-len", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="torch and llama.cpp threads on the CPU")
    ap.add_argument("--other-k", default=None,
                    help="k_chunk values at which the modes other than dynamic run (default: all of --k)")
    ap.add_argument("--no-validate", action="store_true", help="skip the llama-perplexity check at k = 0")
    ap.add_argument("--json", default=None, help="write the results here too (rewritten after each row)")
    args = ap.parse_args()

    import torch

    from ggml_ext import assets, tools
    from ggml_ext import _atomic
    from ggml_ext.gguf import read_gguf
    from ggml_ext.qdec import calibration
    from ggml_ext.qdec.simulate import DecModel
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
    other_k = None if args.other_k is None else {int(k) for k in args.other_k.split(",")}
    wiki_test = assets.path("wiki-test")
    head = (f"QDEC perplexity ladder: {args.model}, the first {args.windows} windows of {args.seq_len} tokens of "
            f"wiki-test, second halves scored (llama-perplexity's); "
            f"calibration {args.calib_samples} x {args.calib_seq_len} of wiki-train; {platform.node()}, "
            f"{os.cpu_count()} CPUs, torch {torch.__version__}, device {args.device}")
    print(f"# {head}")
    print(f"# command: {' '.join(sys.argv)}")
    results = {"setup": head, "command": " ".join(sys.argv), "model": args.model, "windows": args.windows,
               "seq_len": args.seq_len, "k": ks, "modes": modes, "bases": {}}

    def dump():
        if args.json:
            _atomic.write_text(Path(args.json), json.dumps(results, indent=1) + "\n")

    for spec in args.types.split(","):
        t, _, opt = spec.partition(":")
        if opt not in ("", "pure"):
            raise SystemExit(f"--types {spec}: the only option is :pure")
        tag = t + ("-pure" if opt else "")
        base = cache / f"{args.model}-{tag}.emb32.gguf"
        if not base.exists():
            tmp = base.with_suffix(".tmp.gguf")
            extra = ["--pure"] if opt else []
            subprocess.run(tools.command("llama-quantize", "--allow-requantize", *extra, "--token-embedding-type",
                                         "f32", "--output-tensor-type", "f32", src, tmp, t, str(args.threads)),
                           env=tools.tool_env(), check=True, capture_output=True)
            tmp.rename(base)
        side = cache / f"{args.model}-{tag}.c{args.calib_samples}x{args.calib_seq_len}.dec.gguf"
        t0 = time.time()
        prev_side = next(iter(sorted(cache.glob(f"{args.model}-*.c{args.calib_samples}x{args.calib_seq_len}.dec.gguf"))),
                         None)
        if not side.exists():
            if prev_side is not None:   # same model: reuse the activation statistics, new residuals
                calibration.rebase(calibration.load(prev_side), base, hf).save(side)
            else:
                calibration.calibrate(base, hf, None, args.calib_samples, args.calib_seq_len,
                                      args.device).save(side)
        t_cal = time.time() - t0
        lin = [x for x in read_gguf(base).tensors if x.name.startswith("blk.") and not x.name.endswith("norm.weight")]
        mix = collections.Counter(x.type_name for x in lin)
        wmix = collections.Counter()
        for x in lin:
            wmix[x.type_name] += int(np.prod(x.shape))
        nw = sum(wmix.values())
        bpw = sum(x.nbytes for x in lin) * 8 / nw
        r = results["bases"][tag] = {
            "mix": dict(mix), "weight_share": {k: v / nw for k, v in wmix.items()}, "bpw": bpw,
            "side_mib": side.stat().st_size / 2**20, "table": {m: {} for m in modes}, "recall": {}}
        m = DecModel(base, side, hf, device=args.device)
        print(f"\n## base {tag} (decoder linears: {', '.join(f'{n} {c}' for n, c in mix.most_common())}; "
              f"by weights {', '.join(f'{n} {v / nw:.0%}' for n, v in wmix.most_common())}; {bpw:.2f} bits "
              f"per weight); side file {r['side_mib']:.1f} MiB, calibrated in {t_cal:.0f} s (0 s: cached)\n")
        t0 = time.time()
        tokens = _llama_windows(base, wiki_test, args.seq_len, args.windows)
        first = args.seq_len // 2
        m.configure("none", 0)
        p0 = m.perplexity(tokens, first)
        r["base"] = p0
        if not args.no_validate:
            lp = tools.perplexity(base, wiki_test, n_ctx=args.seq_len, chunks=args.windows, threads=args.threads)
            r["validate"] = {"llama_perplexity": lp.ppl, "llama_err": lp.stderr, "torch": p0,
                             "tokens": lp.n_tokens_scored}
            print(f"simulator check at k=0 on {lp.n_chunks} x {lp.n_ctx} windows ({lp.n_tokens_scored} tokens "
                  f"scored): our llama-perplexity {lp.ppl:.4f} +/- {lp.stderr:.4f}, torch {p0:.4f} "
                  f"({(p0 / lp.ppl - 1) * 100:+.2f} %)\n", flush=True)
        dump()
        m.configure("full", 0)
        pf = m.perplexity(tokens, first)
        r["base"], r["full"] = p0, pf
        dump()
        print(f"base alone (k=0): {p0:.4f}; every channel compensated (4-bit residual ceiling): {pf:.4f}\n")
        print("| k_chunk | " + " | ".join(modes) + (" | recall of the approximate top-k |" if "dynamic" in modes else " |"))
        print("| --- |" + " --- |" * (len(modes) + ("dynamic" in modes)))
        for k in ks:
            cells, rec = [], ""
            for mode in modes:
                if k == 0:
                    cells.append(f"{p0:.4f}")
                    continue
                if mode != "dynamic" and other_k is not None and k not in other_k:
                    cells.append("-")
                    continue
                m.configure(mode, k)
                p = m.perplexity(tokens, first)
                r["table"][mode][k] = p
                cells.append(f"{p:.4f}")
                if mode == "dynamic":
                    r["recall"][k] = m.recall
                    rec = f"{m.recall:.3f}"
                dump()
            if "dynamic" in modes:
                cells.append(rec or "-")
            print(f"| {k} | " + " | ".join(cells) + " |", flush=True)
        r["seconds"] = time.time() - t0
        dump()
        print(f"\n({r['seconds']:.0f} s for this base)")
        del m
    return 0


if __name__ == "__main__":
    sys.exit(main())
