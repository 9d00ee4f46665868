#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "GPTQ and OOC": GPTQ against rtn and rtn + imatrix, perplexity and conversion time.
"""Perplexity and quantization time of GPTQ against round-to-nearest, with and without an imatrix.

  bench/gptq/bench_gptq.py [--models smollm2,gemma3] [--types q4_0,iq4_nl,q3_k,q2_k] [--calib-samples 16]
                        [--calib-seq-len 512] [--chunks 20] [--threads N] [--json OUT] [--no-llama-quantize]

For each model (SmolLM2-135M-Instruct's dequantized HF folder ``smollm2-hf``; Gemma-3-270M's
``gemma3-hf``) and type, all by ``ggml-ext convert`` of the HF folder:

* ``rtn``: ``--type T`` (the type's own quantizer: ggml's; ggml-ext's exact search for IQ4_NL);
* ``rtn+imatrix``: ``--type T --imatrix FILE``, FILE made by our ``llama-imatrix`` (``ggml-ext
  imatrix``) from the f16 file on wiki-train, ``calib-samples`` chunks of ``calib-seq-len`` tokens
  -- the same quantizer bytes as ``llama-quantize --imatrix`` (stock's strongest path);
* ``gptq``: ``--method gptq --calib wiki-train --calib-samples N --calib-seq-len L``: the same
  amount of the same text (windows at evenly spaced offsets rather than llama-imatrix's first
  chunks); ``--gptq LABEL:KEY=VALUE,...`` (repeatable) measures GPTQ variants instead, e.g.
  ``v-attn:scale_rule=static,percdamp=0.1,v_hessian=attention`` (docs/GPTQ.md);
* for the K-quant types (q2_k, q3_k, q4_k, q5_k, q6_k: the converter's "pure" files, every layer matrix
  the type or llama-quantize's fallback for rows not a multiple of 256, Q4_0 for Q2_K / Q3_K), stock's
  own tool on the f32 file (the converter quantizes the float32 weights too) with the same imatrix: ``llama-quantize --imatrix --pure`` with the
  token-embedding / output types of our rtn file (like for like: same type per tensor; its bytes are
  compared with the ``rtn+imatrix`` file's, and scored only if they differ), and llama.cpp's mixes
  of that type (q3_k: Q3_K_S, Q3_K_M; q2_k: Q2_K; ...), which give some tensors other types
  (``--no-llama-quantize``: skip these rows).

Every row says the file's bits per weight (``ggml-ext bits``: A over all tensors, and A_lim over
the quantized matrices) and its tensor types.

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

from ggml_ext import assets, bits, tools
from ggml_ext.calibrate import imatrix
from ggml_ext.converters import convert

sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("bench", "convert")))
from bench_convert import cpu_name  # noqa: E402

HF = {"smollm2": "smollm2-hf", "gemma3": "gemma3-hf"}
#: llama.cpp's ftype mixes whose main type is the K-quant (llama-quantize's type names)
MIXES = {"q2_k": ("Q2_K",), "q3_k": ("Q3_K_S", "Q3_K_M"), "q4_k": ("Q4_K_S", "Q4_K_M"), "q5_k": ("Q5_K_S", "Q5_K_M"),
         "q6_k": ("Q6_K",)}
#: the ftype llama-quantize --pure is given for a K type (every tensor of it, all the same)
PURE = {"q2_k": "Q2_K", "q3_k": "Q3_K_S", "q4_k": "Q4_K_S", "q5_k": "Q5_K_S", "q6_k": "Q6_K"}


def file_info(path: Path) -> dict:
    """Bits per weight (all tensors; the quantized matrices' A_lim) and 'TYPE x count' of a GGUF file."""
    from collections import Counter
    from ggml_ext.gguf import read_gguf
    g = read_gguf(path)
    fb = bits.file_bits(g)
    types = Counter(t.type_name for t in g.tensors if t.type_name != "F32")
    return {"bpw": fb.a_total, "bpw_quant": fb.a_lim,
            "types": " ".join(f"{k}x{v}" for k, v in sorted(types.items(), key=lambda kv: -kv[1])),
            "tensor_types": {t.name: t.type_name for t in g.tensors}}


def _tensor_bytes(path: Path) -> dict[str, bytes]:
    """name -> data of every tensor (metadata apart: llama-quantize's keys differ from the converter's)."""
    from ggml_ext.gguf import read_gguf
    out = {}
    with open(path, "rb") as f:
        for t in read_gguf(path).tensors:
            f.seek(t.file_offset)
            out[t.name] = f.read(t.nbytes)
    return out


def llama_quantize(src: Path, dst: Path, ftype: str, imatrix: Path, threads: int | None, *,
                   pure_like: dict | None = None) -> None:
    """Our build's llama-quantize (upstream's tool, stock types) with ``imatrix``; ``pure_like``: the
    tensor types of our file, whose token-embedding / output types ``--pure`` is given."""
    args = ["--imatrix", imatrix]
    if pure_like is not None:
        args += ["--pure", "--token-embedding-type", pure_like["token_embd.weight"].lower()]
        if "output.weight" in pure_like:
            args += ["--output-tensor-type", pure_like["output.weight"].lower()]
    import subprocess
    r = subprocess.run(tools.command("llama-quantize", *args, src, dst, ftype, str(threads or os.cpu_count())),
                       env=tools.tool_env(), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-quantize {ftype} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


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
    ap.add_argument("--no-llama-quantize", action="store_true",
                    help="K-quant types: skip llama-quantize's --pure and mix files (default: measure them)")
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
            f32 = d / f"{model}-f32.gguf"  # llama-quantize's source: the converter quantizes the float32 weights
            if not a.no_llama_quantize and any(t in PURE for t in a.types.split(",")):
                convert(hf, f32, "f32")
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
                jobs = [(m, ("convert", kw)) for m, kw in [("rtn", {}), ("rtn+imatrix", {"imatrix": im}), *gptq]]
                if t in PURE and not a.no_llama_quantize:
                    jobs += [("llama-quantize --pure", ("pure", PURE[t]))]
                    jobs += [(f"llama-quantize {mix} (mix)", ("mix", mix)) for mix in MIXES[t]]
                done: dict[str, dict] = {}
                for method, (how, kw) in jobs:
                    out = d / f"{model}-{t}-{method.replace(' ', '_')}.gguf"
                    t0 = time.time()
                    if how == "convert":
                        convert(hf, out, t, threads=a.threads, **kw)
                    else:
                        llama_quantize(f32, out, kw, im, a.threads,
                                       pure_like=done["rtn"]["tensor_types"] if how == "pure" else None)
                    secs = time.time() - t0
                    info = file_info(out)
                    done[method] = info
                    same = None
                    if how == "pure":  # like for like: same types as ours; same bytes as our rtn+imatrix?
                        if info["tensor_types"] != done["rtn"]["tensor_types"]:
                            raise RuntimeError(f"{model} {t}: llama-quantize --pure gave other tensor types than ours")
                        same = _tensor_bytes(out) == done["rtn+imatrix"]["bytes"]
                    if same:
                        r = done["rtn+imatrix"]["ppl"]
                    else:
                        r = tools.perplexity(out, test, n_ctx=512, chunks=a.chunks, threads=a.threads)
                    info["ppl"] = r
                    if method == "rtn+imatrix":
                        info["bytes"] = _tensor_bytes(out)
                    row = {"model": model, "type": t, "method": method, "ppl": r.ppl, "stderr": r.stderr,
                           "seconds": secs, "imatrix_seconds": t_im if method == "rtn+imatrix" else None,
                           "bpw": info["bpw"], "bpw_quant": info["bpw_quant"], "types": info["types"],
                           "same_bytes_as_rtn_imatrix": same}
                    rows.append(row)
                    print(f"# {model} {t} {method}: {r} ({secs:.0f} s; {info['bpw']:.3f} bpw, {info['types']})"
                          + (" = rtn+imatrix's bytes" if same else ""), file=sys.stderr)
                    out.unlink()
    print("| model | type | method | PPL | bpw (all / quantized) | tensor types | quantization time |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        secs = "" if r["seconds"] is None else f"{r['seconds']:.0f} s"
        if r.get("imatrix_seconds"):
            secs += f" (+ {r['imatrix_seconds']:.0f} s llama-imatrix)"
        bpw = f"{r['bpw']:.3f} / {r['bpw_quant']:.3f}" if r.get("bpw") else ""
        method = r["method"] + (" (= rtn+imatrix bytes)" if r.get("same_bytes_as_rtn_imatrix") else "")
        print(f"| {r['model']} | {r['type']} | {method} | {r['ppl']:.3f} +/- {r['stderr']:.3f} | {bpw} | "
              f"{r.get('types', '')} | {secs} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
