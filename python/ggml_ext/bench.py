"""`ggml-ext bench`: llama-bench of our build (all llama-bench arguments pass through).

``--apq-bits 3,4,8`` (first, before llama-bench's own arguments) runs llama-bench once per precision of an
any-precision file (GGML_EXT_APQ_BITS: llama-bench does not parse --apq-bits itself), so tokens/s can be
read off per precision. ``--apq-bits all`` takes every precision the file serves.

The sweep (to pick the point on the size/quality curve): with ``--ppl TEXT`` (and optionally ``--ppl-ctx``,
``--ppl-chunks``, ``--json OUT``, ``--plot OUT.png``) each precision also gets its perplexity on TEXT (our
llama-perplexity, `ggml-ext perplexity`'s method), and one table comes out: bits, the bytes the precision
reads, bits per weight, prompt and generation tokens/s (llama-bench's mean), perplexity.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from . import tools

SWEEP_OPTIONS = {"--ppl": str, "--ppl-ctx": int, "--ppl-chunks": int, "--json": str, "--plot": str}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="[--apq-bits B[,B...]|all] [--ppl TEXT [--ppl-ctx N] [--ppl-chunks N] [--json OUT] "
                        "[--plot OUT.png]] llama-bench arguments, e.g. -m FILE -p 512 -n 128 -t 1,2")


def split_apq_bits(args: list[str]) -> tuple[list[int], list[str]]:
    """(precisions asked for with --apq-bits B[,B...] / --apq-bits=..., the other arguments); ``all`` is -1."""
    bits: list[int] = []
    rest: list[str] = []
    it = iter(args)
    for a in it:
        if a == "--apq-bits" or a.startswith("--apq-bits="):
            v = a.split("=", 1)[1] if "=" in a else next(it, "")
            if v == "all":
                bits.append(-1)
                continue
            try:
                bits += [int(b) for b in v.split(",")]
            except ValueError:
                raise SystemExit(f"error: --apq-bits takes precisions like 3,4,8 or all, not {v!r}") from None
        elif a != "--":
            rest.append(a)
    return bits, rest


def split_sweep(args: list[str]) -> tuple[dict, list[str]]:
    """(the sweep's own options, the llama-bench arguments)."""
    opts: dict = {}
    rest: list[str] = []
    it = iter(args)
    for a in it:
        name, eq, v = a.partition("=")
        if name in SWEEP_OPTIONS:
            v = v if eq else next(it, None)
            if v is None:
                raise SystemExit(f"error: {name} needs a value")
            try:
                opts[name[2:].replace("-", "_")] = SWEEP_OPTIONS[name](v)
            except ValueError:
                raise SystemExit(f"error: {name} takes a number, not {v!r}") from None
        else:
            rest.append(a)
    return opts, rest


def _model(rest: list[str]) -> str:
    for i, a in enumerate(rest):
        if a in ("-m", "--model") and i + 1 < len(rest):
            if "," in rest[i + 1]:
                raise SystemExit("error: the sweep takes one model (-m FILE)")
            return rest[i + 1]
    raise SystemExit("error: the sweep needs -m FILE (an any-precision GGUF)")


def _llama_bench_json(rest: list[str], bits: int) -> list[dict]:
    """llama-bench's JSON records at one precision (its own -o is replaced by -o json)."""
    args, skip = [], False
    for a in rest:
        if skip:
            skip = False
        elif a in ("-o", "--output"):
            skip = True
        else:
            args.append(a)
    env = {**tools.tool_env(), "GGML_EXT_APQ_BITS": str(bits)}
    proc = subprocess.run(tools.command("llama-bench", *args, "-o", "json"), env=env, capture_output=True, text=True,
                          errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"error: llama-bench at --apq-bits {bits} failed (exit {proc.returncode}):\n"
                         + proc.stderr[-2000:])
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"error: llama-bench at --apq-bits {bits} printed no JSON:\n{proc.stdout[-2000:]}") from None


