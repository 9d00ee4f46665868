#!/usr/bin/env python3
"""KVQuant cache types inside llama.cpp: llama-perplexity per K / V cache type, all in one run.

    PYTHONPATH=python GGML_EXT_PREFIX=... nice -n 10 python scripts/bench_kvquant_cache.py \
        [--ctx 512] [--chunks 4] [--threads 2] [--calib FILE] [--configs f16/f16,q4_0/f16,nuq4/f16,...]
        [--json OUT.json]

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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))
from bench_convert import cpu_name  # noqa: E402

DEFAULT_CONFIGS = "f16/f16,q8_0/f16,q4_0/f16,nuq4/f16,nuq3/f16,nuq2/f16,q4_0/q4_0,nuq4/nuq4,nuq3/nuq3"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calib", type=Path, default=None, help="KV calibration (default: the tests' 1 x 64 one)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated K/V cache type pairs")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    from ggml_ext import assets, tools
    if a.calib is None:
        import convert_support as cs
        a.calib = cs.default_kv_calibration()
    model, text = assets.path("smollm2-gguf"), assets.path("wiki-test")
    rows = []
    for cfg in a.configs.split(","):
        k, v = cfg.split("/")
        extra = ["-fa", "on", "-ctk", k, "-ctv", v]
        if k.startswith("nuq") or v.startswith("nuq"):
            extra += ["--kv-calib", str(a.calib)]
        t0 = time.time()
        r = tools.perplexity(model, text, n_ctx=a.ctx, chunks=a.chunks, threads=a.threads, extra=extra)
        rows.append({"k": k, "v": v, "ppl": r.ppl, "stderr": r.stderr, "seconds": time.time() - t0})
        print(f"{k:>5} / {v:<5} PPL {r.ppl:8.4f} +/- {r.stderr:.4f}  {rows[-1]['seconds']:6.1f} s", flush=True)
    base = next((r["ppl"] for r in rows if r["k"] == "f16" and r["v"] == "f16"), None)
    print(f"\n{cpu_name()} ({platform.machine()}), SmolLM2-135M-Instruct, wiki-test, ctx {a.ctx}, {a.chunks} chunks, "
          f"-t {a.threads}, calibration {a.calib.name}\n")
    print("| K cache | V cache | perplexity | vs f16/f16 | wall s |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        d = f"{100 * (r['ppl'] / base - 1):+.2f}%" if base else "-"
        print(f"| {r['k']} | {r['v']} | {r['ppl']:.4f} | {d} | {r['seconds']:.0f} |")
    if a.json:
        a.json.write_text(json.dumps({"ctx": a.ctx, "chunks": a.chunks, "threads": a.threads, "calib": str(a.calib),
                                      "cpu": cpu_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
