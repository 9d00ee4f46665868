#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "KVQuant": llama-perplexity per -ctk / -ctv cache type, ours and pristine upstream's.
"""KVQuant cache types inside llama.cpp: llama-perplexity per K / V cache type, all in one run.

    PYTHONPATH=python GGML_EXT_PREFIX=... nice -n 10 python bench/kvquant/bench_kvquant_cache.py \
        [--ctx 512] [--chunks 4] [--threads 2] [--calib FILE] [--configs f16/f16,q4_0/f16,nuq4/f16,...]
        [--json OUT.json] [--upstream BIN_DIR] [--model ASSET_OR_GGUF]

A configuration is `K/V`, optionally with `+o` (--kv-outliers at the calibration's fraction), `+s`
(--kv-sink 1), `+r` (GGML_EXT_KV_VROT=1: NUQ values Hadamard-rotated, the calibration's rotated tables) and
`+t` (GGML_EXT_KV_VTABLE=token: the value tables fitted per token, as before the 64-value block tables) and
`+k` (GGML_EXT_KV_KROT=1: NUQ keys after RoPE, Hadamard-rotated, per-64 scales) and `+b`
(GGML_EXT_KV_KBLOCK=1: NUQ keys before RoPE, per channel and then per token and 64-channel block; without `+b`
a NUQ K row runs GGML_EXT_KV_KBLOCK=0, per channel alone, so rows keep the meaning they had before block-scaled
keys became the default)) for our types, or prefixed `up:` (the pristine upstream build's llama-perplexity from
--upstream, default ~/.cache/ggml-ext/upstream-0c1e57098/bin) and `up-norot:` (the same with
LLAMA_ATTN_ROT_DISABLE=1: upstream's quantized caches without their Hadamard rotation).
Bits per element (K and V averaged) come from the types' block sizes; the sink's float rows add
32 / n_ctx bits per element and side structure none (the outlier slots sit inside the blocks).

Each configuration is `-ctk K -ctv V` (flash attention on, as llama.cpp needs for a quantized V cache) on
the default model (SmolLM2-135M-Instruct, its asset GGUF) over wiki-test, with the KV calibration `--calib`
(default: the tests' shared 1 x 64-token calibration, made once and cached). Upstream's q8_0 / q4_0 caches
run with its Hadamard rotation (its default); ours (nuq4/3/2) store keys before RoPE with per-channel
calibrated ranges and values per 64-channel block (docs/KVQUANT.md). Prints perplexity, its difference to
the f16/f16 row of the same run and the wall time of each llama-perplexity call (the machine's load included).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench" / "convert"))
from bench_convert import cpu_name  # noqa: E402

DEFAULT_CONFIGS = "f16/f16,q8_0/f16,q4_0/f16,nuq4/f16,nuq3/f16,nuq2/f16,q4_0/q4_0,nuq4/nuq4,nuq3/nuq3"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calib", type=Path, default=None, help="KV calibration (default: the tests' 1 x 64 one)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated K/V cache type pairs")
    ap.add_argument("--outliers", type=float, default=0.01, help="--kv-outliers for +o (the calibration's fraction)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--upstream", type=Path, default=Path.home() / ".cache/ggml-ext/upstream-0c1e57098/bin")
    ap.add_argument("--model", default="smollm2-gguf", help="a GGUF file or an asset name (default smollm2-gguf)")
    a = ap.parse_args()

    from ggml_ext import assets, tools
    if a.calib is None:
        import convert_support as cs
        a.calib = cs.default_kv_calibration()
    model = Path(a.model) if Path(a.model).is_file() else assets.path(a.model)
    text = assets.path("wiki-test")
    rows = []
    bits = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "nuq4": 5.0, "nuq3": 4.0, "nuq2": 3.0}
    for cfg in a.configs.split(","):
        build, _, kv = cfg.rpartition(":")
        k, v = kv.split("/")
        flags = set(v.split("+")[1:])
        v = v.split("+")[0]
        extra = ["-fa", "on", "-ctk", k, "-ctv", v]
        env, binary = {}, None
        if build in ("up", "up-norot"):
            binary = a.upstream / "llama-perplexity"
            env["LD_LIBRARY_PATH"] = str(a.upstream)
            if build == "up-norot":
                env["LLAMA_ATTN_ROT_DISABLE"] = "1"
        if k.startswith("nuq") or v.startswith("nuq"):
            extra += ["--kv-calib", str(a.calib)]
            if "o" in flags:
                extra += ["--kv-outliers", str(a.outliers)]
            if "s" in flags:
                extra += ["--kv-sink", "1"]
            if "r" in flags:
                env["GGML_EXT_KV_VROT"] = "1"
            if "t" in flags:
                env["GGML_EXT_KV_VTABLE"] = "token"
            if "k" in flags:
                env["GGML_EXT_KV_KROT"] = "1"
            env["GGML_EXT_KV_KBLOCK"] = "1" if "b" in flags else "0"

        sink = 32.0 / a.ctx if "s" in flags else 0.0
        bpe = (bits[k] + bits[v]) / 2 + sink
        t0 = time.time()
        r = tools.perplexity(model, text, n_ctx=a.ctx, chunks=a.chunks, threads=a.threads, extra=extra, env=env,
                             binary=binary)
        rows.append({"config": cfg, "k": k, "v": v, "build": build or "ours", "flags": "".join(sorted(flags)),
                     "model": Path(model).name,
                     "bits": bpe, "ppl": r.ppl, "stderr": r.stderr, "seconds": time.time() - t0})
        print(f"{cfg:>22} {bpe:5.2f} b  PPL {r.ppl:8.4f} +/- {r.stderr:.4f}  {rows[-1]['seconds']:6.1f} s", flush=True)
    base = next((r["ppl"] for r in rows if r["k"] == "f16" and r["v"] == "f16"), None)
    names = {"up": "upstream", "up-norot": "upstream, no rotation", "ours": "ours"}
    print(f"\n{cpu_name()} ({platform.machine()}), {Path(model).name}, wiki-test, ctx {a.ctx}, {a.chunks} chunks, "
          f"-t {a.threads}, calibration {a.calib.name}\n")
    print("| build | K cache | V cache | outliers | sink | K scales | V tables | bits / element | perplexity | vs f16/f16 "
          "| wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        d = f"{100 * (r['ppl'] / base - 1):+.2f}%" if base else "-"
        o = "o" in r["flags"] and f"{100 * a.outliers:g}%" or "-"
        sk = "s" in r["flags"] and "1" or "-"
        vt = "-" if not r["v"].startswith("nuq") else (
            "rotated, block" if "r" in r["flags"] else "token" if "t" in r["flags"] else "block")
        ks = "-" if not r["k"].startswith("nuq") else (
            "rotated, after RoPE" if "k" in r["flags"] else "channel + block" if "b" in r["flags"] else "channel")
        print(f"| {names[r['build']]} | {r['k']} | {r['v']} | {o} | {sk} | {ks} | {vt} | {r['bits']:.3f} | {r['ppl']:.4f} "
              f"+/- {r['stderr']:.4f} | {d} | {r['seconds']:.0f} |")
    if a.json:
        a.json.write_text(json.dumps({"ctx": a.ctx, "chunks": a.chunks, "threads": a.threads, "calib": str(a.calib),
                                      "cpu": cpu_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
