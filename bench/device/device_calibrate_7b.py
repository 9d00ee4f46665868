#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Converter": streamed calibration and Fisher against the whole model on a 7B-shaped model.
"""Calibration of a 7B-shaped model on one GPU (the lent H100/H200): streamed one layer at a time vs the
whole model in GPU memory, bf16 weights and activations, statistics accumulated in float64.

    PYTHONPATH=python python3 bench/device/device_calibrate_7b.py --tokenizer DIR --text FILE --work /tmp/w --out OUT

Makes a random Llama-2-7B-shaped model (32 layers, d=4096, ffn 11008, 32 heads / 8 KV heads, vocab 49152,
bf16 safetensors, one shard per layer) with the tokenizer of --tokenizer, then times Hessians + activation
statistics over --samples x --seq-len tokens of --text both ways, each in a fresh process, and writes
OUT/summary.json: wall time, peak GPU memory (torch.cuda.max_memory_allocated), peak RSS, and the largest
relative difference of the two ways' Hessians (sampled layers). Then the same for the Fisher diagonal over
--fisher-samples samples: the layer-wise reverse pass (bf16 compute, float64 sums, each layer's sums sent to
the host as its step ends) vs autograd on the whole model in GPU memory with float64 sums (20 bytes a weight:
more than an 80 GB GPU holds) and with float32 sums.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

SHAPE = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=49152, max_position_embeddings=4096, tie_word_embeddings=False,
             bos_token_id=1, eos_token_id=2)

CHILD = r"""
import json, resource, sys, time, torch
a = json.loads(sys.argv[1])
from ggml_ext.calibrate.data import tokenize
from ggml_ext.calibrate.collect import Collector
tok = tokenize(a["model"], a["text"], a["samples"], a["seq_len"]).ids
keep = set(a["keep"])
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
col = Collector(["hessian", "act_stats"])
kept = {}
if a["mode"] == "fisher_streamed":
    from ggml_ext.calibrate.fisher import fisher_streamed
    def on_layer(i, res):   # every layer's sums reach the host; the sampled ones are kept for the comparison
        kept.update({k: v for k, v in res.items() if k in keep})
    outer = fisher_streamed(a["model"], tok, device="cuda", dtype="bfloat16", progress=False, on_layer=on_layer)
    kept.update({k: v for k, v in outer.items() if k in keep})
elif a["mode"] == "fisher_full":
    from ggml_ext.calibrate.fisher import fisher_full
    res = fisher_full(a["model"], tok, device="cuda", dtype="bfloat16", accumulate=a["accumulate"])
    kept.update({k: v for k, v in res.items() if k in keep})
elif a["mode"] == "streamed":
    from ggml_ext.calibrate.stream import LayerStream
    st = LayerStream(a["model"], device="cuda", dtype="bfloat16")
    for i, layer, prefix in st.run(tok, hooks=col.attach, progress=False):
        r = col.take(prefix)
        kept.update({k: v["hessian"] for k, v in r.items() if k in keep})
else:
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.bfloat16).cuda().eval()
    for i, layer in enumerate(m.model.layers):
        col.attach(i, layer, f"model.layers.{i}")
    with torch.no_grad():
        for row in tok:
            m(input_ids=row[None].cuda(), use_cache=False)
    # the same deliverable as the streamed run: every layer's statistics on the host
    for i in range(len(m.model.layers)):
        r = col.take(f"model.layers.{i}")
        kept.update({k: v["hessian"] for k, v in r.items() if k in keep})
torch.cuda.synchronize()
dt = time.perf_counter() - t0
import numpy as np
np.savez(a["dump"], **kept)
print(json.dumps({"seconds": dt, "gpu_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                  "rss_peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def make_model(tok_dir: Path, dst: Path) -> float:
    import torch
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig
    dst.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(**SHAPE)
    cfg.save_pretrained(dst)
    for f in tok_dir.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, dst / f.name)
    with init_empty_weights():
        m = AutoModelForCausalLM.from_config(cfg)
    shards: dict[str, dict] = {}
    for name, p in m.named_parameters():
        key = f"layer{name.split('.')[2]}" if name.startswith("model.layers.") else "outer"
        shards.setdefault(key, {})[name] = p.shape
    g = torch.Generator(device="cuda").manual_seed(0)
    weight_map = {}
    total = 0
    for key, params in shards.items():
        tensors = {}
        for name, shape in params.items():
            if len(shape) == 1:
                t = 1.0 + 0.1 * torch.randn(shape, generator=g, device="cuda")
            else:
                t = torch.randn(shape, generator=g, device="cuda") / shape[-1] ** 0.5
            tensors[name] = t.to(torch.bfloat16).cpu()
            total += tensors[name].numel() * 2
            weight_map[name] = f"model-{key}.safetensors"
        save_file(tensors, str(dst / f"model-{key}.safetensors"), metadata={"format": "pt"})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    return total / 2**30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--work", default="/tmp/calib7b")
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--fisher-samples", type=int, default=8)
    p.add_argument("--skip", default="", help="comma-separated modes not to run")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(a.work) / "model"
    t0 = time.perf_counter()
    gib = make_model(Path(a.tokenizer), model)
    summary = {"model_gib_bf16": gib, "make_seconds": time.perf_counter() - t0, "samples": a.samples,
               "seq_len": a.seq_len}
    keep = ["model.layers.0.self_attn.q_proj", "model.layers.31.mlp.down_proj", "model.layers.15.mlp.up_proj"]
    fkeep = ["model.layers.0.self_attn.q_proj.weight", "model.layers.31.mlp.down_proj.weight",
             "model.layers.15.self_attn.k_proj.out_fisher", "model.embed_tokens.weight", "lm_head.weight"]
    runs = [("streamed", a.samples, keep, {}), ("naive", a.samples, keep, {}),
            ("fisher_streamed", a.fisher_samples, fkeep, {}),
            ("fisher_full", a.fisher_samples, fkeep, {"accumulate": "float64"}),
            ("fisher_full", a.fisher_samples, fkeep, {"accumulate": "float32"})]
    dumps = {}
    for mode, samples, kp, extra in runs:
        label = mode + ("_" + extra["accumulate"] if extra else "")
        if mode in a.skip.split(","):
            continue
        dump = Path(a.work) / f"{label}.npz"
        spec = {"mode": mode, "model": str(model), "text": a.text, "samples": samples, "seq_len": a.seq_len,
                "keep": kp, "dump": str(dump), **extra}
        r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True)
        if r.returncode:
            oom = "OutOfMemoryError" in r.stderr
            print(label, "out of GPU memory" if oom else r.stderr[-4000:], file=sys.stderr)
            summary[label] = {"error": "CUDA out of memory" if oom else r.stderr[-2000:]}
            continue
        summary[label] = {**json.loads(r.stdout.strip().splitlines()[-1]), "samples": samples}
        dumps[label] = dump
        print(label, summary[label], flush=True)
    import numpy as np

    def rel(x: str, y: str, names: list[str]) -> dict:
        s_, n_ = np.load(dumps[x]), np.load(dumps[y])
        return {k: float(np.abs(s_[k] - n_[k]).max() / np.abs(n_[k]).max()) for k in names}
    if {"streamed", "naive"} <= set(dumps):
        summary["hessian_max_rel_diff"] = rel("streamed", "naive", keep)
    ref = next((f for f in ("fisher_full_float64", "fisher_full_float32") if f in dumps), None)
    if ref and "fisher_streamed" in dumps:
        summary["fisher_max_rel_diff"] = rel("fisher_streamed", ref, fkeep)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
