#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Any-precision": perplexity of one file at every precision against independent k-means and stock mixes.
"""Any-precision (convert --method anyprec): perplexity at every precision of one file, against
independently quantized k-means files and stock llama-quantize types; quantization time; file sizes.

  bench/anyprec/bench_anyprec.py [--models smollm2,gemma3] [--bits 3-8] [--independent 4,5]
                           [--stock q3_k,q4_k,q5_k,q6_k,q8_0] [--calib-samples 16] [--calib-seq-len 256]
                           [--chunks 20] [--threads N] [--via op|extract] [--keep DIR] [--json OUT]
                           [--refine R] [--starts T] [--gain G] [--baseline-refine 0] [--upstream DIR] [--imatrix-chunks 16]
                           [--no-timing]

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
* stock: ``llama-quantize`` from the f16 file to each ``--stock`` type, without an imatrix and (with
  ``--imatrix-chunks N`` > 0, default 16) with an imatrix of ``llama-imatrix`` on N x 512 tokens of the
  calibration text (the strongest stock path). With the **pristine upstream build** (``make upstream``;
  ``--upstream DIR``, default its cache folder when built) these rows are made and scored by upstream's own
  llama-quantize / llama-imatrix / llama-perplexity, and the f16 file is scored by both builds (they must
  agree); without it by ours (upstream's unmodified code paths for stock types; the rows then say "ours").

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("bench", "convert")))
from bench_convert import cpu_name  # noqa: E402

HF = {"smollm2": "smollm2-hf", "gemma3": "gemma3-hf"}


def quantization_seconds(hf: Path, st, seed: int, parent: int, threads: int | None,
                         refine: int = ap.REFINE, starts: int = ap.STARTS, gain: float = ap.GAIN) -> tuple[float, int]:
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
        seed_and_upscale(W, F, seed, parent, threads, p.gguf_name, refine, starts, gain)
        total += time.perf_counter() - t0
        n += W.size
    pl.checkpoint.close()
    return total, n


def ppl(path: Path, test: Path, a, apq_bits: int | None = None, binary: Path | None = None) -> tuple[float, float]:
    """Perplexity by our llama-perplexity, or by the pristine build's when ``binary`` is its bin folder."""
    if binary:
        r = tools.perplexity(path, test, n_ctx=512, chunks=a.chunks, threads=a.threads,
                             binary=binary / "llama-perplexity", env={"LD_LIBRARY_PATH": str(binary)})
    else:
        r = tools.perplexity(path, test, n_ctx=512, chunks=a.chunks, threads=a.threads, apq_bits=apq_bits)
    return r.ppl, r.stderr


def stock_build(arg: Path | None) -> Path | None:
    """The pristine upstream build's bin folder (``make upstream``) for the stock rows, None for ours."""
    if arg is not None and str(arg) == "none":
        return None
    if arg is None:
        import fetch_llama_cpp
        arg = fetch_llama_cpp.cache_root() / f"upstream-{fetch_llama_cpp.COMMIT}" / "bin"
        if not (arg / "llama-perplexity").is_file():
            print(f"# no pristine upstream build at {arg} (make upstream): stock rows by our build",
                  file=sys.stderr, flush=True)
            return None
    for t in ("llama-quantize", "llama-imatrix", "llama-perplexity"):
        if not (arg / t).is_file():
            raise SystemExit(f"--upstream {arg}: no {t} there")
    return arg