def sweep(model: str, bits: list[int], rest: list[str], opts: dict) -> list[dict]:
    """One row per precision: bytes read, tokens/s of each llama-bench test, perplexity (if asked)."""
    from .anyprec import AnyPrecError
    from .anyprec.extract import open_file, planes_bytes, tables_bytes
    try:
        f = open_file(model)
    except (AnyPrecError, OSError, ValueError) as e:
        raise SystemExit(f"error: {model}: not an any-precision file ({e})") from None
    served = list(range(f.seed, f.parent + 1))
    bits = served if -1 in bits or not bits else bits
    bad = [b for b in bits if b not in served]
    if bad:
        raise SystemExit(f"error: {model} serves precisions {f.seed}..{f.parent}, not {bad}")
    text = opts.get("ppl")
    if text is not None and not Path(text).is_file():
        raise SystemExit(f"error: --ppl: no such text file: {text} (e.g. `ggml-ext assets path wiki-test`)")
    dims = [f.dims(m) for m in f.matrices]
    weights = sum(k * n for k, n in dims)
    rows = []
    for b in bits:
        nbytes = sum(planes_bytes(n, k, b) + tables_bytes(n, b) for k, n in dims)
        row = {"bits": b, "bytes_read": nbytes, "bits_per_weight": nbytes * 8 / weights, "tokens_per_s": {}}
        for rec in _llama_bench_json(rest, b):
            test = (f"pp{rec['n_prompt']}" if rec.get("n_gen", 0) == 0 else
                    f"tg{rec['n_gen']}" if rec.get("n_prompt", 0) == 0 else f"pp{rec['n_prompt']}+tg{rec['n_gen']}")
            row["tokens_per_s"][f"{test} t{rec.get('n_threads')}"] = rec["avg_ts"]
        if text is not None:
            r = tools.perplexity(model, text, n_ctx=opts.get("ppl_ctx", 512), chunks=opts.get("ppl_chunks", 20),
                                 apq_bits=b)
            row["perplexity"], row["perplexity_err"] = r.ppl, r.stderr
        rows.append(row)
        print(f"# --apq-bits {b} done", file=sys.stderr, flush=True)
    return rows


def format_table(rows: list[dict]) -> str:
    tests = list(dict.fromkeys(t for r in rows for t in r["tokens_per_s"]))
    head = ["bits", "MB read", "bits/weight", *[f"{t} t/s" for t in tests]]
    if any("perplexity" in r for r in rows):
        head.append("perplexity")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["bits"]), f"{r['bytes_read'] / 1e6:.1f}", f"{r['bits_per_weight']:.3f}",
                 *[f"{r['tokens_per_s'][t]:.2f}" if t in r["tokens_per_s"] else "" for t in tests]]
        if "perplexity" in r:
            cells.append(f"{r['perplexity']:.4f} +/- {r['perplexity_err']:.4f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("error: --plot needs matplotlib (pip install 'ggml-ext[bench]')") from None
    tg = [t for t in dict.fromkeys(t for r in rows for t in r["tokens_per_s"]) if t.startswith("tg")]
    fig, ax = plt.subplots(figsize=(6, 4))
    if tg and all("perplexity" in r for r in rows):
        xs = [r["tokens_per_s"].get(tg[0]) for r in rows]
        ys = [r["perplexity"] for r in rows]
        ax.plot(xs, ys, "o-")
        for r, x, y in zip(rows, xs, ys):
            ax.annotate(f"{r['bits']} bits", (x, y), textcoords="offset points", xytext=(4, 4))
        ax.set_xlabel(f"{tg[0]} tokens/s")
        ax.set_ylabel("perplexity")
    else:
        key = "perplexity" if all("perplexity" in r for r in rows) else None
        ax.plot([r["bits"] for r in rows],
                [r[key] if key else r["tokens_per_s"].get(tg[0] if tg else next(iter(r["tokens_per_s"])))
                 for r in rows], "o-")
        ax.set_xlabel("bits")
        ax.set_ylabel(key or "tokens/s")
    ax.set_title("one any-precision file: speed vs quality per precision")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    fig.savefig(tmp, dpi=120, format=Path(path).suffix[1:] or "png")
    os.replace(tmp, path)


def main(args: argparse.Namespace) -> int:
    bits, rest = split_apq_bits(args.args)
    opts, rest = split_sweep(rest)
    if opts or -1 in bits:
        rows = sweep(_model(rest), bits, rest, opts)
        print(format_table(rows))
        if "json" in opts:
            from ._atomic import write_json
            write_json(Path(opts["json"]), rows)
        if "plot" in opts:
            plot(rows, opts["plot"])
        return 0
    if not bits:
        return tools.exec_tool("llama-bench", rest)
    rc = 0
    for b in bits:
        print(f"# --apq-bits {b}", flush=True)
        os.environ["GGML_EXT_APQ_BITS"] = str(b)
        rc = tools.exec_tool("llama-bench", rest) or rc
    return rc
