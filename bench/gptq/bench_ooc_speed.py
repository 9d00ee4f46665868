#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "GPTQ and OOC": OOC's batched candidates against one sweep per candidate.
"""OOC's quantization time: all candidate groups in one batched sweep vs one sweep per candidate.

For each SHAPE (rows x columns; Llama-2-7B's q/k/v/o 4096x4096, gate/up 11008x4096, down 4096x11008) a
seeded weight matrix W (normal, std 0.02), a Hessian H = XᵀX of correlated calibration inputs (as
bench/gptq/bench_gptq_gpu.py makes them: 2048 samples X = Z·A, a few outlier channels) and the probe
Hessian of its last 256 samples are made; then on ``--device``, median of ``--repeat`` runs after a
warm-up:

* ``gptq``: plain GPTQ(l) (:func:`ggml_ext.methods.gptq.gptq`), one sweep; ``gptq, batched engine``: the
  same with :func:`~ggml_ext.methods.ooc.gptq_candidates` and one copy (on a GPU: Q4_0's block
  scales chosen on the device);
* ``ooc sequential``: GPTQ(h,l,p,s) as :func:`ggml_ext.methods.ooc.gptq_hlps` runs it
  (``implementation="reference"``): one sweep per candidate group, one after the other;
* ``ooc batched``: :func:`ggml_ext.methods.ooc.gptq_hlps_batched`, all candidates in one sweep;
* ``both flows, sequential`` (gptq + ooc sequential, as the double workflow runs a layer whose two flows
  share the Hessian) vs ``both flows, batched`` (the plain flow as one more copy in the batched sweep).

``--check`` shapes: Q4_0's block scales chosen on the device must be ggml's (200k random blocks), and
the batched and the sequential OOC must agree (chosen group, bytes of W_l, side-car
idx and S, plain flow's bytes); the script exits 1 if they do not. ``--model-layer N``: the same timings
on the CPU for the 7 matrices of decoder layer N of the default model (SmolLM2-135M, 8 x 128 wiki-train
tokens), per matrix and for the layer. ``--json FILE``: the rows as JSON too.

    PYTHONPATH=python GGML_EXT_PREFIX=... python3 bench/gptq/bench_ooc_speed.py --device cuda \\
        --check 576x1536 --shapes 4096x4096,11008x4096,4096x11008 --s 0.1
    PYTHONPATH=python GGML_EXT_PREFIX=... python3 bench/gptq/bench_ooc_speed.py --device cpu --shapes "" \\
        --check "" --model-layer 1 --s 0.1,0.5
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from ggml_ext.methods.gptq import _torch_threads, gptq  # noqa: E402
from ggml_ext.methods.grids import grid  # noqa: E402
from ggml_ext.methods.ooc import gptq_candidates, gptq_hlps, gptq_hlps_batched  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gptq_gpu import shapes, timed  # noqa: E402  (one timing rule for the GPTQ and OOC benches)


def problem(rows: int, cols: int, seed: int, device: str):
    """W, H and the probe Hessian (the last 256 of the 2048 calibration samples), float64 numpy."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    W = (0.02 * torch.randn(rows, cols, generator=g, dtype=torch.float64)).numpy()
    Z = torch.randn(2048, cols, generator=g, dtype=torch.float64).to(device)
    A = torch.eye(cols, dtype=torch.float64, device=device) + \
        0.1 * torch.randn(cols, cols, generator=g, dtype=torch.float64).to(device) / cols ** 0.5
    X = Z @ A
    X[:, :: max(1, cols // 8)] *= 20.0
    return W, (X.T @ X).cpu().numpy(), (X[-256:].T @ X[-256:]).cpu().numpy()


def agree(W, H, Hp, type_name, opts, device) -> tuple[bool, str]:
    """Batched vs sequential OOC (and the plain flow) on one problem: (identical, what differs)."""
    g = grid(type_name)
    ref = gptq_hlps(W, H, Hp, type_name, device=device, **opts)
    bat, plain = gptq_hlps_batched(W, H, Hp, type_name, device=device, with_plain=True, **opts)
    diffs = [what for what, same in [
        ("group", ref.group == bat.group), ("W_l bytes", np.array_equal(ref.base.pack(g), bat.base.pack(g))),
        ("idx", np.array_equal(ref.idx, bat.idx)), ("S", np.array_equal(ref.S, bat.S)),
        ("plain flow bytes", np.array_equal(gptq(W, H, type_name, device=device).pack(g), plain.pack(g)))] if not same]
    return not diffs, ", ".join(diffs) or f"identical (group {bat.group} of {len(bat.candidates)} candidates)"


def scales_agree(device: str, n: int = 200_000) -> tuple[bool, str]:
    """Q4_0 block scales chosen on ``device`` (scales_torch) vs ggml's quantizer on the host, on ``n``
    random blocks (outliers, grid-aligned ties), with importances spanning six decades and without."""
    from ggml_ext.methods.scales_torch import q4_0_scales
    rng = np.random.default_rng(5)
    x = rng.normal(0, 0.02, (n, 32)).astype(np.float32)
    x[::7, rng.integers(0, 32)] *= 30
    x[::11] = np.round(x[::11] * 400) / 400
    bad = []
    for imp in (None, (rng.random(32) * 10 ** rng.uniform(-3, 3, 32)).astype(np.float32)):
        want = grid("Q4_0").scales(x, imp)[:, 0]
        got = q4_0_scales(torch.from_numpy(x).to(device), None if imp is None else torch.from_numpy(imp).to(device))
        bad.append(int((want != got.cpu().numpy()).sum()))
    return not any(bad), f"{n} blocks, {bad[0]} differ without importances, {bad[1]} with"


def time_one(W, H, Hp, type_name, opts, device, repeat) -> dict:
    """Seconds of each way of quantizing one matrix (module docstring)."""
    t = {"gptq": timed(lambda: gptq(W, H, type_name, device=device), repeat),
         "gptq, batched engine": timed(lambda: gptq_candidates(W, H, type_name, [None], device=device), repeat),
         "ooc sequential": timed(lambda: gptq_hlps(W, H, Hp, type_name, device=device, **opts), repeat),
         "ooc batched": timed(lambda: gptq_hlps_batched(W, H, Hp, type_name, device=device, **opts), repeat),
         "both flows, batched": timed(lambda: gptq_hlps_batched(W, H, Hp, type_name, device=device, with_plain=True,
                                                               **opts), repeat)}
    t["both flows, sequential"] = t["gptq"] + t["ooc sequential"]
    return t


HEADER = ("| matrix | s | candidates | gptq s | gptq, batched engine s | ooc sequential s | ooc batched s | speed-up | both flows seq. s "
          "| both flows batched s | speed-up |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def row(label, s, n_cand, t) -> str:
    return (f"| {label} | {s:g} | {n_cand} | {t['gptq']:.2f} | {t['gptq, batched engine']:.2f} | {t['ooc sequential']:.2f} | {t['ooc batched']:.2f} | "
            f"{t['ooc sequential'] / t['ooc batched']:.1f}x | {t['both flows, sequential']:.2f} | "
            f"{t['both flows, batched']:.2f} | {t['both flows, sequential'] / t['both flows, batched']:.1f}x |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--type", default="q4_0")
    ap.add_argument("--h", type=int, default=8)
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--s", default="0.1", help="scanned fractions of the groups, comma-separated")
    ap.add_argument("--check", default="576x1536", help="shapes on which batched and sequential must agree")
    ap.add_argument("--shapes", default="4096x4096,11008x4096,4096x11008", help="shapes timed")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--model-layer", type=int, default=None, help="also time the default model's decoder layer N")
    ap.add_argument("--cpu-threads", type=int, default=0, help="torch threads on the CPU (0: 1, as the method uses)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    type_name = a.type.upper()
    svals = [float(v) for v in a.s.split(",")]
    dev_name = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    threads = a.cpu_threads or 1
    print(f"# device {a.device} ({dev_name}), torch {torch.__version__}, type {type_name}, OOC(h={a.h}, p={a.p}), "
          f"CPU threads {threads}")
    out: list[dict] = []
    ok = True
    ctx = _torch_threads(threads)
    with ctx:
        if a.check and type_name == "Q4_0":
            same, what = scales_agree(a.device)
            ok &= same
            out.append({"check": "q4_0 scales", "identical": same, "what": what})
            print(f"check Q4_0 scales on {a.device} vs ggml's quantizer: {what}", flush=True)
        for rows, cols in shapes(a.check):
            W, H, Hp = problem(rows, cols, 1, a.device)
            same, what = agree(W, H, Hp, type_name, dict(h=a.h, p=a.p, s=max(svals)), a.device)
            ok &= same
            out.append({"check": f"{rows}x{cols}", "identical": same, "what": what})
            print(f"check {rows}x{cols} ({a.device}): batched vs sequential OOC: {what}", flush=True)
        if a.shapes:
            print(HEADER)
        for rows, cols in shapes(a.shapes):
            W, H, Hp = problem(rows, cols, 2, a.device)
            gptq_hlps_batched(W[:64], H, Hp, type_name, device=a.device, h=a.h, p=a.p, s=min(svals))   # warm-up
            for s in svals:
                opts = dict(h=a.h, p=a.p, s=s)
                n_cand = max(1, int(np.ceil(s * np.ceil(cols / 128))))
                t = time_one(W, H, Hp, type_name, opts, a.device, a.repeat)
                out.append({"shape": f"{rows}x{cols}", "s": s, "candidates": n_cand, "device": a.device, **t})
                print(row(f"{rows}x{cols}", s, n_cand, t), flush=True)
        if a.model_layer is not None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
            import convert_support as cs
            layer = cs.real_layer(str(cs.default_hf()), a.model_layer, ("hessian", "probe_hessian"))
            print(f"\ndefault model ({cs.default_hf().name}), decoder layer {a.model_layer}, {a.device}:")
            print(HEADER)
            for s in svals:
                total = {}
                for name, (W, st) in layer.items():
                    W64 = W.astype(np.float64)
                    n_cand = max(1, int(np.ceil(s * np.ceil(W.shape[1] / 128))))
                    t = time_one(W64, st["hessian"], st["probe_hessian"], type_name, dict(h=a.h, p=a.p, s=s),
                                 a.device, a.repeat)
                    total = {k: total.get(k, 0.0) + v for k, v in t.items()}
                    short = name.rsplit(".", 1)[-1]
                    out.append({"model_layer": a.model_layer, "matrix": short, "shape": "x".join(map(str, W.shape)),
                                "s": s, "candidates": n_cand, "device": a.device, **t})
                    print(row(f"{short} {W.shape[0]}x{W.shape[1]}", s, n_cand, t), flush=True)
                out.append({"model_layer": a.model_layer, "matrix": "layer", "s": s, "device": a.device, **total})
                print(row(f"**layer {a.model_layer} (7 matrices)**", s, "", total), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": a.device, "device_name": dev_name, "torch": torch.__version__,
                                            "type": type_name, "h": a.h, "p": a.p, "rows": out}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
