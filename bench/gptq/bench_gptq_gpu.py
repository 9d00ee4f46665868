#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "GPTQ and OOC": batched GPTQ on the GPU against the sequential reference (bytes and time).
"""GPTQ's batched torch implementation on a GPU: same bytes as the CPU reference, and its speed.

For each SHAPE (rows x columns, e.g. 4096x11008 for a Llama-2-7B ffn_up/gate matrix seen from
ffn_down's side, 11008 columns), a seeded weight matrix W (normal, std 0.02) and a Hessian H = XᵀX
of correlated calibration inputs (X = Z·A: 2048 samples, a random mixing A so the columns are
correlated as real activations are; a few columns scaled up as outlier channels) are made on the
device; then

* ``--check`` shapes: :func:`ggml_ext.methods.gptq.gptq_reference` (numpy, one column at a time)
  and :func:`~ggml_ext.methods.gptq.gptq` on the device must give identical bytes
  (``GPTQResult.pack``); the script exits 1 if they do not;
* every shape: the wall time of ``gptq`` on the device (median of ``--repeat`` runs after a warm-up),
  and on the CPU for shapes up to ``--cpu-max`` weights, all in the same run;
* ``--reference`` shapes: the wall time of the sequential reference (numpy, float64, one column at a
  time, every later column updated at once: the plain algorithm) on the same problem, one run, and the
  batched implementation's speed-up over it;
* ``--json FILE``: every row written as JSON as well (the device script puts it under $OUT).

    PYTHONPATH=python GGML_EXT_PREFIX=... python3 bench/gptq/bench_gptq_gpu.py --device cuda \\
        --check 576x1536,1536x576 --shapes 4096x4096,11008x4096,4096x11008 --type q4_0

The scale choice per 32-column block calls ggml's quantizer on the CPU (once per block, all rows);
the column sweep and the lazy updates run on ``--device``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from ggml_ext.methods.gptq import gptq, gptq_reference  # noqa: E402
from ggml_ext.methods.grids import grid  # noqa: E402


def problem(rows: int, cols: int, seed: int, device: str) -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    W = (0.02 * torch.randn(rows, cols, generator=g, dtype=torch.float64)).numpy()
    Z = torch.randn(2048, cols, generator=g, dtype=torch.float64).to(device)
    A = torch.eye(cols, dtype=torch.float64, device=device) + \
        0.1 * torch.randn(cols, cols, generator=g, dtype=torch.float64).to(device) / cols ** 0.5
    X = Z @ A
    X[:, :: max(1, cols // 8)] *= 20.0   # a few outlier channels, as real activations have
    H = (X.T @ X).cpu().numpy()
    return W, H


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--type", default="q4_0")
    ap.add_argument("--check", default="576x1536,1536x576", help="shapes whose bytes are compared with the reference")
    ap.add_argument("--shapes", default="4096x4096,11008x4096,4096x11008", help="shapes timed")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu-max", type=int, default=4096 * 4096, help="time the CPU too up to this many weights")
    ap.add_argument("--reference", default="", help="shapes on which the sequential numpy reference is timed too")
    ap.add_argument("--scale-rule", default="dynamic", choices=("dynamic", "static"))
    ap.add_argument("--json", default=None, help="write the rows as JSON to this file")
    ap.add_argument("--cpu-threads", type=int, default=0, help="torch threads on the CPU (0: torch's default)")
    a = ap.parse_args()
    if a.cpu_threads:
        torch.set_num_threads(a.cpu_threads)
    type_name = a.type.upper()
    g = grid(type_name)
    dev_name = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"# device {a.device} ({dev_name}), torch {torch.__version__}, type {type_name}, CPU threads "
          f"{torch.get_num_threads()}")
    ok = True
    rows_out: list[dict] = []
    for rows, cols in shapes(a.check):
        W, H = problem(rows, cols, 1, a.device)
        ref = gptq_reference(W, H, type_name, scale_rule=a.scale_rule).pack(g)
        dev = gptq(W, H, type_name, device=a.device, scale_rule=a.scale_rule).pack(g)
        same = np.array_equal(ref, dev)
        ok &= same
        rows_out.append({"check": f"{rows}x{cols}", "identical": bool(same)})
        print(f"check {rows}x{cols}: reference (numpy, CPU) vs batched ({a.device}): "
              f"{'identical bytes' if same else f'DIFFER in {int((ref != dev).sum())} of {ref.size} bytes'}")
    print("| shape (rows x cols) | device | seconds (median) | columns/s |")
    print("| --- | --- | ---: | ---: |")
    for rows, cols in shapes(a.shapes):
        W, H = problem(rows, cols, 2, a.device)
        gptq(W[:64], H, type_name, device=a.device, scale_rule=a.scale_rule)  # warm-up: kernels, cuSOLVER
        where = [a.device] + (["cpu"] if a.device != "cpu" and rows * cols <= a.cpu_max else [])
        batched = None
        for d in where:
            t = timed(lambda: gptq(W, H, type_name, device=d, scale_rule=a.scale_rule), a.repeat if d == a.device else 1)
            batched = batched or t
            rows_out.append({"shape": f"{rows}x{cols}", "impl": "batched", "device": d, "seconds": t})
            print(f"| {rows}x{cols} | batched, {d} | {t:.2f} | {cols / t:.0f} |", flush=True)
        if (rows, cols) in shapes(a.reference):
            t = timed(lambda: gptq_reference(W, H, type_name, scale_rule=a.scale_rule), 1)
            rows_out.append({"shape": f"{rows}x{cols}", "impl": "reference", "device": "cpu", "seconds": t,
                             "batched_speedup": t / batched})
            print(f"| {rows}x{cols} | sequential reference (numpy), cpu | {t:.2f} | {cols / t:.0f} "
                  f"(batched: {t / batched:.1f}x its speed) |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": a.device, "device_name": dev_name, "torch": torch.__version__,
                                            "type": type_name, "scale_rule": a.scale_rule, "rows": rows_out}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
