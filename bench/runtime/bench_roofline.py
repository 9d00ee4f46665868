#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "CPU roofline": decode and prefill of 7B-shaped files of every weight format we write,
# against the nearest upstream type on the pristine upstream build, with the machine's read bandwidth measured
# in the same run.
"""CPU decode at the memory roofline: every format we write against upstream's nearest type.

Decode (tg) of a model bigger than the caches streams its weights from memory once per token, so its bound is
bytes read per token / read bandwidth. For each pair (ours, upstream's nearest type) this makes a Llama-2-7B-
shaped file (bench/runtime/make_bench_gguf.py: random codes, --layers decoder layers; speed does not depend on
the values), runs llama-bench pp512 / tg128 at each thread count on our build and on the pristine upstream
build, the builds taking turns to go first (ABBA passes; samples pooled), measures the read bandwidth at the same thread counts
(bench/runtime/read_bandwidth.c, before and after the passes), and prints one table:

  format, its upstream twin, MB read per token, threads, tg t/s (ours, upstream), the share of the read
  bandwidth each reaches (MB per token x t/s / GB/s), ours / upstream for tg and pp512

Bytes read per token: every tensor but the token embedding (one row of it is read); an any-precision file at
b bits counts its first b bitplanes and precision b's tables (what the kernels read). Upstream's files run on
its best CPU path (runtime repack on, its default).

    bench/runtime/bench_roofline.py --ours OURS_BIN --upstream UP_BIN --template VOCAB.gguf --work DIR \\
        [--layers 4] [--threads 1,2] [--pairs q4_0_8_8:q4_0,...] [--reps 2] [--passes 2] [--ubatch U]

OURS_BIN / UP_BIN: folders holding llama-bench (ours: an installed ggml_ext's bin/); VOCAB.gguf: any GGUF of a
llama-architecture tokenizer (llama.cpp's models/ggml-vocab-llama-spm.gguf).
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

#: ours -> upstream's nearest type (issue goals: Q4_0 repack for Q4_0_x, IQ4_NL repack for IQ4_NL_x, Q2_K for CB2,
#: Q3_K for CB3, Q3_K / Q4_K for any-precision at 3 / 4 bits and above)
PAIRS = ("q4_0_8_8:q4_0", "iq4_nl_8_8:iq4_nl", "cb2:q2_k", "cb3:q3_k", "apq3:q3_k", "apq4:q4_k", "apq5:q4_k",
         "apq6:q4_k", "apq8:q4_k")


def sh(argv: list[str], env: dict | None = None) -> str:
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} ... failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    return r.stdout


def make_file(kind: str, a: argparse.Namespace) -> Path:
    """The 7B-shaped file of ``kind`` (a make_bench_gguf type, an interleaved twin, or ``apq``), made once."""
    out = a.work / f"{kind}-{a.layers}l.gguf"
    if out.exists():
        return out
    mk = [sys.executable, str(ROOT / "bench/runtime/make_bench_gguf.py"), str(a.template)]
    if kind.endswith("_8_8"):
        plain = make_file(kind[: -len("_8_8")], a)
        sh([sys.executable, "-m", "ggml_ext.cli", "repack", "--layout", "8x8", str(plain), str(out)])
    else:
        sh([*mk, str(out), "--type", kind, "--layers", str(a.layers)])
    return out


def bytes_per_token(path: Path, apq_bits: int | None) -> int:
    """Bytes decode reads per token: every tensor but the token embedding; APQ matrices at ``apq_bits``."""
    from ggml_ext.gguf import read_gguf
    g = read_gguf(path)
    if apq_bits is None:
        return sum(t.nbytes for t in g.tensors if t.name != "token_embd.weight")
    from ggml_ext.anyprec import planes_bytes, tables_bytes
    from ggml_ext.anyprec.extract import TABLES_SUFFIX, open_file
    f = open_file(path)
    mats, total = set(f.matrices), 0
    for t in g.tensors:
        if t.name == "token_embd.weight" or (t.name.endswith(TABLES_SUFFIX) and t.name[: -len(TABLES_SUFFIX)] in mats):
            continue
        if t.name in mats:
            k, n = f.dims(t.name)
            total += planes_bytes(n, k, apq_bits) + tables_bytes(n, apq_bits)
        else:
            total += t.nbytes
    return total


def read_bandwidth(a: argparse.Namespace) -> dict[int, float]:
    exe = a.work / "read_bandwidth"
    if not exe.exists():
        sh(["cc", "-O3", "-march=native", "-pthread", str(ROOT / "bench/runtime/read_bandwidth.c"), "-o", str(exe)])
    out = {}
    for t in a.threads:
        line = sh([str(exe), str(t), str(a.bw_mib), "5"])
        out[t] = float(line.split("best_GBps")[1].split()[0])
    return out


def bench(binary: Path, model: Path, env: dict, a: argparse.Namespace) -> list[dict]:
    argv = [str(binary / "llama-bench"), "-m", str(model), "-p", str(a.prompt), "-n", str(a.gen),
            "-t", ",".join(map(str, a.threads)), "-r", str(a.reps), "-o", "json"]
    out = json.loads(sh(argv, env))
    if a.ubatch:  # U tokens a step, as a server decoding U streams at once: "pp<n>@ub<U>"
        argv = [str(binary / "llama-bench"), "-m", str(model), "-p", str(a.ub_prompt), "-n", "0", "-ub", str(a.ubatch),
                "-b", str(a.ubatch), "-t", ",".join(map(str, a.threads)), "-r", str(a.reps), "-o", "json"]
        out += [{**r, "ubatch": a.ubatch} for r in json.loads(sh(argv, env))]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", type=Path, required=True, help="bin folder of our build (llama-bench)")
    ap.add_argument("--upstream", type=Path, required=True, help="bin folder of the pristine upstream build")
    ap.add_argument("--template", type=Path, required=True, help="GGUF with a llama tokenizer")
    ap.add_argument("--work", type=Path, required=True, help="folder for the files (kept: a rerun reuses them)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the 7B shape (default 4)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pairs", default=",".join(PAIRS), help="OURS:UPSTREAM pairs (apqB: any-precision at B bits)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--passes", type=int, default=2, help="passes over every file, the builds' order alternating")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--bw-mib", type=int, default=2048, help="read-bandwidth buffer (MiB; far above the caches)")
    ap.add_argument("--ubatch", type=int, default=0,
                    help="also time --ub-prompt tokens evaluated U at a time (-ub U -b U): the matrix products of a "
                         "server decoding U streams at once (default 0: not run)")
    ap.add_argument("--ub-prompt", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None, help="also write every sample here")
    a = ap.parse_args()
    a.threads = [int(t) for t in a.threads.split(",")]
    a.work.mkdir(parents=True, exist_ok=True)
    pairs = [p.split(":") for p in a.pairs.split(",")]
    base_env = dict(os.environ)
    ours_env = {**base_env, "LD_LIBRARY_PATH": str(a.ours.parent / "lib") + ":" + base_env.get("LD_LIBRARY_PATH", "")}
    # the runs: (label, build, file, env, apq bits); upstream's files once each
    runs, seen = [], set()
    for o, u in pairs:
        bits = int(o[3:]) if o.startswith("apq") else None
        f = make_file("apq" if bits else o, a)
        runs.append((o, "ours", f, {**ours_env, **({"GGML_EXT_APQ_BITS": str(bits)} if bits else {})}, bits))
        if u not in seen:
            seen.add(u)
            runs.append((u, "upstream", make_file(u, a), base_env, None))
    bw_before = read_bandwidth(a)
    samples: dict[tuple, list[float]] = {}
    for rnd in range(a.passes):
        for label, build, f, env, _ in (runs if rnd % 2 == 0 else list(reversed(runs))):
            print(f"[roofline] pass {rnd + 1}/{a.passes} {build} {label}", file=sys.stderr, flush=True)
            for r in bench(a.ours if build == "ours" else a.upstream, f, env, a):
                test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
                test += f"@ub{r['ubatch']}" if r.get("ubatch") else ""
                samples.setdefault((label, build, test, r["n_threads"]), []).extend(r["samples_ts"])
    bw_after = read_bandwidth(a)
    bw = {t: max(bw_before[t], bw_after[t]) for t in a.threads}
    mb = {label: bytes_per_token(f, bits) / 1e6 for label, _, f, _, bits in runs}
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), [])
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "NEON" if "asimd" in flags else "?"
    print(f"\nmachine: {cpu} ({simd}{', VNNI' if 'avx512_vnni' in flags else ''}), {os.cpu_count()} logical CPUs; "
          f"Llama-2-7B shape, {a.layers} layers; read bandwidth (GB/s, before / after the passes): "
          + ", ".join(f"{t} thread{'s' if t > 1 else ''} {bw_before[t]:.1f} / {bw_after[t]:.1f}" for t in a.threads)
          + f"; {a.passes} passes x llama-bench -r {a.reps}, samples pooled\n")
    ub = f"pp{a.ub_prompt}@ub{a.ubatch}"
    print("| ours | upstream | MB / token (ours, up) | threads | tg t/s ours | tg t/s up | % of bandwidth ours | "
          f"% up | tg ours / up | pp{a.prompt} ours / up |" + (f" {a.ubatch} tokens a step, t/s: ours / up |" if a.ubatch else ""))
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if a.ubatch else ""))
    for o, u in pairs:
        for t in a.threads:
            def m(label, build, test):
                s = samples.get((label, build, test, t))
                return statistics.mean(s) if s else float("nan")
            to, tu = m(o, "ours", f"tg{a.gen}"), m(u, "upstream", f"tg{a.gen}")
            po, pu = m(o, "ours", f"pp{a.prompt}"), m(u, "upstream", f"pp{a.prompt}")
            print(f"| {o} | {u} | {mb[o]:.0f}, {mb[u]:.0f} | {t} | {to:.2f} | {tu:.2f} | "
                  f"{100 * mb[o] * to / 1e3 / bw[t]:.0f} % | {100 * mb[u] * tu / 1e3 / bw[t]:.0f} % | "
                  f"{to / tu:.2f} | {po / pu:.2f} ({po:.1f} / {pu:.1f}) |"
                  + (f" {m(o, 'ours', ub) / m(u, 'upstream', ub):.2f} ({m(o, 'ours', ub):.1f} / {m(u, 'upstream', ub):.1f}) |"
                     if a.ubatch else ""))
    if a.json:
        a.json.write_text(json.dumps({"bandwidth_GBps": {"before": bw_before, "after": bw_after}, "mb_per_token": mb,
                                      "samples": [[*k, v] for k, v in samples.items()]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
