#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Interleaved Q4_0": load time and peak RSS, pre-interleaved file against the runtime repack.
"""Load time and peak RSS: a pre-interleaved Q4_0_8_8 file vs stock Q4_0 with and
without the runtime repack (which copies the weights at load): upstream's, on the pristine
pinned build (`make upstream`), and ours (into Q4_0_8_8, patch 0112).

Each case is one fresh `llama-bench -p 0 -n N -r 1` process (load, N tokens, exit): wall time
and the child's peak RSS (getrusage). Cases are interleaved over rounds; the median is reported.

  bench/interleaved4/bench_load.py [--rounds 5] [--model smollm2|gemma3] [--tokens 1]

smollm2: the default model; gemma3: Gemma-3-270M (asset gemma3-hf), the largest the assets have.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("scripts")))
from default_models import GEMMA, NAME, default_model, gemma_model, repacked  # noqa: E402

from ggml_ext import tools  # noqa: E402


def one_run(model: Path, repack: int, bench: list[str], tokens: int) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of one llama-bench process, measured from a fresh child."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    cmd = [*bench, "-m", str(model), "-p", "0", "-n", str(tokens), "-r", "1", "--repack", str(repack), "-t", "1"]
    out = subprocess.run([sys.executable, "-c", code, *cmd], env=tools.tool_env(), check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def upstream_bench() -> list[str]:
    """The pristine pinned build's llama-bench (scripts/build_upstream.sh, `make upstream`)."""
    out = subprocess.run(["bash", str(Path(__file__).resolve().parents[2] / "scripts" / "build_upstream.sh")], capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"the pristine build failed (make upstream):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return [str(Path(out.stdout.strip().splitlines()[-1]) / "llama-bench")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", choices=["smollm2", "gemma3"], default="smollm2")
    ap.add_argument("--tokens", type=int, default=1, help="tokens generated after the load (default 1)")
    a = ap.parse_args()
    q4_0 = default_model("Q4_0") if a.model == "smollm2" else gemma_model("Q4_0")
    q4_0_8_8 = repacked("Q4_0", "8x8", NAME if a.model == "smollm2" else GEMMA)
    ours, upstream = tools.command("llama-bench"), upstream_bench()
    cases = [("Q4_0, runtime repack off (ours)", q4_0, 0, ours),
             ("Q4_0, upstream's runtime repack (pristine build)", q4_0, 1, upstream),
             ("Q4_0, our runtime repack (into Q4_0_8_8)", q4_0, 1, ours),
             ("Q4_0_8_8 file (repack --layout 8x8 of it)", q4_0_8_8, 1, ours)]
    got: dict[str, list[tuple[float, float]]] = {c[0]: [] for c in cases}
    for _ in range(a.rounds):
        for name, model, repack, bench in cases:
            got[name].append(one_run(model, repack, bench, a.tokens))
    print(f"machine: {os.cpu_count()} logical CPUs; model {q4_0.name}; llama-bench -p 0 -n {a.tokens} -t 1; "
          f"median of {a.rounds} rounds\n")
    print(f"| case | file MiB | load + {a.tokens} token(s), s | peak RSS MiB |")
    print("| --- | --- | --- | --- |")
    for name, model, _, _ in cases:
        t = statistics.median(x[0] for x in got[name])
        rss = statistics.median(x[1] for x in got[name])
        print(f"| {name} | {model.stat().st_size / 2**20:.1f} | {t:.3f} | {rss:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
