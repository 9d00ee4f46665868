"""QDEC's parameter tuner (the paper's Sec. 4.5, Fig. 11): k_chunk and n_tb per linear type for a target
slowdown of decoding, measured on the GPU.

    ggml-ext tune dec BASE.gguf --dec SIDE.gguf --target 2.5,5,10,20 [-o OUTDIR]

Every measurement is our CUDA build's llama-bench generating tokens (``-p 0 -n N``, all layers on the GPU)
with the side file given through ``GGML_EXT_DEC`` and the settings through ``GGML_EXT_DEC_K`` /
``GGML_EXT_DEC_NTB`` (the runtime's own path: the graph, the scheduler, DEC_MUL_MAT reading the residuals
zero-copy from pinned host memory); the baseline is the same run without the side file. The slowdown is
``t_dec / t_base - 1`` of the median time per token.

Phase 1 (n_tb): for each candidate ``n_tb_max`` (default: 2, 4, 8, ... up to half the GPU's SMs, the
paper's limit), every type's n_tb is its largest *viable* value not above it (no thread block idle in
the selection, one block per 1024-channel chunk, or in the residual GEMV, one work unit per 32 outputs:
the paper's Appendix A rule on this kernel's units), and k_chunk rises uniformly over all types through
a coarse grid until the largest target is exceeded; the number of steps within each target is counted.
When no n_tb_max allows one step for a target, the type with the smallest matrix is fixed at k_chunk 0
and Phase 1 repeats for that target (the paper: small matrices are the most sensitive). The n_tb_max
with the most steps (ties: the lower slowdown) is kept.

Phase 2 (k_chunk, per target): from the uniform k of Phase 1, each step tries one grid increment of every
type not yet final, alone, orders the types by the time it adds, and takes the increments in that order
while the target holds; a type whose increment breaks the target is final. Until no type can grow.

Writes ``OUTDIR/dec-<target>.json`` per target (``--dec-config`` / ``GGML_EXT_DEC_CONFIG`` read its
``dec_k`` and ``dec_ntb``), ``OUTDIR/tune.json`` (every measurement, the Phase-1 curves, the choices)
and prints a table. Refuses without a GPU (llama-bench lists no CUDA device).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import CHUNK
from .calibration import DecError

TYPES = ("qkv", "o", "gateup", "down")
COARSE = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
FINE = (0, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 256, 384, 512)


def linear_type(name: str) -> str | None:
    for part, t in ((".attn_q.", "qkv"), (".attn_k.", "qkv"), (".attn_v.", "qkv"), (".attn_qkv.", "qkv"),
                    (".attn_output.", "o"), (".ffn_gate.", "gateup"), (".ffn_up.", "gateup"),
                    (".ffn_gate_up.", "gateup"), (".ffn_down.", "down")):
        if part in name:
            return t
    return None


def shapes_by_type(side: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """{type: (M, K)} of the largest matrix of each linear type the side file covers."""
    from ggml_ext.gguf import GGUFError, read_gguf
    try:
        g = read_gguf(side)
    except (GGUFError, OSError) as e:
        raise DecError(f"{side}: not a readable GGUF file ({e})") from None
    if g.kv.get("general.type") != "qdec":
        raise DecError(f"{side}: not a QDEC side file (make one with `ggml-ext calibrate dec`)")
    out: dict[str, tuple[int, int]] = {}
    for t in g.tensors:
        if not t.name.endswith(".dec_scale"):
            continue
        ty = linear_type(t.name)
        M = int(t.shape[0])
        r = next((u for u in g.tensors if u.name == t.name[:-len("dec_scale")] + "dec_r"), None)
        K = int(r.shape[1]) if r is not None else 0
        if ty and (ty not in out or M * K > out[ty][0] * out[ty][1]):
            out[ty] = (M, K)
    if not out:
        raise DecError(f"{side}: no residuals of q/k/v, output, gate/up or down linears")
    return out


def _viable(units: int, n_max: int) -> set[int]:
    """n in 1..n_max such that ceil(units / n) units per block need all n blocks (Appendix A)."""
    out = set()
    for n in range(1, max(1, n_max) + 1):
        per = math.ceil(units / n)
        if math.ceil(units / per) == n:
            out.add(n)
    return out


def viable_ntb(M: int, K: int, n_max: int) -> int:
    """The largest viable n_tb <= n_max for an M x K linear at one token: the union of the selection's
    (blocks over ceil(K/1024) chunks) and the residual GEMV's (over ceil(M/32) units of 32 outputs)."""
    chunks = math.ceil(K / CHUNK)
    units = math.ceil(M / 32)
    cand = _viable(chunks, n_max) | _viable(units, n_max)
    return max(cand) if cand else 1


