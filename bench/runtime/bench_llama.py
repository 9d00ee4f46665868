#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Interleaved Q4_0" and "IQ4_NL": llama-bench of our build against the pristine upstream build.
"""llama-bench of our build and the pristine upstream build, in the same run.

For each build, one llama-bench invocation over every model x threads x repack
setting; rounds alternate the order of the builds (ABBA) and pool the samples,
so drift and warm-up hit both alike. Prints a markdown table with upstream and
ours side by side and the ratio ours / upstream.

  bench/runtime/bench_llama.py [--types Q8_0,Q4_0] [--threads 1,2] [--reps 3] [--rounds 2]
                         [--ours-only q4_0_8_8 --against Q4_0]
  bench/runtime/bench_llama.py --runtime-repack [--threads 1,2] [--reps 3] [--rounds 2]

--ours-only: types only our build runs (the interleaved ones); each is timed in
the rounds of --against's file and compared with upstream's best path on it.

--runtime-repack: the stock Q4_0 file with the runtime repack on, four ways in the
same rounds: the pristine upstream build, our build with GGML_EXT_RUNTIME_REPACK=0
(upstream's repack), our build (our repack into Q4_0_8_8 and our kernels), and the
pre-interleaved Q4_0_8_8 file (`repack --layout 8x8` of that Q4_0 file) on our build;
ratios against the pristine upstream build (its runtime repack) measured in the same rounds.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("scripts")))
import fetch_llama_cpp  # noqa: E402
from default_models import NAME, default_model, label, repacked, repacked_q4_0  # noqa: E402

from ggml_ext import tools  # noqa: E402


def upstream_bin() -> Path:
    b = fetch_llama_cpp.cache_root() / f"upstream-{fetch_llama_cpp.COMMIT}" / "bin"
    if not (b / "llama-bench").exists():
        raise SystemExit(f"no upstream build in {b}: run `make upstream` first")
    return b


def run_bench(binary: list[str], env: dict | None, model: Path, a: argparse.Namespace,
              repack: str = "0,1") -> list[dict]:
    cmd = [*binary, "-m", str(model), "-p", str(a.prompt), "-n", str(a.gen), "-t", a.threads,
           "--repack", repack, "-r", str(a.reps), "-o", "json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def key(r: dict) -> tuple:
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    return (label(Path(r["model_filename"])), test, r["n_threads"], int(bool(r.get("repack", 1))))


def machine_line(a: argparse.Namespace) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    return (f"machine: {cpu}, {os.cpu_count()} logical CPUs; model {NAME}; "
            f"{a.rounds} rounds x llama-bench -r {a.reps}, samples pooled (mean ± stdev)")


def runtime_repack(a: argparse.Namespace) -> int:
    """Stock Q4_0 through upstream's runtime repack and ours, and the Q4_0_8_8 file (ABBA rounds)."""
    ours_env = tools.tool_env()
    q4, i88 = default_model("Q4_0"), repacked_q4_0("8x8")
    cases = [("upstream build, Q4_0", [str(upstream_bin() / "llama-bench")], None, q4),
             ("ours, Q4_0, GGML_EXT_RUNTIME_REPACK=0", tools.command("llama-bench"),
              {**ours_env, "GGML_EXT_RUNTIME_REPACK": "0"}, q4),
             ("ours, Q4_0", tools.command("llama-bench"), ours_env, q4),
             ("ours, Q4_0_8_8 file", tools.command("llama-bench"), ours_env, i88)]
    samples: dict[str, dict[tuple, list[float]]] = {c[0]: {} for c in cases}
    for rnd in range(a.rounds):
        for name, binary, env, model in (cases if rnd % 2 == 0 else list(reversed(cases))):
            print(f"[bench] round {rnd + 1}/{a.rounds} {name}", file=sys.stderr, flush=True)
            for r in run_bench(binary, env, model, a, repack="1"):
                samples[name].setdefault(key(r)[1:3], []).extend(r["samples_ts"])
    base = cases[0][0]  # the pristine build: the baseline
    print(f"\n{machine_line(a)}; runtime repack on (--repack 1)\n")
    print("| test | threads | " + " | ".join(f"{c[0]} t/s" for c in cases) + " | "
          + " | ".join(f"{c[0]} / upstream build" for c in cases[1:]) + " |")
    print("|" + " --- |" * (2 + len(cases) + len(cases) - 1))
    for k in sorted(samples[base]):
        cells = [f"{statistics.mean(samples[c[0]][k]):.1f} ± {statistics.pstdev(samples[c[0]][k]):.1f}"
                 for c in cases]
        ratios = [f"{statistics.mean(samples[c[0]][k]) / statistics.mean(samples[base][k]):.2f}" for c in cases[1:]]
        print(f"| {k[0]} | {k[1]} | " + " | ".join(cells + ratios) + " |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q8_0,Q4_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench repetitions per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, alternating which build goes first")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--ours-only", default="",
                    help="files run by our build only: a type our converter writes (q4_0_8_8, iq4_nl_8_8: "
                         "ggml-ext's IQ4_NL quantizer) or repack-LAYOUT (repack-8x8: `ggml-ext repack` of "
                         "--against's file, the very same weights interleaved)")
    ap.add_argument("--against", default="Q4_0", help="the type whose upstream figures --ours-only is compared with")
    ap.add_argument("--runtime-repack", action="store_true",
                    help="stock Q4_0: upstream's runtime repack vs ours vs the Q4_0_8_8 file")
    a = ap.parse_args()
    if a.runtime_repack:
        return runtime_repack(a)
    builds = {"upstream": ([str(upstream_bin() / "llama-bench")], None),
              "ours": (tools.command("llama-bench"), tools.tool_env())}
    samples: dict[str, dict[tuple, list[float]]] = {"upstream": {}, "ours": {}}
    extra_files = [repacked(a.against, x[len("repack-"):]) if x.lower().startswith("repack-") else default_model(x)
                   for x in a.ours_only.split(",") if x]
    extra = [label(f) for f in extra_files]
    for t in a.types.split(","):
        model = default_model(t)
        runs = [(name, model) for name in builds]
        if t == a.against:
            runs += [("ours", f) for f in extra_files]
        for rnd in range(a.rounds):
            for name, m in (runs if rnd % 2 == 0 else list(reversed(runs))):
                binary, env = builds[name]
                print(f"[bench] round {rnd + 1}/{a.rounds} {name} {m.name}", file=sys.stderr, flush=True)
                for r in run_bench(binary, env, m, a):
                    samples[name].setdefault(key(r), []).extend(r["samples_ts"])
    print(f"\n{machine_line(a)}\n")
    print("| type | test | threads | repack | upstream t/s | ours t/s | ours / upstream |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in sorted(samples["upstream"]):
        u, o = samples["upstream"][k], samples["ours"].get(k)
        if not o:
            continue
        um, om = statistics.mean(u), statistics.mean(o)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {'on' if k[3] else 'off'} | {um:.1f} ± {statistics.pstdev(u):.1f} | "
              f"{om:.1f} ± {statistics.pstdev(o):.1f} | {om / um:.2f} |")
    if extra:
        print(f"\n| ours | test | threads | ours t/s | upstream {a.against} repack off | repack on | "
              f"ours / upstream's best |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for k in sorted(k for k in samples["ours"] if k[0] in extra and k[3] == 1):
            o = statistics.mean(samples["ours"][k])
            off = statistics.mean(samples["upstream"][(a.against.upper(), k[1], k[2], 0)])
            on = statistics.mean(samples["upstream"][(a.against.upper(), k[1], k[2], 1)])
            print(f"| {k[0]} | {k[1]} | {k[2]} | {o:.1f} ± {statistics.pstdev(samples['ours'][k]):.1f} | "
                  f"{off:.1f} | {on:.1f} | {o / max(on, off):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