def run_stock(up: Path | None, tool: str, *args) -> None:
    """A stock tool (llama-quantize, llama-imatrix) of the pristine build ``up``, or of ours."""
    cmd = [str(up / tool), *(str(x) for x in args)] if up else tools.command(tool, *args)
    env = {**os.environ, "LD_LIBRARY_PATH": str(up)} if up else tools.tool_env()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


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
                   help="keep each model's bitplane file in DIR (for a later run's --parent-file)")
    p.add_argument("--json", default=None)
    p.add_argument("--refine", type=int, default=ap.REFINE,
                   help=f"precisions above the seed refined jointly with it (default {ap.REFINE}; 0: the paper's greedy)")
    p.add_argument("--starts", type=int, default=ap.STARTS,
                   help=f"extra starts of the refinement (default {ap.STARTS})")
    p.add_argument("--gain", type=float, default=ap.GAIN,
                   help=f"weight ratio of successive precisions in the joint objective (default {ap.GAIN})")
    p.add_argument("--baseline-refine", type=int, default=None, metavar="R0",
                   help="also score a one-file model with refinement depth R0 (0: the paper's greedy) in the same run")
    p.add_argument("--hf", action="append", default=[], metavar="MODEL=DIR",
                   help="the model's HF folder (default: the asset); the device has no asset cache")
    p.add_argument("--train", type=Path, default=None, help="calibration text (default: the wiki-train asset)")
    p.add_argument("--test", type=Path, default=None, help="perplexity text (default: the wiki-test asset)")
    p.add_argument("--device", default="cpu", help="where the Fisher pass runs (cpu, cuda)")
    p.add_argument("--upstream", type=Path, default=None, metavar="DIR",
                   help="the pristine upstream build's bin folder for the stock rows (default: make upstream's, "
                        "when built; 'none': our build)")
    p.add_argument("--imatrix-chunks", type=int, default=16,
                   help="stock rows also with an imatrix of llama-imatrix on N x 512 calibration tokens (0: none)")
    p.add_argument("--score-bits", default=None, metavar="LIST",
                   help="precisions of the one-file models to score (default all of --bits; '' none: no one-file "
                        "model, e.g. a second process doing only the k-means and stock rows)")
    p.add_argument("--no-f16", action="store_true", help="do not score the f16 file (a second process)")
    p.add_argument("--no-timing", action="store_true",
                   help="skip the separate timing pass of seed + upscaling (it quantizes every matrix once more)")
    a = p.parse_args()
    seed, parent = ap.parse_bits(a.bits)
    score = list(range(seed, parent + 1)) if a.score_bits is None else [int(x) for x in a.score_bits.split(",") if x]
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
            if not a.no_f16:
                add(model=model, file="f16", bits=16, ppl=ppl(f16, test, a), size=f16.stat().st_size)
            opts = dict(method="anyprec", calib=str(train), calib_samples=a.calib_samples,
                        calib_seq_len=a.calib_seq_len, calib_progress=False, threads=a.threads,
                        calib_device=a.device)
            if a.parent_file or not score:
                parent_file = a.parent_file
            else:
                t0 = time.time()
                st = stats.collect(hf, text=str(train), what=("fisher",), n_samples=a.calib_samples,
                                   seq_len=a.calib_seq_len, progress=False, device=a.device)
                t_fisher = time.time() - t0
                if not a.no_timing:
                    secs, n_weights = quantization_seconds(hf, st, seed, parent, a.threads, a.refine, a.starts,
                                                           a.gain)
                    add(model=model, file="timing", fisher_seconds_or_cached=t_fisher, seed_upscale_seconds=secs,
                        weights=n_weights, threads=a.threads or os.cpu_count(), refine=a.refine, starts=a.starts,
                        gain=a.gain)
                parent_file = d / f"{model}-anyprec.gguf"
                convert(hf, parent_file, method_options={"bits": a.bits, "refine": a.refine, "starts": a.starts,
                                                         "gain": a.gain}, **opts)
            if a.baseline_refine is not None and score:
                base_file = d / f"{model}-anyprec-r{a.baseline_refine}.gguf"
                convert(hf, base_file, method_options={"bits": a.bits, "refine": a.baseline_refine, "starts": 0,
                                                       "gain": 1.0}, **opts)
                for b in score:
                    add(model=model, file=f"anyprec {a.bits} refine {a.baseline_refine}", bits=b,
                        ppl=ppl(base_file, test, a, apq_bits=b), size=base_file.stat().st_size)
                base_file.unlink()
            info = X.open_file(parent_file) if parent_file else None
            runnable = info and all(info.gguf.tensor(m).type_name != "I8" for m in info.matrices)
            for b in (score if info else []):
                read = sum(ap.planes_bytes(n, k, b) + ap.tables_bytes(n, b)
                           for k, n in (info.dims(m) for m in info.matrices))
                if a.via == "op" and runnable:
                    r = ppl(parent_file, test, a, apq_bits=b)
                else:
                    e = X.extract(parent_file, b, d / f"{model}-ap{b}.gguf", force=True)
                    r = ppl(e, test, a)
                    e.unlink()
                add(model=model, file=f"anyprec {a.bits} refine {a.refine} starts {a.starts} gain {a.gain:g}" + ("" if a.via == "op" and runnable else " (extracted)"),
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
            stock = [x for x in a.stock.split(",") if x]
            # decided here, not at the start: `make upstream` may finish while the rows above run
            up = stock_build(a.upstream) if stock else None
            if up:
                add(model=model, file="f16 (upstream)", bits=16, ppl=ppl(f16, test, a, binary=up),
                    size=f16.stat().st_size)
            im = None
            if stock and a.imatrix_chunks > 0:
                im = d / f"{model}.imatrix"
                t0 = time.time()
                run_stock(up, "llama-imatrix", "-m", f16, "-f", train, "-c", "512", "--chunks", str(a.imatrix_chunks),
                          "-o", im, *(["-t", str(a.threads)] if a.threads else []))
                print(f"# {model}: imatrix ({a.imatrix_chunks} x 512 tokens) in {time.time() - t0:.0f} s",
                      file=sys.stderr, flush=True)
            who = "upstream" if up else "ours"
            for t in stock:
                for imx in ([None, im] if im else [None]):
                    out = d / f"{model}-{t}.gguf"
                    run_stock(up, "llama-quantize", *(["--imatrix", imx] if imx else []), f16, out, t.upper())
                    add(model=model, file=f"stock {t.upper()} ({who}" + (", imatrix)" if imx else ")"), bits=None,
                        ppl=ppl(out, test, a, binary=up), size=out.stat().st_size)
                    out.unlink()
            if a.parent_file or not parent_file:
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
