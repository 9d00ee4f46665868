#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "GPTQ and OOC": OOC against GPTQ per matrix of one layer (probe and held-out error).
"""OOC(h, l, p, s) against GPTQ(l) on one real decoder layer: the per-matrix losses, no model conversion.

  bench/gptq/bench_ooc_layer.py [--model smollm2] [--layer 1] [--type q2_k] [--h 2] [--p 0.1] [--s 0.1,0.2,0.5,1]
                             [--samples 8] [--seq-len 128] [--json OUT]

The layer's Hessians (and the probe: the last calibration sample) come from ``--samples`` windows of wiki-train
streamed through the unquantized layers before it (tests/convert_support.py's ``real_layer``, the OOC tests'
layer); the held-out Hessians from as many windows of wiki-test. Each matrix is quantized to the type the
converter's policy gives it for ``--type`` (``q2_k``: Q2_K where the rows are a multiple of 256, else Q4_0,
as llama-quantize falls back), by GPTQ(l) and by GPTQ(h, l, p, s) (methods/ooc.py ``gptq_hlps``, the clear
columns at ``ooc.clear_bits(h, type)`` bits) for each s. Rows: the probe loss tr(ΔW H_probe ΔWᵀ) (what OOC
picks its candidate by) and the held-out output error tr(ΔW H_test ΔWᵀ), relative to GPTQ's, and the seconds.
What a whole-model run adds (the layers feeding each other, the double workflow's choice, perplexity) is
bench/gptq/bench_ooc.py's; this one fits the shared 2-core machine (a few minutes).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("bench", "convert")))
import convert_support as cs  # noqa: E402
from bench_convert import cpu_name  # noqa: E402
from ggml_ext import assets  # noqa: E402
from ggml_ext.methods import gptq as G  # noqa: E402
from ggml_ext.methods import ooc as O  # noqa: E402

HF = {"smollm2": "smollm2-hf", "gemma3": "gemma3-hf"}


def layer_type(type_name: str, cols: int) -> str:
    """The type a matrix of ``cols`` columns gets for ``type_name`` (K-quants: Q4_0 unless cols % 256 == 0)."""
    t = type_name.upper()
    return t if not t.endswith("_K") or cols % 256 == 0 else "Q4_0"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", choices=sorted(HF))
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--type", default="q2_k")
    ap.add_argument("--h", type=int, default=2)
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--s", default="0.1,0.2,0.5,1")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    hf = str(assets.path(HF[a.model]))
    print(f"# {cpu_name()}; {a.model} layer {a.layer}; Hessians {a.samples} x {a.seq_len} tokens of wiki-train "
          f"(probe: the last), held-out {a.samples} x {a.seq_len} of wiki-test", file=sys.stderr)
    train = cs.real_layer(hf, a.layer, ("hessian", "probe_hessian"), a.samples, a.seq_len)
    test = cs.real_layer(hf, a.layer, ("hessian",), a.samples, a.seq_len, text="wiki-test")
    rows = []
    with G._torch_threads(1):
        for name, (W, st) in train.items():
            H, Hp, Ht = st["hessian"], st["probe_hessian"], test[name][1]["hessian"]
            t = layer_type(a.type, W.shape[1])
            t0 = time.time()
            plain = G.gptq(W, H, t)
            base = {"probe": O.probe_loss(W, plain.Q, Hp), "test": O.probe_loss(W, plain.Q, Ht),
                    "seconds": time.time() - t0}
            rows.append({"matrix": name.rsplit(".", 1)[-1], "type": t, "method": "gptq", **base})
            for s in (float(x) for x in a.s.split(",")):
                h = O.clear_bits(a.h, t)
                t0 = time.time()
                r = O.gptq_hlps(W, H, Hp, t, h=h, p=a.p, s=s)
                rows.append({"matrix": name.rsplit(".", 1)[-1], "type": t, "method": f"ooc({h},{t},{a.p:g},{s:g})",
                             "probe": r.loss, "test": O.probe_loss(W, r.effective(), Ht),
                             "seconds": time.time() - t0, "group": r.group, "candidates": len(r.candidates),
                             "vs_gptq": {"probe": r.loss / base["probe"] - 1,
                                         "test": O.probe_loss(W, r.effective(), Ht) / base["test"] - 1}})
                print(f"# {rows[-1]['matrix']} {rows[-1]['method']}: probe {100 * rows[-1]['vs_gptq']['probe']:+.2f}%"
                      f", held-out {100 * rows[-1]['vs_gptq']['test']:+.2f}%", file=sys.stderr)
    print("| matrix | type | method | probe loss | held-out error | vs GPTQ (probe / held-out) | candidates | time |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        v = r.get("vs_gptq")
        rel = "" if v is None else f"{100 * v['probe']:+.2f}% / {100 * v['test']:+.2f}%"
        print(f"| {r['matrix']} | {r['type']} | {r['method']} | {r['probe']:.4g} | {r['test']:.4g} | {rel} | "
              f"{r.get('candidates', '')} | {r['seconds']:.1f} s |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
