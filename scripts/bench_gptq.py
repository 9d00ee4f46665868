#!/usr/bin/env python3
"""Perplexity and quantization time of GPTQ against round-to-nearest, with and without an imatrix.

  scripts/bench_gptq.py [--models smollm2,gemma3] [--types q4_0,iq4_nl] [--calib-samples 16]
                        [--calib-seq-len 512] [--chunks 20] [--threads N] [--json OUT]

For each model (SmolLM2-135M-Instruct's dequantized HF folder ``smollm2-hf``; Gemma-3-270M's
``gemma3-hf``) and type, all by ``ggml-ext convert`` of the HF folder:

* ``rtn``: ``--type T`` (the type's own quantizer: ggml's; ggml-ext's exact search for IQ4_NL);
* ``rtn+imatrix``: ``--type T --imatrix FILE``, FILE made by our ``llama-imatrix`` (``ggml-ext
  imatrix``) from the f16 file on wiki-train, ``calib-samples`` chunks of ``calib-seq-len`` tokens
  -- the same quantizer bytes as ``llama-quantize --imatrix`` (stock's strongest path);
* ``gptq``: ``--method gptq --calib wiki-train --calib-samples N --calib-seq-len L``: the same
  amount of the same text (windows at evenly spaced offsets rather than llama-imatrix's first
  chunks); ``--gptq LABEL:KEY=VALUE,...`` (repeatable) measures GPTQ variants instead, e.g.
  ``v-attn:scale_rule=static,percdamp=0.1,v_hessian=attention`` (docs/GPTQ.md).

On the device machine (no assets): ``--hf smollm2=/tmp/assets/smollm2-hf --train WIKI_TRAIN --test
WIKI_TEST --device cuda`` (GPTQ and its calibration layers on the GPU; perplexity on the CPU build).

Perplexity by our ``llama-perplexity`` on wiki-test, ctx 512, ``--chunks`` windows; time: wall
seconds of the conversion (the imatrix's own run reported apart). Files go to a temp folder.
Prints a markdown table; ``--json`` writes the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ggml_ext import assets, tools
from ggml_ext.calibrate import imatrix
from ggml_ext.converters import convert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import cpu_name  # noqa: E402

HF = {"smollm2": "smollm2-hf", "gemma3": "gemma3-hf"}


def _variant(spec: str) -> tuple[str, dict]:
    """'LABEL:KEY=VALUE,...' -> (LABEL, {KEY: VALUE}), numbers as floats."""
    label, _, rest = spec.partition(":")
    opts: dict = {}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        try:
            opts[k] = float(v)
        except ValueError:
            opts[k] = v
    return label or "gptq", opts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--types", default="q4_0,iq4_nl")
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--calib-seq-len", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--hf", action="append", default=[], metavar="MODEL=DIR",
                    help="a model's Hugging Face folder instead of the asset (the device machine's unpacked folders)")
    ap.add_argument("--train", default=None, help="calibration text (default: the wiki-train asset)")
    ap.add_argument("--test", default=None, help="perplexity text (default: the wiki-test asset)")
    ap.add_argument("--device", default="cpu", help="where GPTQ and its calibration layers run (cpu, cuda)")
    ap.add_argument("--gptq", action="append", default=[], metavar="LABEL:KEY=VALUE,...",
                    help="a GPTQ variant and its method options, e.g. 'v-attn:scale_rule=static,percdamp=0.1,"
                         "v_hessian=attention' (repeatable; default one plain 'gptq')")
    a = ap.parse_args()
    test = Path(a.test) if a.test else assets.path("wiki-test")
    train = Path(a.train) if a.train else assets.path("wiki-train")
    folders = dict(h.split("=", 1) for h in a.hf)
    variants = [_variant(v) for v in a.gptq] or [("gptq", {})]
    rows = []
    print(f"# {cpu_name()}, {os.cpu_count()} cores; calibration {a.calib_samples} x {a.calib_seq_len} tokens "
          f"of wiki-train; perplexity wiki-test ctx 512, {a.chunks} chunks", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-gptq-") as tmp:
        d = Path(tmp)
        for model in a.models.split(","):
            hf = Path(folders[model]) if model in folders else assets.path(HF[model])
            f16 = d / f"{model}-f16.gguf"
            convert(hf, f16, "f16")
            t0 = time.time()
            im = imatrix.make(f16, d / f"{model}.imatrix", train, chunks=a.calib_samples, n_ctx=a.calib_seq_len,
                              threads=a.threads)
            t_im = time.time() - t0
            base = tools.perplexity(f16, test, n_ctx=512, chunks=a.chunks, threads=a.threads)
            rows.append({"model": model, "type": "f16", "method": "-", "ppl": base.ppl, "stderr": base.stderr,
                         "seconds": None})
            print(f"# {model} f16: {base}", file=sys.stderr)
            for t in a.types.split(","):
                gptq = [(label, {"method": "gptq", "calib": train, "calib_samples": a.calib_samples,
                                 "calib_seq_len": a.calib_seq_len, "calib_device": a.device,
                                 "method_options": {"device": a.device, **opts}}) for label, opts in variants]
                for method, kw in [("rtn", {}), ("rtn+imatrix", {"imatrix": im}), *gptq]:
                    out = d / f"{model}-{t}-{method}.gguf"
                    t0 = time.time()
                    convert(hf, out, t, threads=a.threads, **kw)
                    secs = time.time() - t0
                    r = tools.perplexity(out, test, n_ctx=512, chunks=a.chunks, threads=a.threads)
                    row = {"model": model, "type": t, "method": method, "ppl": r.ppl, "stderr": r.stderr,
                           "seconds": secs, "imatrix_seconds": t_im if method == "rtn+imatrix" else None}
                    rows.append(row)
                    print(f"# {model} {t} {method}: {r} ({secs:.0f} s)", file=sys.stderr)
                    out.unlink()
    print("| model | type | method | PPL | quantization time |")
    print("|---|---|---|---|---|")
    for r in rows:
        secs = "" if r["seconds"] is None else f"{r['seconds']:.0f} s"
        if r.get("imatrix_seconds"):
            secs += f" (+ {r['imatrix_seconds']:.0f} s llama-imatrix)"
        print(f"| {r['model']} | {r['type']} | {r['method']} | {r['ppl']:.3f} +/- {r['stderr']:.3f} | {secs} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
