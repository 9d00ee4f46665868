#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Converter": ggml-ext convert against convert_hf_to_gguf.py (time, peak RSS).
"""Conversion time and peak memory: `ggml-ext convert` vs llama.cpp's convert_hf_to_gguf.py, same run.

Both convert the default model (SmolLM2-135M-Instruct, float32 safetensors) at each
type; rounds alternate which converter goes first (ABBA) and the median is
reported. Wall time and peak resident memory are those of the converter's own
process tree (``os.wait4`` rusage of each child). The source files are read once
before timing so both start from a warm page cache. Prints a markdown table.

  bench/convert/bench_convert.py [--types f16,q8_0] [--rounds 3] [--model HF_DIR]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("scripts")))
import fetch_llama_cpp  # noqa: E402


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return wall, usage.ru_maxrss / 1024  # Linux: KiB


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="f16,q8_0")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per converter and type (ABBA order)")
    ap.add_argument("--model", type=Path, default=None, help="HF folder (default: the default model, smollm2-hf)")
    a = ap.parse_args()

    if a.model is None:
        from ggml_ext import assets
        a.model = assets.path("smollm2-hf")
    tree = fetch_llama_cpp.pristine_tree()
    ours_env = dict(os.environ)
    ref_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ref_env["PYTHONPATH"] = str(tree / "gguf-py")

    for f in sorted(a.model.iterdir()):  # warm the page cache for both
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(16 << 20):
                    pass

    results: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-convert-", dir=os.environ.get("TMPDIR")) as tmp:
        for t in a.types.split(","):
            cmds = {
                "ggml-ext convert": lambda out: [sys.executable, "-m", "ggml_ext.cli", "convert", str(a.model),
                                                 "-o", out, "--type", t, "--force", "-q"],
                "convert_hf_to_gguf.py": lambda out: [sys.executable, str(tree / "convert_hf_to_gguf.py"),
                                                      str(a.model), "--outfile", out, "--outtype", t],
            }
            envs = {"ggml-ext convert": ours_env, "convert_hf_to_gguf.py": ref_env}
            for r in range(a.rounds):
                order = list(cmds) if r % 2 == 0 else list(reversed(cmds))
                for name in order:
                    out = str(Path(tmp) / f"{name.split()[0]}-{t}.gguf")
                    if os.path.exists(out):
                        os.unlink(out)
                    wall, rss = measure(cmds[name](out), envs[name])
                    results.setdefault((t, name), []).append((wall, rss, os.path.getsize(out)))
                    print(f"  {t:5s} {name:22s} round {r + 1}: {wall:6.2f} s, {rss:7.1f} MiB", file=sys.stderr)

    print(f"Conversion of `{a.model.name}` ({sum(f.stat().st_size for f in a.model.glob('*.safetensors')) / 2**20:.0f} "
          f"MiB of safetensors) on {cpu_name()}, {os.cpu_count()} cores; median of {a.rounds} rounds "
          f"(ABBA order), warm page cache. Command: `bench/convert/bench_convert.py --types {a.types} --rounds {a.rounds}`.\n")
    print("| type | converter | wall time (s) | peak RSS (MiB) | output (MiB) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (t, name), runs in results.items():
        wall = statistics.median(x[0] for x in runs)
        rss = statistics.median(x[1] for x in runs)
        print(f"| {t} | {name} | {wall:.2f} | {rss:.0f} | {runs[0][2] / 2**20:.1f} |")
    for t in a.types.split(","):
        ours = statistics.median(x[0] for x in results[(t, "ggml-ext convert")])
        ref = statistics.median(x[0] for x in results[(t, "convert_hf_to_gguf.py")])
        print(f"\n{t}: ggml-ext convert takes {ours / ref:.2f}x the reference's time", end="")
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
