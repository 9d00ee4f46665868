#!/usr/bin/env python3
"""Any-precision (convert --method anyprec): perplexity at every precision of one file, against
independently quantized k-means files and stock llama-quantize types; quantization time; file sizes.

  scripts/bench_anyprec.py [--models smollm2,gemma3] [--bits 3-8] [--independent 4,5]
                           [--stock q3_k,q4_k,q5_k,q6_k,q8_0] [--calib-samples 16] [--calib-seq-len 256]
                           [--chunks 20] [--threads N] [--via op|extract] [--keep DIR] [--json OUT]
                           [--refine R] [--baseline-refine 0]

Per model (the HF folders ``smollm2-hf``, ``gemma3-hf`` of the assets):

* ``anyprec S-P``: ``ggml-ext convert --method anyprec --bits S-P --calib wiki-train`` (Fisher of the
  calibration engine, ``calib-samples`` x ``calib-seq-len`` tokens, cached), then for every b in S..P
  the perplexity of that one file run by our llama-perplexity with ``--apq-bits b`` (the APQ op reading
  the first b planes; ``--via extract``: of ``ggml-ext anyprec extract --bits b`` instead, precision b as
  F16 matrices, which stock llama.cpp runs too);
* ``k-means b`` (``--independent``): the same method with ``--bits b-b``: the b-bit Fisher-weighted
  k-means optimum of each row directly (no upscaling: the paper's "independently quantized" SqueezeLLM
  baseline), extracted at b;
* ``--baseline-refine R0`` (e.g. 0, the paper's greedy upscaling): a second one-file model with the
  refinement depth R0 instead of ``--refine``, scored at every precision in the same run;
* stock: our ``llama-quantize`` from the f16 file to each ``--stock`` type (no imatrix).

Matrices outside the decoder layers are Q8_0 in the anyprec and k-means files (the method's default
type) and whatever llama-quantize picks in the stock files. Perplexity: our ``llama-perplexity`` on
wiki-test, ctx 512, ``--chunks`` windows. Quantization time: wall seconds of the seed + upscaling of all
decoder-layer matrices (:func:`ggml_ext.anyprec.quantize`, ``--threads`` threads), Fisher excluded
(reported apart). Sizes: the bitplane file and the bytes each precision reads vs one k-means file per
precision (planes + that precision's tables). Prints markdown; ``--json`` writes the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ggml_ext import anyprec as ap
from ggml_ext import assets, tools
from ggml_ext.anyprec import extract as X
from ggml_ext.calibrate import stats
from ggml_ext.converters import convert
from ggml_ext.converters.pipeline import _FisherSource, plan
from ggml_ext.methods.anyprec import seed_and_upscale

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import cpu_name  # noqa: E402

HF = {"smollm2": "smollm2-hf", "gemma3": "gemma3-hf"}


def quantization_seconds(hf: Path, st, seed: int, parent: int, threads: int | None,
                         refine: int = ap.REFINE) -> tuple[float, int]:
    """Wall seconds of seed + upscaling over every decoder-layer matrix (weights and Fisher already loaded)."""
    pl = plan(hf, "q8_0", has_imatrix=True)
    fisher = _FisherSource(pl, st)
    total, n = 0.0, 0
    for p in pl.tensors:
        if not p.gguf_name.startswith("blk.") or len(p.shape) != 2 or p.type_name in ("F32", "F16", "BF16"):
            continue
        W = np.ascontiguousarray(pl.checkpoint.load(p.hf_name), dtype=np.float32)
        F = fisher(p)
        t0 = time.perf_counter()
        seed_and_upscale(W, F, seed, parent, threads, p.gguf_name, refine)
        total += time.perf_counter() - t0
        n += W.size
    pl.checkpoint.close()
    return total, n


def ppl(path: Path, test: Path, a, apq_bits: int | None = None) -> tuple[float, float]:
    r = tools.perplexity(path, test, n_ctx=512, chunks=a.chunks, threads=a.threads, apq_bits=apq_bits)
    return r.ppl, r.stderr


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="smollm2,gemma3")
    p.add_argument("--bits", default="3-8")
    p.add_argument("--independent", default="4,5", help="bit-widths of the independent k-means files ('' for none)")
    p.add_argument("--stock", default="q3_k,q4_k,q5_k,q6_k,q8_0")
    p.add_argument("--calib-samples", type=int, default=16)
    p.add_argument("--calib-seq-len", type=int, default=256)
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--via", choices=("op", "extract"), default="op",
                   help="run each precision from the one file (op: --apq-bits) or from its extraction")
    p.add_argument("--parent-file", type=Path, default=None, metavar="FILE",
                   help="measure this bitplane file of the (single) model instead of converting one (no timing)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="keep each model's bitplane file in DIR (for scripts/bench_anyprec_speed.py)")
    p.add_argument("--json", default=None)
    p.add_argument("--refine", type=int, default=ap.REFINE,
                   help=f"precisions above the seed refined jointly with it (default {ap.REFINE}; 0: the paper's greedy)")
    p.add_argument("--baseline-refine", type=int, default=None, metavar="R0",
                   help="also score a one-file model with refinement depth R0 (0: the paper's greedy) in the same run")
    p.add_argument("--hf", action="append", default=[], metavar="MODEL=DIR",
                   help="the model's HF folder (default: the asset); the device has no asset cache")
    p.add_argument("--train", type=Path, default=None, help="calibration text (default: the wiki-train asset)")
    p.add_argument("--test", type=Path, default=None, help="perplexity text (default: the wiki-test asset)")
    p.add_argument("--device", default="cpu", help="where the Fisher pass runs (cpu, cuda)")
    a = p.parse_args()
    seed, parent = ap.parse_bits(a.bits)
    test = a.test or assets.path("wiki-test")
    train = a.train or assets.path("wiki-train")
    hf_dirs = dict(x.split("=", 1) for x in a.hf)
    rows: list[dict] = []
    print(f"# {cpu_name()}, {os.cpu_count()} cores; Fisher on {a.calib_samples} x {a.calib_seq_len} tokens of "
          f"wiki-train; perplexity wiki-test ctx 512, {a.chunks} chunks", file=sys.stderr, flush=True)

    def add(**row):
        rows.append(row)
        print(f"# {row}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-anyprec-") as tmp:
        d = Path(tmp)
        for model in a.models.split(","):
            hf = Path(hf_dirs[model]) if model in hf_dirs else assets.path(HF[model])
            f16 = d / f"{model}-f16.gguf"
            convert(hf, f16, "f16")
            add(model=model, file="f16", bits=16, ppl=ppl(f16, test, a), size=f16.stat().st_size)
            opts = dict(method="anyprec", calib=str(train), calib_samples=a.calib_samples,
                        calib_seq_len=a.calib_seq_len, calib_progress=False, threads=a.threads,
                        calib_device=a.device)
            if a.parent_file:
                parent_file = a.parent_file
            else:
                t0 = time.time()
                st = stats.collect(hf, text=str(train), what=("fisher",), n_samples=a.calib_samples,
                                   seq_len=a.calib_seq_len, progress=False, device=a.device)
                t_fisher = time.time() - t0
                secs, n_weights = quantization_seconds(hf, st, seed, parent, a.threads, a.refine)
                add(model=model, file="timing", fisher_seconds_or_cached=t_fisher, seed_upscale_seconds=secs,
                    weights=n_weights, threads=a.threads or os.cpu_count(), refine=a.refine)
                parent_file = d / f"{model}-anyprec.gguf"
                convert(hf, parent_file, method_options={"bits": a.bits, "refine": a.refine}, **opts)
            if a.baseline_refine is not None:
                base_file = d / f"{model}-anyprec-r{a.baseline_refine}.gguf"
                convert(hf, base_file, method_options={"bits": a.bits, "refine": a.baseline_refine}, **opts)
                for b in range(seed, parent + 1):
                    add(model=model, file=f"anyprec {a.bits} refine {a.baseline_refine}", bits=b,
                        ppl=ppl(base_file, test, a, apq_bits=b), size=base_file.stat().st_size)
                base_file.unlink()
            info = X.open_file(parent_file)
            g = info.gguf
            runnable = all(g.tensor(m).type_name != "I8" for m in info.matrices)
            for b in range(seed, parent + 1):
                read = sum(ap.planes_bytes(n, k, b) + ap.tables_bytes(n, b)
                           for k, n in (info.dims(m) for m in info.matrices))
                if a.via == "op" and runnable:
                    r = ppl(parent_file, test, a, apq_bits=b)
                else:
                    e = X.extract(parent_file, b, d / f"{model}-ap{b}.gguf", force=True)
                    r = ppl(e, test, a)
                    e.unlink()
                add(model=model, file=f"anyprec {a.bits} refine {a.refine}" + ("" if a.via == "op" and runnable else " (extracted)"),
                    bits=b, ppl=r, size=parent_file.stat().st_size, matrix_bytes_read=read)
            for b in [int(x) for x in a.independent.split(",") if x]:
                f = d / f"{model}-km{b}.gguf"
                t0 = time.time()
                convert(hf, f, method_options={"bits": f"{b}-{b}", "refine": 0}, **opts)
                e = X.extract(f, b, d / f"{model}-km{b}-x.gguf", force=True)
                add(model=model, file="k-means", bits=b, ppl=ppl(e, test, a), size=f.stat().st_size,
                    convert_seconds=time.time() - t0)
                e.unlink()
                f.unlink()
            for t in [x for x in a.stock.split(",") if x]:
                out = d / f"{model}-{t}.gguf"
                subprocess.run(tools.command("llama-quantize", f16, out, t.upper()), env=tools.tool_env(),
                               check=True, capture_output=True)
                add(model=model, file=f"stock {t.upper()}", bits=None, ppl=ppl(out, test, a), size=out.stat().st_size)
                out.unlink()
            if a.parent_file:
                pass
            elif a.keep:
                a.keep.mkdir(parents=True, exist_ok=True)
                shutil.move(str(parent_file), a.keep / f"{model}-anyprec-{a.bits}.gguf")
            else:
                parent_file.unlink()
            f16.unlink()
    print("| model | file | bits | PPL | file bytes | matrix bytes read |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["file"] == "timing":
            continue
        read = r.get("matrix_bytes_read", "")
        print(f"| {r['model']} | {r['file']} | {r['bits'] or ''} | {r['ppl'][0]:.3f} +/- {r['ppl'][1]:.3f} | "
              f"{r['size']} | {read} |")
    for r in rows:
        if r["file"] == "timing":
            print(f"\n{r['model']}: seed + upscaling {r['seed_upscale_seconds']:.1f} s for {r['weights']} weights "
                  f"({r['threads']} threads); Fisher {r['fisher_seconds_or_cached']:.1f} s (0 when cached)")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
