#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "IQ4_NL": perplexity of our IQ4_NL quantizer against ggml's, Q4_0 and Q4_1.
"""Perplexity at about 4.5 bits per weight: Q4_0, Q4_1, IQ4_NL by ggml's quantizer and
IQ4_NL by ggml-ext's, each without and with an importance matrix, beside the f16 file.

  bench/interleaved4/bench_iq4_nl_quality.py [--models smollm2,gemma3] [--chunks 20] [--imatrix-chunks 32]
                                  [--weightings default] [--threads N] [--json OUT]

For each model:
* f16: SmolLM2 from our converter (the dequantized HF folder); Gemma-3-270M (only a
  Q4_K_M GGUF is shipped) dequantized to F16 by our llama-quantize --allow-requantize, so
  its "f16" is the Q4_K_M model's quality;
* an imatrix of the f16 file on wiki-train (`ggml-ext imatrix`, --imatrix-chunks x 512 tokens);
* Q4_0, Q4_1, IQ4_NL: our llama-quantize from the f16 file (ggml's quantizers, llama.cpp's
  mix for each file type), with and without --imatrix;
* IQ4_NL ours: the IQ4_NL file above with every IQ4_NL tensor re-quantized from the f16
  file's values by ggml-ext's quantizer (same imatrix), so the tensor types, sizes and the
  other tensors' bytes are identical and only the IQ4_NL quantizer differs;
* perplexity of each by our llama-perplexity on wiki-test, ctx 512, --chunks windows.

Files go to <cache>/models/iq4nl-bench/, keyed by recipe (tool, arguments, imatrix, build and
code digest, sources' sha256: scripts/default_models.py `cached`), each with a sidecar JSON
saying what it is; a file is reused only for the same recipe. Prints a markdown
table (PPL +/- stderr, ratio to f16, bits per weight of all tensors and of the layers' matrices).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("scripts")))
from default_models import cached, default_model, source, tool  # noqa: E402

from ggml_ext import _atomic, assets, cache, quants, tools  # noqa: E402
from ggml_ext.calibrate import imatrix  # noqa: E402
from ggml_ext.gguf import read_gguf  # noqa: E402


def work_dir() -> Path:
    d = cache.cache_root() / "models" / "iq4nl-bench"
    d.mkdir(parents=True, exist_ok=True)
    return d


def run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, env=tools.tool_env(), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def f16_file(model: str) -> Path:
    if model == "smollm2":
        return default_model("f16")
    src = assets.path("gemma3-270m-gguf")
    recipe = {"model": "gemma3-270m", "type": "F16", **tool("llama-quantize"), "args": ["--allow-requantize", "F16"],
              "imatrix": None, "source": source(src)}

    def make(out: Path) -> None:
        with _atomic.output_path(out) as tmp:
            run(tools.command("llama-quantize", "--allow-requantize", src, tmp, "F16"))

    return cached("gemma3-270m-F16", f"our llama-quantize --allow-requantize F16 of {src.name} (dequantized Q4_K_M)",
                  recipe, make, work_dir())


def imatrix_file(model: str, f16: Path, chunks: int, threads: int | None) -> Path:
    """`ggml-ext imatrix` of the f16 file on wiki-train, chunks x 512 tokens."""
    text = assets.path("wiki-train")
    recipe = {"model": model, "type": "imatrix", **tool("llama-imatrix"), "args": ["--chunks", chunks, "-c", 512],
              "source": source(f16), "text": source(text)}

    def make(out: Path) -> None:
        t0 = time.time()
        imatrix.make(f16, out, text, chunks=chunks, threads=threads, force=True)
        print(f"# {model}: imatrix in {time.time() - t0:.0f} s", file=sys.stderr)

    return cached(f"{model}-wiki-train-{chunks}", f"ggml-ext imatrix --chunks {chunks} of {f16.name} on wiki-train",
                  recipe, make, work_dir(), suffix=".imatrix")


def quantize_ggml(model: str, f16: Path, ftype: str, im: Path | None, threads: int | None) -> Path:
    """Our llama-quantize (ggml's quantizers, llama.cpp's mix) of the f16 file, with --imatrix im if given.
    The thread count is not in the recipe: rows are quantized independently, so the bytes are the same."""
    recipe = {"model": model, "type": ftype, **tool("llama-quantize"), "args": [ftype],
              "imatrix": source(im) if im else None, "source": source(f16)}

    def make(out: Path) -> None:
        with _atomic.output_path(out) as tmp:
            args = (["--imatrix", str(im)] if im else []) + [str(f16), str(tmp), ftype]
            run(tools.command("llama-quantize", *args, *([str(threads)] if threads else [])))

    stem = f"{model}-{ftype}" + ("-imatrix" if im else "")
    return cached(stem, f"our llama-quantize {ftype} of {f16.name}" + (f" with --imatrix {im.name}" if im else ""),
                  recipe, make, work_dir())


def requantize_iq4_nl(model: str, f16: Path, template: Path, im: Path | None, weighting: str,
                      threads: int | None) -> Path:
    """template (an IQ4_NL file of llama-quantize) with its IQ4_NL tensors re-made by ggml-ext from f16."""
    # the tool: this script's _requantize, through ggml_ext.quants
    recipe = {"model": model, "type": "IQ4_NL", **tool("ggml_ext.quants", [Path(__file__).resolve()]),
              "args": ["--weighting", weighting], "imatrix": source(im) if im else None, "source": source(f16),
              "template": source(template)}
    stem = f"{model}-IQ4_NL-ggml-ext-{weighting}" + ("-imatrix" if im else "")
    what = (f"{template.name} with every IQ4_NL tensor re-quantized from {f16.name} by ggml-ext's quantizer "
            f"(weighting {weighting}" + (f", imatrix {im.name})" if im else ")"))
    return cached(stem, what, recipe, lambda out: _requantize(f16, template, out, im, weighting, threads), work_dir())


def _requantize(f16: Path, template: Path, out: Path, im: Path | None, weighting: str, threads: int | None) -> None:
    src, tpl = read_gguf(f16), read_gguf(template)
    imx = imatrix.load(im) if im else None
    with _atomic.output_path(out) as tmp, open(f16, "rb") as fs, open(tmp, "r+b") as fo:
        fo.write(template.read_bytes())
        for t in tpl.tensors:
            if t.type_name != "IQ4_NL":
                continue
            s = src.tensor(t.name)
            dtype = {"F16": np.float16, "F32": np.float32}[s.type_name]
            fs.seek(s.file_offset)
            x = np.frombuffer(fs.read(s.nbytes), dtype=dtype)
            rows = x.astype(np.float32).reshape(-1, s.shape[0])
            w = imx.for_tensor(t.name, s.shape[0]) if imx else None
            q = quants.quantize(rows, "IQ4_NL", imatrix=w, threads=threads, weighting=weighting)
            assert q.nbytes == t.nbytes, (t.name, q.nbytes, t.nbytes)
            fo.seek(t.file_offset)
            fo.write(q.tobytes())


def blk_bpw(g) -> float:
    """Bits per weight of the layers' matrices (blk.*, 2-D): what the file type changes."""
    ts = [t for t in g.tensors if t.name.startswith("blk.") and len(t.shape) == 2]
    return sum(t.nbytes for t in ts) * 8 / sum(t.n_elements for t in ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--chunks", type=int, default=20, help="perplexity windows of 512 tokens")
    ap.add_argument("--imatrix-chunks", type=int, default=32)
    ap.add_argument("--weightings", default="default", help="ggml-ext IQ4_NL weightings to run, comma separated")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the results here too")
    a = ap.parse_args()
    text = assets.path("wiki-test")
    results = []
    for model in a.models.split(","):
        f16 = f16_file(model)
        im = imatrix_file(model, f16, a.imatrix_chunks, a.threads)
        files = [("f16", "-", f16)]
        for use_im in (False, True):
            tag = "imatrix" if use_im else "none"
            for ftype in ("Q4_0", "Q4_1", "IQ4_NL"):
                p = quantize_ggml(model, f16, ftype, im if use_im else None, a.threads)
                files.append((f"{ftype} (ggml)", tag, p))
            template = files[-1][2]  # the IQ4_NL file of llama-quantize just made
            for w in a.weightings.split(","):
                p = requantize_iq4_nl(model, f16, template, im if use_im else None, w, a.threads)
                files.append((f"IQ4_NL (ggml-ext, {w})", tag, p))
        base = None
        for label, tag, p in files:
            t0 = time.time()
            r = tools.perplexity(p, text, n_ctx=512, chunks=a.chunks, threads=a.threads)
            g = read_gguf(p)
            row = {"model": model, "quant": label, "imatrix": tag, "ppl": r.ppl, "stderr": r.stderr,
                   "bpw": g.bits_per_weight(), "bpw_blk": blk_bpw(g), "n_ctx": r.n_ctx, "chunks": r.n_chunks,
                   "tokens_scored": r.n_tokens_scored, "file": p.name, "seconds": round(time.time() - t0, 1)}
            base = base or r.ppl
            row["ratio_f16"] = r.ppl / base
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; wiki-test, ctx 512, {a.chunks} chunks")
    print("| model | quantization | imatrix | bits/weight (all / blk matrices) | PPL | ratio to f16 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['model']} | {r['quant']} | {r['imatrix']} | {r['bpw']:.2f} / {r['bpw_blk']:.2f} | "
              f"{r['ppl']:.4f} +/- "
              f"{r['stderr']:.4f} | {r['ratio_f16']:.4f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
