#!/usr/bin/env python3
"""llama-bench of our build and the pristine upstream build, in the same run.

For each build, one llama-bench invocation over every model x threads x repack
setting; rounds alternate the order of the builds (ABBA) and pool the samples,
so drift and warm-up hit both alike. Prints a markdown table with upstream and
ours side by side and the ratio ours / upstream.

  scripts/bench_llama.py [--types Q8_0,Q4_0] [--threads 1,2] [--reps 3] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch_llama_cpp  # noqa: E402
from default_models import default_model  # noqa: E402

from ggml_ext import tools  # noqa: E402


def upstream_bin() -> Path:
    b = fetch_llama_cpp.cache_root() / f"upstream-{fetch_llama_cpp.COMMIT}" / "bin"
    if not (b / "llama-bench").exists():
        raise SystemExit(f"no upstream build in {b}: run `make upstream` first")
    return b


def run_bench(binary: list[str], env: dict | None, model: Path, a: argparse.Namespace) -> list[dict]:
    cmd = [*binary, "-m", str(model), "-p", str(a.prompt), "-n", str(a.gen), "-t", a.threads,
           "--repack", "0,1", "-r", str(a.reps), "-o", "json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def key(r: dict) -> tuple:
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    return (Path(r["model_filename"]).stem.split("-")[-1], test, r["n_threads"], int(bool(r.get("repack", 1))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q8_0,Q4_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench repetitions per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, alternating which build goes first")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    a = ap.parse_args()
    builds = {"upstream": ([str(upstream_bin() / "llama-bench")], None),
              "ours": (tools.command("llama-bench"), tools.tool_env())}
    samples: dict[str, dict[tuple, list[float]]] = {"upstream": {}, "ours": {}}
    for t in a.types.split(","):
        model = default_model(t)
        for rnd in range(a.rounds):
            order = list(builds) if rnd % 2 == 0 else list(reversed(builds))
            for name in order:
                binary, env = builds[name]
                print(f"[bench] round {rnd + 1}/{a.rounds} {name} {model.name}", file=sys.stderr, flush=True)
                for r in run_bench(binary, env, model, a):
                    samples[name].setdefault(key(r), []).extend(r["samples_ts"])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"\nmachine: {cpu}, {os.cpu_count()} logical CPUs; model {default_model('f16').stem[:-4]}; "
          f"{a.rounds} rounds x llama-bench -r {a.reps}, samples pooled (mean ± stdev)\n")
    print("| type | test | threads | repack | upstream t/s | ours t/s | ours / upstream |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in sorted(samples["upstream"]):
        u, o = samples["upstream"][k], samples["ours"].get(k)
        if not o:
            continue
        um, om = statistics.mean(u), statistics.mean(o)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {'on' if k[3] else 'off'} | {um:.1f} ± {statistics.pstdev(u):.1f} | "
              f"{om:.1f} ± {statistics.pstdev(o):.1f} | {om / um:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