def spec(values: dict[str, int]) -> str:
    return ",".join(f"{t}={values[t]}" for t in TYPES)


class Bench:
    """Time per generated token of BASE under a QDEC setting, by our llama-bench on the GPU (cached)."""

    def __init__(self, base, side, n_gen=64, reps=5, ngl=99, extra=(), budget_s=None, log=None):
        from ggml_ext import tools
        self.tools = tools
        self.base, self.side = str(base), str(side)
        self.n_gen, self.reps, self.ngl, self.extra = n_gen, reps, ngl, list(extra)
        self.cache: dict[tuple, float] = {}
        self.runs: list[dict] = []
        self.t_end = time.time() + budget_s if budget_s else None
        self.log = log or (lambda s: print(s, file=sys.stderr))

    def check_gpu(self) -> str:
        try:
            p = subprocess.run(self.tools.command("llama-bench", "--list-devices"), capture_output=True, text=True,
                               env=self.tools.tool_env(), timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DecError(f"tune dec: cannot run llama-bench ({e})") from None
        devs = [ln.strip() for ln in (p.stdout + p.stderr).splitlines() if re.match(r"\s*CUDA\d+\s*:", ln)]
        if not devs:
            raise DecError("tune dec measures QDEC on a GPU, and this build's llama-bench lists no CUDA device "
                           "(a CPU-only build, or no GPU here): run it on the GPU machine with the CUDA build "
                           "(GGML_EXT_CUDA=ON; bench/device/device_dec.sh MODE=tune)")
        return devs[0]

    def out_of_time(self) -> bool:
        return self.t_end is not None and time.time() > self.t_end

    def time_per_token(self, k: dict[str, int] | None, ntb: dict[str, int] | None = None) -> float:
        key = None if k is None else (tuple(k[t] for t in TYPES), tuple(ntb[t] for t in TYPES))
        if key in self.cache:
            return self.cache[key]
        env = self.tools.tool_env()
        for v in ("GGML_EXT_DEC", "GGML_EXT_DEC_K", "GGML_EXT_DEC_NTB", "GGML_EXT_DEC_CONFIG"):
            env.pop(v, None)
        if k is not None:
            env.update(GGML_EXT_DEC=self.side, GGML_EXT_DEC_K=spec(k), GGML_EXT_DEC_NTB=spec(ntb))
        cmd = self.tools.command("llama-bench", "-m", self.base, "-p", "0", "-n", str(self.n_gen), "-r",
                                 str(self.reps), "-ngl", str(self.ngl), "-o", "json", *self.extra)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if p.returncode != 0:
            raise DecError(f"llama-bench failed (exit {p.returncode}) for k {key}: {p.stderr.strip()[-800:]}")
        try:
            rows = json.loads(p.stdout)
            samples = [s for r in rows for s in r.get("samples_ns", [])] or [rows[0]["avg_ns"]]
        except (ValueError, KeyError, IndexError, TypeError):
            raise DecError(f"llama-bench printed no JSON result: {p.stdout[-400:]!r}") from None
        t = statistics.median(samples) / 1e9 / self.n_gen
        self.cache[key] = t
        self.runs.append({"k": None if k is None else dict(k), "n_tb": None if ntb is None else dict(ntb),
                          "s_per_token": t, "samples_ns": samples})
        self.log(f"  {'off' if k is None else spec(k) + ' / n_tb ' + spec(ntb)}: {1e6 * t:.1f} us/token")
        return t


def tune(bench: Bench, shapes: dict[str, tuple[int, int]], targets: list[float], ntb_max_list: list[int]) -> dict:
    """The two-phase search; targets in percent. Returns the report (see module doc)."""
    types = [t for t in TYPES if t in shapes]
    base = bench.time_per_token(None)

    def slow(k, ntb) -> float:
        return 100.0 * (bench.time_per_token(k, ntb) / base - 1.0)

    def ntb_for(n_max):
        return {t: (viable_ntb(*shapes[t], n_max) if t in shapes else 0) for t in TYPES}

    tmax = max(targets)
    # Phase 1: per n_tb_max, the uniform-k curve (k 0 for the types in `zero`), until the largest target breaks
    curves: dict[tuple, list] = {}

    def curve(n_max, zero):
        key = (n_max, tuple(sorted(zero)))
        if key not in curves:
            pts = []
            for kc in COARSE:
                if bench.out_of_time():
                    break
                k = {t: (0 if (t in zero or t not in shapes) else kc) for t in TYPES}
                s = slow(k, ntb_for(n_max))
                pts.append((kc, s))
                if s > tmax:
                    break
            curves[key] = pts
        return curves[key]

    by_size = sorted(types, key=lambda t: shapes[t][0] * shapes[t][1])
    chosen = {}
    for target in targets:
        zero: list[str] = []
        best = None
        while True:
            for n_max in ntb_max_list:
                pts = curve(n_max, zero)
                steps = 0
                for _, s in pts:
                    if s > target:
                        break
                    steps += 1
                cand = (steps, -(pts[steps - 1][1] if steps else 0.0), n_max)
                if best is None or cand[:2] > best[:2]:
                    best = cand
            if best[0] > 0 or len(zero) == len(types) - 1 or bench.out_of_time():
                break
            zero.append(by_size[len(zero)])  # the paper: fix the smallest matrix's k at 0, search again
            best = None
        steps, _, n_max = best
        k0 = COARSE[steps - 1] if steps else 0
        k = {t: (0 if (t in zero or t not in shapes) else k0) for t in TYPES}
        ntb = ntb_for(n_max)
        # Phase 2: fine increments, cheapest first, while the target holds
        final = set(zero) | {t for t in TYPES if t not in shapes}
        if steps == 0:
            final = set(TYPES)
        cur = slow(k, ntb) if steps else 0.0
        while len(final) < len(TYPES) and not bench.out_of_time():
            trials = []
            for t in TYPES:
                if t in final:
                    continue
                nxt = next((v for v in FINE if v > k[t]), None)
                if nxt is None:
                    final.add(t)
                    continue
                kt = dict(k)
                kt[t] = nxt
                trials.append((slow(kt, ntb), t, nxt))
            if not trials:
                break
            trials.sort()
            grew = False
            for _, t, nxt in trials:
                kt = dict(k)
                kt[t] = nxt
                s = slow(kt, ntb)
                if s <= target:
                    k, cur, grew = kt, s, True
                else:
                    final.add(t)
            if not grew:
                break
        chosen[target] = {"target_pct": target, "n_tb_max": n_max, "k": k, "n_tb": ntb, "slowdown_pct": cur,
                          "zeroed": zero, "phase1_steps": steps,
                          "complete": not bench.out_of_time()}
    return {"base_s_per_token": base, "shapes": shapes, "targets": chosen,
            "phase1": [{"n_tb_max": n, "zero": list(z), "curve": pts} for (n, z), pts in curves.items()]}


def write_configs(report: dict, outdir: Path, base, side) -> list[Path]:
    from ggml_ext._atomic import write_text
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for target, c in report["targets"].items():
        cfg = {"format": "ggml-ext-dec-config", "version": 1, "target_slowdown_pct": target,
               "measured_slowdown_pct": round(c["slowdown_pct"], 3), "dec_k": spec(c["k"]), "dec_ntb": spec(c["n_tb"]),
               "n_tb_max": c["n_tb_max"], "base": Path(base).name, "side_file": Path(side).name,
               "complete": c["complete"]}
        p = outdir / f"dec-{target:g}.json"
        write_text(p, json.dumps(cfg, indent=1) + "\n")
        paths.append(p)
    write_text(outdir / "tune.json", json.dumps(report, indent=1, default=str) + "\n")
    return paths


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", help="the quantized GGUF the side file was made from")
    p.add_argument("--dec", required=True, help="its QDEC side file (`ggml-ext calibrate dec`)")
    p.add_argument("--target", default="2.5,5,10,20", help="target slowdowns of decoding in percent (default 2.5,5,10,20)")
    p.add_argument("--ntb-max", default=None,
                   help="candidate n_tb_max values (default 2,4,8,16,32,... up to --sms/2)")
    p.add_argument("--sms", type=int, default=132, help="the GPU's SM count (default 132, the H100 SXM)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="tokens generated per llama-bench run (default 64)")
    p.add_argument("-r", "--reps", type=int, default=5, help="llama-bench repetitions per setting (default 5)")
    p.add_argument("--budget-s", type=float, default=None, help="stop searching after this many seconds (partial result)")
    p.add_argument("-o", "--output", default="dec-tune", help="folder for dec-<target>.json and tune.json")


def main(args: argparse.Namespace) -> int:
    try:
        targets = sorted(float(t) for t in args.target.split(",") if t.strip())
        if not targets or any(not (t > 0) for t in targets):
            raise ValueError
    except ValueError:
        print(f"tune dec: --target {args.target!r}: give positive percentages, e.g. 2.5,5,10,20", file=sys.stderr)
        return 2
    try:
        if args.ntb_max:
            ntb_list = [int(v) for v in args.ntb_max.split(",")]
        else:
            ntb_list, v = [], 2
            while v <= max(2, args.sms // 2):
                ntb_list.append(v)
                v *= 2
            if ntb_list[-1] != args.sms // 2 and args.sms // 2 > 2:
                ntb_list.append(args.sms // 2)
        if any(v < 1 for v in ntb_list):
            raise ValueError
    except ValueError:
        print(f"tune dec: --ntb-max {args.ntb_max!r}: give positive integers", file=sys.stderr)
        return 2
    try:
        if not Path(args.base).is_file():
            raise DecError(f"{args.base}: no such file")
        shapes = shapes_by_type(args.dec)
        bench = Bench(args.base, args.dec, n_gen=args.n_gen, reps=args.reps, budget_s=args.budget_s)
        dev = bench.check_gpu()
        print(f"tune dec: {dev}; targets {targets} %; n_tb_max candidates {ntb_list}", file=sys.stderr)
        report = tune(bench, shapes, targets, ntb_list)
        report["device"] = dev
        report["runs"] = bench.runs
        paths = write_configs(report, Path(args.output), args.base, args.dec)
    except DecError as e:
        print(f"tune dec: {e}", file=sys.stderr)
        return 1
    print(f"| target % | measured % | n_tb_max | k_chunk ({', '.join(TYPES)}) | n_tb | config |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (t, c), p in zip(report["targets"].items(), paths):
        print(f"| {t:g} | {c['slowdown_pct']:.2f} | {c['n_tb_max']} | {spec(c['k'])} | {spec(c['n_tb'])} | {p} |")
    print(f"baseline (DEC off): {1e6 * report['base_s_per_token']:.1f} us/token; {len(bench.runs)} llama-bench runs")
    return 0
