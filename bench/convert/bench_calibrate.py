#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Converter": streamed calibration against the whole model on the CPU (time, memory).
"""Peak memory and time of calibration, streamed (one decoder layer at a time) against the naive way
(the whole model in memory, hooks on every layer), each in a fresh process so peak RSS is its own.

    python bench/convert/bench_calibrate.py [--model HF_DIR] [--samples 16] [--seq-len 512] [--what hessian,act_stats]
    python bench/convert/bench_calibrate.py --fisher ...        # Fisher: reverse pass vs whole-model autograd

Default model: the smollm2-hf asset. Prints a Markdown table (wall seconds, peak RSS MiB) and the model's
size in memory (float32 parameters) and one layer's, so the goal "peak <= 1.5 layers + activations" can
be read off.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys, time, torch
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
from ggml_ext.calibrate.data import tokenize
tok = tokenize(args["model"], args["text"], args["samples"], args["seq_len"]).ids
t0 = time.perf_counter()
if args["mode"] == "floor":  # the interpreter, torch, transformers and the tokens: every mode's base
    from transformers import AutoModelForCausalLM  # noqa: F401
elif args["mode"] == "streamed":
    from ggml_ext.calibrate.collect import Collector
    from ggml_ext.calibrate.stream import LayerStream
    st = LayerStream(args["model"]); col = Collector(args["what"])
    for i, layer, prefix in st.run(tok, hooks=col.attach, progress=False):
        col.take(prefix)
elif args["mode"] == "naive":
    from transformers import AutoModelForCausalLM
    from ggml_ext.calibrate.collect import Collector
    m = AutoModelForCausalLM.from_pretrained(args["model"], dtype=torch.float32).eval()
    col = Collector(args["what"])
    layers = m.model.layers
    for i, layer in enumerate(layers):
        col.attach(i, layer, f"model.layers.{i}")
    with torch.no_grad():
        for row in tok:
            m(input_ids=row[None], use_cache=False)
elif args["mode"] == "fisher_streamed":
    from ggml_ext.calibrate.fisher import fisher_streamed
    # each layer's sums handed over as its reverse step ends and dropped here (the stats folder writes
    # them to the layer's file): what `calibrate stats --collect fisher` holds
    fisher_streamed(args["model"], tok, progress=False, on_layer=lambda i, res: None)
else:
    from ggml_ext.calibrate.fisher import fisher_full
    fisher_full(args["model"], tok)
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(mode: str, a) -> dict:
    spec = {"mode": mode, "model": a.model, "text": a.text, "samples": a.samples, "seq_len": a.seq_len,
            "what": a.what.split(","), "threads": a.threads}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF folder (default: the smollm2-hf asset)")
    p.add_argument("--text", default="wiki-train")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--what", default="hessian,act_stats")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fisher", action="store_true", help="time Fisher instead of the forward statistics")
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args()
    if a.model is None:
        from ggml_ext import assets
        a.model = str(assets.path("smollm2-hf"))
    import torch
    from safetensors import safe_open
    from pathlib import Path
    total = layer0 = 0
    for f in Path(a.model).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                n = st.get_slice(k).get_shape()
                size = 4 * int(torch.tensor(n).prod()) if n else 4
                total += size
                layer0 += size if ".layers.0." in k else 0
    modes = ("floor", "fisher_streamed", "fisher_full") if a.fisher else ("floor", "streamed", "naive")
    print(f"model {a.model}: float32 parameters {total / 2**20:.0f} MiB, one layer {layer0 / 2**20:.1f} MiB; "
          f"{a.samples} x {a.seq_len} tokens, {a.threads} thread(s), {a.what if not a.fisher else 'fisher'}")
    print("| mode | wall s | peak RSS MiB |\n| --- | ---: | ---: |")
    for _ in range(a.rounds):
        for mode in modes:
            r = run(mode, a)
            print(f"| {mode} | {r['seconds']:.1f} | {r['peak_rss_mib']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
