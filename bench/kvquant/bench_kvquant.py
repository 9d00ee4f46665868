#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "KVQuant": the torch simulation ladder (perplexity per KV scheme against fp16).
"""KVQuant's Table 2 ladder by simulated quantization: perplexity of fp16 KV vs int / nf / nuq caches.

    PYTHONPATH=python python bench/kvquant/bench_kvquant.py [--model smollm2|gemma3] [--ctx 2048] [--chunks 2]
        [--calib-samples 16] [--calib-seq-len 2048] [--schemes fp16,int4,...] [--json OUT.json]
        [--hf DIR --test-text FILE --calib-text FILE]   (explicit paths: the device has no asset cache)

--ctx 0 is the model's full context (max_position_embeddings: 8192 for SmolLM2, 32768 for Gemma-3-270M);
--chunks 0 scores every window the text holds.

The model is the Hugging Face folder asset (smollm2-hf: SmolLM2-135M-Instruct, gemma3-hf: Gemma-3-270M),
calibrated by `ggml-ext calibrate kv` (ggml_ext.kvquant.calibration) on wiki-train; perplexity is
llama-perplexity's method (windows of --ctx tokens, the second half of each scored) on wiki-test, every
scheme on the same windows, in the same run, with the float model (the "fp16" row: K/V not quantized) as
the baseline. Prints a markdown table of perplexity and delta vs fp16 with context and token count.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

MODELS = {"smollm2": "smollm2-hf", "gemma3": "gemma3-hf"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--ctx", type=int, default=2048, help="perplexity window (default 2048)")
    ap.add_argument("--chunks", type=int, default=2, help="windows scored (default 2)")
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--calib-seq-len", type=int, default=2048)
    ap.add_argument("--calibration", default=None, help="an existing side file instead of calibrating")
    ap.add_argument("--schemes", default=None, help="comma-separated (default: the ladder)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="torch device for calibration and perplexity (cpu, cuda)")
    ap.add_argument("--hf", default=None, help="a Hugging Face model folder instead of --model's asset")
    ap.add_argument("--test-text", default=None, help="the perplexity text (default: the wiki-test asset)")
    ap.add_argument("--calib-text", default=None, help="the calibration text (default: the wiki-train asset)")
    ap.add_argument("--calib-out", default=None, help="where to save the calibration (default /tmp/kvquant-*.gguf)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ggml_ext.calibrate.data import leading_bos
    from ggml_ext.kvquant import LADDER, KVCalibration, calibrate, perplexity, scheme, simulate
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.hf:
        hf = Path(a.hf)
    else:
        from ggml_ext import assets
        hf = assets.path(MODELS[a.model])
    t0 = time.time()
    if a.calibration:
        cal = KVCalibration.load(a.calibration, hf)
    else:
        cal = calibrate(hf, a.calib_text, n_samples=a.calib_samples, seq_len=a.calib_seq_len, device=a.device)
        out = Path(a.calib_out or f"/tmp/kvquant-{a.model}-{a.calib_samples}x{a.calib_seq_len}.gguf")
        cal.save(out, force=True)
        print(f"calibration: {out}", file=sys.stderr)
    t_cal = time.time() - t0
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, local_files_only=True).eval().to(a.device)
    tok = AutoTokenizer.from_pretrained(hf, local_files_only=True)
    if a.ctx <= 0:
        a.ctx = int(model.config.max_position_embeddings)
    if a.test_text:
        text = Path(a.test_text).read_text(encoding="utf-8")
    else:
        from ggml_ext import assets
        text = Path(assets.path("wiki-test")).read_text(encoding="utf-8")
    if a.chunks > 0:
        text = text[: 12 * a.ctx * a.chunks]  # ~4 chars a token: enough
    ids = tok(text, add_special_tokens=False).input_ids
    if a.chunks <= 0:
        a.chunks = len(ids) // a.ctx
    bos = leading_bos(tok)
    names = a.schemes.split(",") if a.schemes else list(LADDER)
    rows = []
    base = None
    for name in names:
        t = time.time()
        with simulate(model, scheme(name), cal):
            ppl, n = perplexity(model, ids, a.ctx, a.chunks, bos, progress=True, desc=name)
        base = ppl if name == "fp16" else base
        rows.append({"scheme": name, "ppl": ppl, "tokens": n, "seconds": time.time() - t})
        print(f"{name:14s} {ppl:10.4f}  {n} tokens  {time.time() - t:.0f}s", file=sys.stderr, flush=True)
    print(f"\n{a.model} ({a.hf or MODELS[a.model]}), {a.test_text or 'wiki-test'}, n_ctx {a.ctx}, {min(a.chunks, len(ids) // a.ctx)} windows, {rows[0]['tokens']} "
          f"scored tokens; calibration {cal.meta['calibration.n_samples']}x{cal.meta['calibration.seq_len']} tokens "
          f"of {cal.meta['calibration.text']} ({t_cal:.0f}s); {platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, device {a.device}\n")
    print("| KV cache | perplexity | delta vs fp16 |")
    print("| --- | ---: | ---: |")
    for r in rows:
        d = "" if base is None else f"{r['ppl'] - base:+.4f}"
        print(f"| {r['scheme']} | {r['ppl']:.4f} | {d} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "ctx": a.ctx, "chunks": a.chunks, "rows": rows,
                                            "calibration": cal.meta, "calibration_seconds": t_cal}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
