#!/usr/bin/env python3
"""Any-precision on the CPU: llama-bench token generation (and prompt processing) of one bitplane file at
each precision (our build, ``GGML_EXT_APQ_BITS=b``: the APQ op reading the first b planes), against stock
files of the same model run by the pristine upstream build, in the same run (ABBA rounds, samples pooled).

  scripts/bench_anyprec_speed.py FILE.apq.gguf [--bits 3-8] [--stock Q4_K_M,Q3_K_M] [--threads 2]
                                 [--gen 64] [--prompt 0] [--reps 3] [--rounds 2] [--json OUT]

FILE: a bitplane file of the default model (``ggml-ext convert --method anyprec --bits 3-8``); the stock
files are scripts/default_models.py's (our llama-quantize of the f16 conversion; the upstream build
runs them). Prints markdown: tokens/s per precision and per stock type, and the ratio to the first
stock type.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import cpu_name  # noqa: E402
from bench_llama import upstream_bin  # noqa: E402
from default_models import NAME, default_model  # noqa: E402

from ggml_ext import anyprec as ap  # noqa: E402
from ggml_ext import tools  # noqa: E402


def bench(cmd: list[str], env: dict, model: Path, a: argparse.Namespace) -> dict[str, list[float]]:
    args = [*cmd, "-m", str(model), "-p", str(a.prompt), "-n", str(a.gen), "-t", str(a.threads), "-r", str(a.reps),
            "-o", "json"]
    out = subprocess.run(args, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"llama-bench failed on {model}:\n{out.stderr[-2000:]}")
    res: dict[str, list[float]] = {}
    for r in json.loads(out.stdout):
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        res[test] = list(r["samples_ts"])
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=Path)
    p.add_argument("--bits", default="3-8")
    p.add_argument("--stock", default="Q4_K_M,Q3_K_M")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--prompt", type=int, default=0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    lo, hi = ap.parse_bits(a.bits)
    ours = tools.command("llama-bench")
    cases = [(f"anyprec {b} bits (ours)", ours, {**tools.tool_env(), "GGML_EXT_APQ_BITS": str(b)}, a.file)
             for b in range(lo, hi + 1)]
    cases += [(f"{t} (upstream build)", [str(upstream_bin() / "llama-bench")], None, default_model(t))
              for t in a.stock.split(",") if t]
    samples: dict[str, dict[str, list[float]]] = {c[0]: {} for c in cases}
    for rnd in range(a.rounds):
        for name, cmd, env, model in (cases if rnd % 2 == 0 else list(reversed(cases))):
            print(f"[bench] round {rnd + 1}/{a.rounds} {name}", file=sys.stderr, flush=True)
            for test, s in bench(cmd, env, model, a).items():
                samples[name].setdefault(test, []).extend(s)
    base = next((c[0] for c in cases if "upstream" in c[0]), cases[0][0])
    print(f"\nmachine: {cpu_name()}; model {NAME}; {a.threads} threads; {a.rounds} rounds x llama-bench -r {a.reps}, "
          "samples pooled (mean ± stdev)\n")
    tests = sorted(samples[cases[0][0]])
    print("| file | " + " | ".join(f"{t} t/s | {t} / {base}" for t in tests) + " |")
    print("|---|" + "---|---|" * len(tests))
    for name, *_ in cases:
        cells = []
        for t in tests:
            s, b = samples[name][t], samples[base][t]
            cells += [f"{statistics.mean(s):.1f} ± {statistics.pstdev(s):.1f}",
                      f"{statistics.mean(s) / statistics.mean(b):.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
