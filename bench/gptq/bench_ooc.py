#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "GPTQ and OOC": whole-model OOC against GPTQ perplexity.
"""Perplexity of OOC(h, l, p, s) against GPTQ(l) at the same ggml type (the K-OOC paper's table).

  bench/gptq/bench_ooc.py [--models smollm2] [--configs q4_0:8,q2_k:2] [--p 0.1] [--s 0.1,0.2,0.5,1]
                       [--calib-samples 16] [--calib-seq-len 512] [--validation-samples 4] [--chunks 20]
                       [--device cpu|cuda] [--flow both|ooc] [--no-gptq] [--threads N] [--json OUT]

For each model and config ``TYPE:H`` (l bits = the ggml type's grid, h = H bits for the clear columns), all
by ``ggml-ext convert`` of the HF folder with the same calibration text and sampling:

* ``gptq``: ``--method gptq --type TYPE`` -- GPTQ(l);
* ``ooc s=S`` for each S: ``--method ooc --type TYPE --ooc-h H --ooc-p P --ooc-s S``: the double workflow
  (GPTQ(l) and GPTQ(h,l,p,s) streamed side by side; the flow of lower loss on ``--validation-samples``
  held-out windows of the calibration text is written). ``--flow ooc`` writes the GPTQ(h,l,p,s) flow
  whatever the validation says (its own perplexity). Rows say which flow won, both validation losses, and
  the decoder-layer matrices' bit family (``ggml-ext bits``: their mean A, the worst A_max, A_lim).

The paper's configs are ``q2_k:2`` (OOC(2,2,0.1,s) vs GPTQ(2)) and ``q4_0:8`` (OOC(8,4,0.1,s) vs GPTQ(4));
``q4_0:4`` is OOC(4,4,0.1,s). A matrix the type policy keeps wider than TYPE (q2_k: Q4_0 where the rows are
not a multiple of 256) has its clear columns at max(H, its type's bits) (methods/ooc.py ``clear_bits``). A
type GPTQ has no grid for is reported as skipped, not run.

On the device machine (no assets): ``--hf smollm2=/tmp/assets/smollm2-hf --train WIKI_TRAIN --test
WIKI_TEST --device cuda`` (calibration layers, GPTQ and OOC on the GPU; perplexity by our CPU
llama-perplexity, which must be a build with the OOC loader: patch 0303 of this branch).

Perplexity by our ``llama-perplexity`` on wiki-test, ctx 512, ``--chunks`` windows; time: wall seconds of
each conversion. Prints a markdown table; ``--json`` writes the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ggml_ext import assets, bits, methods, tools
from ggml_ext.converters import convert
from ggml_ext.gguf import read_gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("bench", "convert")))
from bench_convert import cpu_name  # noqa: E402

HF = {"smollm2": "smollm2-hf", "gemma3": "gemma3-hf"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2")
    ap.add_argument("--configs", default="q4_0:8,q2_k:2", help="TYPE:H pairs (l = TYPE's bits, h = H)")
    ap.add_argument("--p", type=float, default=0.1, help="fraction of the clear group's columns at h bits")
    ap.add_argument("--s", default="0.1,0.2,0.5,1", help="scan fractions to measure")
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--calib-seq-len", type=int, default=512)
    ap.add_argument("--validation-samples", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where the layers, GPTQ and OOC run (cpu, cuda)")
    ap.add_argument("--flow", default="both", choices=("both", "ooc"),
                    help="both: OOC's double workflow (the default); ooc: always write the GPTQ(h,l,p,s) flow")
    ap.add_argument("--no-gptq", action="store_true",
                    help="leave out the GPTQ(l) rows (a sweep split over several device calls: one of them has them)")
    ap.add_argument("--hf", action="append", default=[], metavar="MODEL=DIR")
    ap.add_argument("--train", default=None, help="calibration text (default: the wiki-train asset)")
    ap.add_argument("--test", default=None, help="perplexity text (default: the wiki-test asset)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    test = Path(a.test) if a.test else assets.path("wiki-test")
    train = Path(a.train) if a.train else assets.path("wiki-train")
    folders = dict(h.split("=", 1) for h in a.hf)
    scans = [float(x) for x in a.s.split(",")]
    ooc_factory = methods.get("ooc")
    rows = []
    print(f"# {cpu_name()}, {os.cpu_count()} cores; device {a.device}; calibration {a.calib_samples} x "
          f"{a.calib_seq_len} tokens of {train.name} (+ {a.validation_samples} validation windows for ooc); "
          f"perplexity {test.name} ctx 512, {a.chunks} chunks", file=sys.stderr)
    calib = dict(calib=train, calib_samples=a.calib_samples, calib_seq_len=a.calib_seq_len, calib_device=a.device)
    with tempfile.TemporaryDirectory(prefix="bench-ooc-") as tmp:
        d = Path(tmp)
        for model in a.models.split(","):
            hf = Path(folders[model]) if model in folders else assets.path(HF[model])
            for cfg in a.configs.split(","):
                t, _, h = cfg.partition(":")
                if not ooc_factory.supports(t.upper()):
                    print(f"# {model} {t}: skipped, GPTQ has no grid for {t.upper()} here (methods/grids.py)",
                          file=sys.stderr)
                    rows.append({"model": model, "type": t, "method": "skipped", "reason": "no GPTQ grid"})
                    continue
                runs = [] if a.no_gptq else [("gptq", "gptq", {"device": a.device})]
                lbits = bits.QUANT_BITS.get(t.upper(), t)
                runs += [(f"ooc({h},{lbits},{a.p:g},{s:g})", "ooc",
                          {"device": a.device, "h": int(h), "p": a.p, "s": s, "flow": a.flow,
                           "validation_samples": a.validation_samples}) for s in scans]
                for label, method, opts in runs:
                    out = d / f"{model}-{t}-{method}.gguf"
                    seen = {}
                    if method == "ooc":   # keep the instance: its validation losses and winner
                        class Keep(ooc_factory):
                            def __init__(self, **kw):
                                super().__init__(**kw)
                                seen["m"] = self
                        methods._registry["ooc-bench"] = (Keep, "")
                    t0 = time.time()
                    try:
                        convert(hf, out, t, method="ooc-bench" if method == "ooc" else method, threads=a.threads,
                                method_options=opts, force=True, **calib)
                    finally:
                        methods._registry.pop("ooc-bench", None)
                    secs = time.time() - t0
                    r = tools.perplexity(out, test, n_ctx=512, chunks=a.chunks, threads=a.threads)
                    fb = bits.file_bits(read_gguf(out))
                    layer = [x for x in fb.tensors if x.quantized and x.name.startswith("blk.")]
                    n = sum(x.n_weights for x in layer)
                    m = seen.get("m")
                    row = {"model": model, "type": t, "method": label, "ppl": r.ppl, "stderr": r.stderr,
                           "seconds": secs, "a_max": max(x.a_max for x in layer),
                           "a_lim": sum(x.a_lim * x.n_weights for x in layer) / n,
                           "a_layers": sum(x.a_max * x.n_weights for x in layer) / n,
                           "winner": m.winner if m else None, "validation": m.losses if m else None}
                    rows.append(row)
                    print(f"# {model} {t} {label}: {r} ({secs:.0f} s)"
                          + (f" winner {m.winner}, validation {m.losses}" if m else ""), file=sys.stderr)
                    out.unlink()
    print("| model | type | method | PPL | flow written (validation loss gptq / ooc) | "
          "layer matrices: A / A_max / A_lim | time |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["method"] == "skipped":
            print(f"| {r['model']} | {r['type']} | skipped: {r['reason']} | | | | |")
            continue
        v = r["validation"]
        flow = "" if not v else f"{r['winner']} ({v.get('gptq', float('nan')):.4f} / {v.get('ooc', float('nan')):.4f})"
        print(f"| {r['model']} | {r['type']} | {r['method']} | {r['ppl']:.3f} +/- {r['stderr']:.3f} | {flow} | "
              f"{r['a_layers']:.4f} / {r['a_max']:.4f} / {r['a_lim']:.4f} | {r['seconds']:.0f} s |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
