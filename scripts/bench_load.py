#!/usr/bin/env python3
"""Load time and peak RSS: a pre-interleaved Q4_0_8_8 file vs stock Q4_0 with and
without the runtime repack (which copies the weights at load): upstream's
(GGML_EXT_RUNTIME_REPACK=0) and ours (into Q4_0_8_8, patch 0112).

Each case is one fresh `llama-bench -p 0 -n 1 -r 1` process of our build (load,
one token, exit): wall time and the child's peak RSS (getrusage). Cases are
interleaved over rounds; the median is reported.

  scripts/bench_load.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from default_models import default_model, repacked_q4_0  # noqa: E402

from ggml_ext import tools  # noqa: E402


def one_run(model: Path, repack: int, env: dict[str, str]) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of one llama-bench process, measured from a fresh child."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    cmd = tools.command("llama-bench", "-m", model, "-p", "0", "-n", "1", "-r", "1", "--repack", str(repack),
                        "-t", "1")
    out = subprocess.run([sys.executable, "-c", code, *cmd], env={**tools.tool_env(), **env}, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    upstream = {"GGML_EXT_RUNTIME_REPACK": "0"}
    cases = [("Q4_0, runtime repack off", default_model("Q4_0"), 0, {}),
             ("Q4_0, upstream's runtime repack", default_model("Q4_0"), 1, upstream),
             ("Q4_0, our runtime repack (into Q4_0_8_8)", default_model("Q4_0"), 1, {}),
             ("Q4_0_8_8 file (repack --layout 8x8 of it)", repacked_q4_0("8x8"), 1, {})]
    got: dict[str, list[tuple[float, float]]] = {c[0]: [] for c in cases}
    for _ in range(a.rounds):
        for name, model, repack, env in cases:
            got[name].append(one_run(model, repack, env))
    print(f"machine: {os.cpu_count()} logical CPUs; llama-bench -p 0 -n 1 -t 1; median of {a.rounds} rounds\n")
    print("| case | file MiB | load + 1 token, s | peak RSS MiB |")
    print("| --- | --- | --- | --- |")
    for name, model, _, _ in cases:
        t = statistics.median(x[0] for x in got[name])
        rss = statistics.median(x[1] for x in got[name])
        print(f"| {name} | {model.stat().st_size / 2**20:.1f} | {t:.3f} | {rss:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
