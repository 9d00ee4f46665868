#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Any-precision": the quantizer's weighted error against k-means at each width.
"""Any-precision quantizer quality without a model run: per precision, the Fisher-weighted squared error of
the one-file codes (seed + upscaling, with and without the joint refinement) over that of the independent
k-means optimum at each precision, on real rows of the default model; and the quantizer's time on
Llama-2-7B-shaped random matrices (``--time-7b``).

  bench/anyprec/bench_anyprec_sse.py [--model smollm2|gemma3] [--rows 96] [--layers 3,10,15,25] [--refine 0,1,2,3]
                               [--variants R:T:G,...] [--calib 4x64]
  bench/anyprec/bench_anyprec_sse.py --time-7b [--refine 0,2] [--layers-7b 1] [--threads N]

Quality: for each (layer, matrix) ``--rows`` rows spread over the matrix, the Fisher diagonal of the
calibration engine (``--calib`` samples x tokens of wiki-train, cached), normalised like the method does;
"k-means b" = ``quantize(bits b-b)``, the exact b-bit optimum of each row (the independent baseline of
docs/RESULTS.md); printed: sum of weighted SSE at b of the one-file codes / that of k-means b.
``--variants R:T:G,...`` adds one-file codes of refinement depth R, T extra starts and gain G (the
method's ``refine`` / ``starts`` / ``gain``) to the ``--refine`` depths (which run with starts 0, gain 1).
Time: seed + upscaling of ``--layers-7b`` decoder layers of Llama-2-7B shapes (q, k, v, o 4096x4096; gate,
up 11008x4096; down 4096x11008; weights N(0, 0.02), Fisher Gamma(0.5)), seconds, and the 32-layer model
extrapolated (the paper: 52 s on 24 cores).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from ggml_ext import anyprec as ap
from ggml_ext.methods.anyprec import FISHER_FLOOR

MATS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")
SHAPES_7B = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]


def norm_fisher(F: np.ndarray) -> np.ndarray:
    F = np.asarray(F, dtype=np.float64)
    F = F + FISHER_FLOOR * F.mean(axis=1, keepdims=True) + np.finfo(np.float32).tiny
    return (F / F.mean(axis=1, keepdims=True)).astype(np.float32)


def name(v: tuple[int, int, float]) -> str:
    return str(v[0]) if v[1:] == (0, 1.0) else f"{v[0]} starts {v[1]} gain {v[2]:g}"


def quality(a) -> None:
    from ggml_ext import assets
    from ggml_ext.calibrate import stats
    from ggml_ext.converters.source import open_checkpoint
    hf = assets.path(f"{a.model}-hf")
    n_s, seq = (int(v) for v in a.calib.split("x"))
    st = stats.collect(hf, text="wiki-train", what=("fisher",), n_samples=n_s, seq_len=seq, progress=False)
    ck = open_checkpoint(hf)
    refines = [(int(r), 0, 1.0) for r in a.refine.split(",") if r]
    refines += [(int(r), int(t), float(g)) for r, t, g in (v.split(":") for v in a.variants.split(",") if v)]
    tot = {r: np.zeros(6) for r in refines}
    ind_tot = np.zeros(6)
    print("| layer.matrix | refine | " + " | ".join(f"{b} bits" for b in range(3, 9)) + " |")
    print("|---|---|" + "---|" * 6)
    for layer in (int(x) for x in a.layers.split(",")):
        lay = st.layer(layer)
        for mod in MATS:
            full = f"model.layers.{layer}.{mod}"
            W = np.asarray(ck.load(f"{full}.weight"), dtype=np.float32)
            idx = np.linspace(0, W.shape[0] - 1, min(a.rows, W.shape[0])).astype(int)
            W, F = W[idx], norm_fisher(lay[full]["weight_fisher"][idx])
            ind = np.array([ap.sse(W, F, *ap.quantize(W, F, b, b, threads=a.threads), b, b, b).sum()
                            for b in range(3, 9)])
            ind_tot += ind
            for r in refines:
                c, t = ap.quantize(W, F, 3, 8, threads=a.threads, refine=r[0], starts=r[1], gain=r[2])
                e = np.array([ap.sse(W, F, c, t, b).sum() for b in range(3, 9)])
                tot[r] += e
                print(f"| {layer}.{mod} | {name(r)} | " + " | ".join(
                    f"{x / y:.3f}" if y > 0 else ("1.000" if x == 0 else "inf") for x, y in zip(e, ind)) + " |",
                    flush=True)
    for r in refines:
        print(f"| **all** | {name(r)} | " + " | ".join(f"**{x / y:.3f}**" if y > 0 else "inf"
                                                for x, y in zip(tot[r], ind_tot)) + " |")
    ck.close()


def time_7b(a) -> None:
    rng = np.random.default_rng(0)
    threads = a.threads or os.cpu_count()
    vs = [(int(r), 0, 1.0) for r in a.refine.split(",") if r]
    vs += [(int(r), int(t), float(g)) for r, t, g in (v.split(":") for v in a.variants.split(",") if v)]
    for v in vs:
        total, n = 0.0, 0
        for _ in range(a.layers_7b):
            for rows, cols in SHAPES_7B:
                W = (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02))
                F = rng.gamma(0.5, 1.0, (rows, cols)).astype(np.float32)
                t0 = time.perf_counter()
                ap.quantize(W, F, 3, 8, threads=threads, refine=v[0], starts=v[1], gain=v[2])
                total += time.perf_counter() - t0
                n += W.size
        print(f"refine {name(v)}: {a.layers_7b} Llama-2-7B layer(s), {n} weights, {total:.1f} s on {threads} threads; "
              f"32 layers extrapolated: {total * 32 / a.layers_7b:.0f} s ({1e9 * total * threads / n:.0f} "
              f"ns per weight and thread)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--layers", default="3,10,15,25")
    p.add_argument("--refine", default="0,1,2,3", help="refinement depths to compare (0: the paper's greedy)")
    p.add_argument("--model", default="smollm2", choices=("smollm2", "gemma3"))
    p.add_argument("--variants", default="", help="R:T:G,... one-file codes with refine R, starts T, gain G too")
    p.add_argument("--calib", default="4x64", help="Fisher calibration: SAMPLESxTOKENS of wiki-train (cached)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--time-7b", action="store_true", help="time the quantizer on Llama-2-7B-shaped random layers")
    p.add_argument("--layers-7b", type=int, default=1)
    a = p.parse_args()
    if a.time_7b:
        time_7b(a)
    else:
        quality(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
