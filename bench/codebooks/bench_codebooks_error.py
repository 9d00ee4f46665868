#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Codebooks (CB2/CB3)": the quantizers' weighted error against the stock 2-3-bit types.
"""Importance-weighted quantization error of CB2 / CB3 beside ggml's 2- and 3-bit types, tensor by tensor.

  bench/codebooks/bench_codebooks_error.py [--model smollm2|gemma3] [--layers 0,10,20] [--rows 128]

For each chosen layer's ``ffn_down`` (the matrix every type can take on both models: rows a multiple
of 256), the first --rows rows of the f16 file are quantized to IQ2_XXS, IQ2_XS, IQ2_S, Q2_K, IQ3_S,
Q3_K (ggml's quantizers through ``ggml_ext.quants``) and CB2, CB3 (ggml-ext's C reference), all with
the same imatrix row (bench_iq4_nl_quality's wiki-train imatrix of the f16 file, 32 x 512 tokens),
and dequantized. Prints ``sum imp_j (x - y)^2 / sum imp_j x^2`` per type: the quantizers' own
objective, without the model around it -- where the format and its quantizer stand before perplexity
adds the noise of a short text.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("bench", "interleaved4")))
sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("scripts")))
import bench_iq4_nl_quality as base  # noqa: E402

from ggml_ext import codebooks, quants  # noqa: E402
from ggml_ext.calibrate import imatrix  # noqa: E402
from ggml_ext.gguf import read_gguf  # noqa: E402

STOCK = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "Q2_K", "IQ3_S", "Q3_K")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--layers", default="0,10,20")
    ap.add_argument("--rows", type=int, default=128, help="rows of each tensor (all: 0)")
    ap.add_argument("--imatrix-chunks", type=int, default=32)
    a = ap.parse_args()
    f16 = base.f16_file(a.model)
    im = imatrix.load(base.imatrix_file(a.model, f16, a.imatrix_chunks, None))
    g = read_gguf(f16)
    bpw = {t: quants.row_size(t, 256) * 8 / 256 for t in STOCK}
    bpw |= {f"CB{b}": codebooks.bits_per_weight(b) for b in (2, 3)}
    names = [*STOCK, "CB2", "CB3"]
    print(f"{a.model}, f16 {f16.name}, first {a.rows or 'all'} rows; relative imatrix-weighted squared error")
    print("| tensor | " + " | ".join(f"{n} ({bpw[n]:.4g} bpw)" for n in names) + " |")
    print("| --- |" + " --- |" * len(names))
    for layer in (int(x) for x in a.layers.split(",")):
        t = g.tensor(f"blk.{layer}.ffn_down.weight")
        with open(f16, "rb") as fh:
            fh.seek(t.file_offset)
            dtype = {"F16": np.float16, "F32": np.float32}[t.type_name]
            x = np.frombuffer(fh.read(t.nbytes), dtype=dtype).astype(np.float32).reshape(-1, t.shape[0])
        x = x[:a.rows] if a.rows else x
        w = im.for_tensor(t.name, t.shape[0])
        ref = float((x ** 2 * w).sum())
        errs = {}
        for ty in STOCK:
            y = quants.dequantize(quants.quantize(x, ty, imatrix=w), ty, t.shape[0]).reshape(x.shape)
            errs[ty] = float(((x - y) ** 2 * w).sum()) / ref
        for b in (2, 3):
            errs[f"CB{b}"] = float(((x - codebooks.fake_quantize(x, b, w)) ** 2 * w).sum()) / ref
        print(f"| {t.name} | " + " | ".join(f"{errs[n]:.4f}" for n in names) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
