#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "KVQuant": standalone nuq4 attention kernels against ggml's f16 vec_dot.
"""KVQuant's C kernels against llama.cpp's fp16 KV cache path: one layer's attention, single thread.

    PYTHONPATH=python GGML_EXT_PREFIX=... python bench/kvquant/bench_kvquant_kernels.py [--ctx 1024,4096,16384,32768]
        [--reps 5] [--shapes smollm2,gemma3,llama7b] [--json OUT.json]

For each model shape and context T: q . K (every KV head, its query heads in one call, RoPE on the fly
over pre-RoPE nuq4 keys with 1% outliers) and attention . V (per-token nuq4 values, 1% outliers), against
the same cache in fp16 through ggml-cpu's own F16 vec_dot (post-RoPE keys, one dot per token; values
transposed, one dot per channel: llama.cpp's non-flash-attention layout), best of --reps, measured in the
same run by bench/kvquant/bench_kvquant_kernels.c (compiled here with -O2 -march=native against the installed
libggml-cpu). Also the scalar reference (forced) at the smallest context, and the KV memory of each
shape at 32K and 128K tokens for nuq4/3/2 with 1% outliers vs fp16 (row sizes from the library).
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench" / "convert"))
from bench_convert import cpu_name  # noqa: E402

# (layers, KV heads, head dim, query heads per KV head): SmolLM2-135M-Instruct and Gemma-3-270M from their
# config.json (the assets), Llama-7B (LLaMA-1/2 7B: 32 layers, 32 heads of 128, no GQA), the paper's model
SHAPES = {"smollm2": (30, 3, 64, 3), "gemma3": (18, 1, 256, 4), "llama7b": (32, 32, 128, 1)}


def build(tmp: Path) -> Path:
    from ggml_ext import _locate
    from kernel_sources import KVQUANT, SRC
    lib = _locate.library("ggml-cpu").parent
    inc = lib.parent / "include"
    exe = tmp / "bench_kvquant_kernels"
    cmd = ["gcc", "-std=gnu11", "-O2", "-march=native", f"-I{REPO / 'ggml_ext' / 'include'}", f"-I{SRC}", f"-I{inc}",
           str(Path(__file__).resolve().with_suffix(".c")), *map(str, KVQUANT), f"-L{lib}", f"-Wl,-rpath,{lib}",
           "-lggml-cpu", "-lggml-base", "-lm", "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def run(exe: Path, shape, T: int, reps: int, impl: str | None = None) -> dict:
    _, n_kv, hd, g = shape
    out = subprocess.run([str(exe), str(n_kv), str(hd), str(g), str(T), "4", str(reps), *([impl] if impl else [])],
                         check=True, capture_output=True, text=True).stdout
    return {k: (float(v) if re.fullmatch(r"[\d.]+", v) else v) for k, v in re.findall(r"(\w+)=(\S+)", out)}


def memory_rows(shape) -> list[dict]:
    import numpy as np

    from ggml_ext.kvquant.kernels import KVCacheLayer, default_slots
    layers, n_kv, hd, _ = shape
    D = n_kv * hd
    rows = [{"cache": "fp16", "bytes_per_token_layer": 4 * D}]
    for bits in (4, 3, 2):
        n = 2 ** bits
        lv = np.linspace(-1, 1, n)
        ks, vs, vk = default_slots(D, 0.01)
        L = KVCacheLayer(bits=bits, n_kv_heads=n_kv, head_dim=hd, k_lo=-np.ones(D), k_hi=np.ones(D), k_levels=lv,
                         k_values=lv, v_levels=lv, v_values=lv, k_slots=ks, v_slots=vs, v_outliers_per_side=vk)
        rows.append({"cache": f"nuq{bits}-1%", "bytes_per_token_layer": L.k_row_size + L.v_row_size,
                     "k_slots": ks, "v_slots": vs})
    for r in rows:
        r["bits_per_element"] = r["bytes_per_token_layer"] * 8 / (2 * D)
        for T in (32768, 131072):
            r[f"GiB_{T // 1024}K"] = layers * T * r["bytes_per_token_layer"] / 2 ** 30
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", default="1024,4096,16384,32768", help="contexts (tokens in the cache)")
    ap.add_argument("--ctx-llama7b", default="1024,4096,8192", help="contexts for the Llama-7B shape (memory)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results = {"machine": f"{cpu_name()}, {platform.machine()}", "rows": [], "memory": {}}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        print(f"machine: {results['machine']}; single thread; best of {a.reps}; times in ms per layer (all heads)\n")
        print("| shape | T | kernel | nuq4 q.K | fp16 q.K | speed-up | nuq4 w.V | fp16 w.V | speed-up | bytes/token/layer nuq4 K+V vs fp16 |")
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for name in a.shapes.split(","):
            shape = SHAPES[name]
            ctxs = [int(c) for c in (a.ctx_llama7b if name == "llama7b" else a.ctx).split(",")]
            for i, T in enumerate(ctxs):
                for impl in ([None, "generic"] if i == 0 else [None]):
                    r = run(exe, shape, T, a.reps if impl is None else 1, impl)
                    r["shape"] = name
                    results["rows"].append(r)
                    print(f"| {name} | {T} | {r['impl']} | {r['kvq_k_ms']:.3f} | {r['f16_k_ms']:.3f} | "
                          f"{r['f16_k_ms'] / r['kvq_k_ms']:.2f}x | {r['kvq_v_ms']:.3f} | {r['f16_v_ms']:.3f} | "
                          f"{r['f16_v_ms'] / r['kvq_v_ms']:.2f}x | {int(r['k_row'] + r['v_row'])} vs {2 * int(r['fp16_row'])} |",
                          flush=True)
    print("\n| shape | cache | bits/element (K+V) | KV at 32K | KV at 128K |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in a.shapes.split(","):
        rows = memory_rows(SHAPES[name])
        results["memory"][name] = rows
        for r in rows:
            print(f"| {name} | {r['cache']} | {r['bits_per_element']:.2f} | {r['GiB_32K']:.3f} GiB | {r['GiB_128K']:.3f} GiB |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
