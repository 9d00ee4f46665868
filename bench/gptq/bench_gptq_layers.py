#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "GPTQ and OOC": GPTQ's per-matrix output error against the imatrix quantizer.
"""GPTQ against llama.cpp's imatrix quantizer on single matrices: layer-output error on held-out text.

  bench/gptq/bench_gptq_layers.py [--model smollm2-hf] [--layers 2,20] [--type q4_0] [--calib-samples 16]
                               [--test-samples 8] [--seq-len 512]

For each matrix of the chosen decoder layers (the layers before them unquantized), the Hessian
H = XᵀX of its inputs over ``calib-samples`` windows of wiki-train (the calibration) and H' over
``test-samples`` windows of wiki-test (held out), both from :class:`ggml_ext.calibrate.LayerStream`.
The squared layer-output error ``||(W - Q) X||²`` = tr(D H Dᵀ) of each quantization, relative to the
imatrix quantizer's (``quants.quantize(W, T, imatrix=diag H)``: the bytes ``llama-quantize --imatrix``
writes), on the calibration text / on the held-out text:

* ``rtn``: the type's quantizer without importances;
* ``imat``: = 1 by definition;
* ``gptq``: :func:`ggml_ext.methods.gptq.gptq` with its defaults (act-order, dynamic block scales);
* ``gptq-static``: ``scale_rule="static"`` (the imatrix quantizer's scales, fixed before the sweep);
* ``gptq-static-noact``: the same without act-order.

A value below 1 on the held-out text means GPTQ's matrix reproduces the layer's output better than
stock's best quantizer on text it was not fitted to. Prints one line per matrix and the means.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from ggml_ext import assets, quants
from ggml_ext.calibrate.collect import Collector
from ggml_ext.calibrate.data import tokenize
from ggml_ext.calibrate.stream import LayerStream
from ggml_ext.methods import gptq as G


def hessians(hf: str, text: str, n: int, seq_len: int, layers: list[int]) -> dict:
    tok = tokenize(hf, text, n_samples=n, seq_len=seq_len)
    st, col, out = LayerStream(hf), Collector(("hessian",)), {}
    for i, layer, prefix in st.run(tok.ids, hooks=col.attach, progress=False):
        got = col.take(prefix)
        if i in layers:
            for name, r in got.items():
                w = layer.get_submodule(name[len(prefix) + 1:]).weight.detach().float().numpy().copy()
                out[name] = (w, r["hessian"])
        if i >= max(layers):
            break
    return out


def err(W, Q, H) -> float:
    D = W.astype(np.float64) - Q.astype(np.float64)
    return float(np.sum((D @ H) * D))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-hf")
    ap.add_argument("--layers", default="2,20")
    ap.add_argument("--type", default="q4_0")
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--test-samples", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    a = ap.parse_args()
    T, layers, hf = a.type.upper(), [int(x) for x in a.layers.split(",")], str(assets.path(a.model))
    tr = hessians(hf, "wiki-train", a.calib_samples, a.seq_len, layers)
    te = hessians(hf, "wiki-test", a.test_samples, a.seq_len, layers)
    torch.set_num_threads(1)
    variants = {
        "rtn": lambda W, H: quants.dequantize(quants.quantize(W, T), T, W.shape[1]),
        "imat": lambda W, H: quants.dequantize(quants.quantize(W, T, imatrix=np.diag(H).astype(np.float32)), T,
                                               W.shape[1]),
        "gptq": lambda W, H: G.gptq(W, H, T).Q,
        "gptq-static": lambda W, H: G.gptq(W, H, T, scale_rule="static").Q,
        "gptq-static-noact": lambda W, H: G.gptq(W, H, T, scale_rule="static", act_order=False).Q,
    }
    tot = {k: [0.0, 0.0] for k in variants}
    print(f"# {a.model} {T}: error relative to the imatrix quantizer's, calibration text / held-out text")
    for name, (W, H) in tr.items():
        Ht = te[name][1]
        Qs = {k: f(W, H) for k, f in variants.items()}
        base = err(W, Qs["imat"], H), err(W, Qs["imat"], Ht)
        line = [name.split("layers.")[1]]
        for k, Q in Qs.items():
            r = err(W, Q, H) / base[0], err(W, Q, Ht) / base[1]
            tot[k][0] += r[0]
            tot[k][1] += r[1]
            line.append(f"{k} {r[0]:.3f}/{r[1]:.3f}")
        print("  ".join(line), flush=True)
    print("mean: " + "  ".join(f"{k} {v[0] / len(tr):.3f}/{v[1] / len(tr):.3f}" for k, v in tot.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
