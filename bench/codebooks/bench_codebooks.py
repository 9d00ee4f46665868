#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Codebooks (CB2/CB3)": the recipes' perplexity against llama-quantize's mixes, and the Pareto plots.
"""Perplexity of the codebook types CB2 / CB3 (fake-quantized) beside Q2_K, IQ2_XS, IQ2_S and
Q3_K_S made by llama-quantize with an imatrix, at their bits per weight.

  bench/codebooks/bench_codebooks.py [--models smollm2,gemma3] [--chunks 20] [--imatrix-chunks 32]
                             [--weightings importance,sqrt_s2x2] [--threads N] [--json OUT]

CB2 and CB3 are not ggml types yet (no id, no kernels), so their files are *fake-quantized*:
* the f16 file, its imatrix on wiki-train and the stock files come from bench/interleaved4/bench_iq4_nl_quality.py's
  helpers (same recipes, same cache folder: SmolLM2 from our converter, Gemma-3-270M's f16 from its
  Q4_K_M GGUF; our llama-imatrix; our llama-quantize with --imatrix);
* "CB2 (Q2_K mix)": the Q2_K file with every Q2_K tensor replaced by the F16 values
  dequantize(CB2-quantize(f16 values)) of ggml-ext's C reference, importance = that tensor's imatrix
  row (``--weightings sqrt_s2x2``: times sqrt(sigma2 + x^2), ggml's own Q2_K weighting); the Q2_K mix's other tensors (Q3_K/Q4_K/Q6_K ... as llama.cpp chose them) keep their bytes;
* "CB3 (Q3_K_S mix)": the Q3_K_S file with every Q3_K tensor replaced likewise by CB3 values;
* "CB2+CB3 (Q2_K mix)": the Q2_K file with Q2_K tensors as CB2 and Q3_K tensors as CB3.
The files hold F16 for the replaced tensors (what llama-perplexity runs); their bits per weight are
counted as the codebook types would store them (CB2 78 bytes, CB3 110 bytes per 256 weights), so
"bits/weight" is the size a real CB file of that recipe will have.

At these models' sizes the mixes say little: SmolLM2's rows are 576 weights and Gemma-3-270M's 640,
not multiples of 256, so llama-quantize falls back (Q4_0 / IQ4_NL) on every matrix but ffn_down,
and gives ffn_down Q3_K in its Q2_K mix (no Q2_K tensor at all). Hence the **sweep** (``--sweep``,
on by default): the f16 file with only the layers' matrices whose rows are a multiple of 256
(ffn_down, on both models) quantized, to each of Q2_K, IQ2_XS, IQ2_S, Q3_K (ggml's quantizers
through ``ggml_ext.quants``, real bytes) and CB2, CB3 (fake-quantized to F16), all with the same
imatrix rows: the same tensors, only the type differs; everything else stays F16.

Perplexity: our llama-perplexity on wiki-test, ctx 512, --chunks windows. Prints a markdown table.

``--real`` (now that CB2 / CB3 are ggml types, ids 100 / 101): real files instead of the fake ones --
our converter's recipes (``ggml-ext convert --type cb2 | cb2_m | cb3 | cb3_m --imatrix IM`` of the
model's HF folder, the same imatrix as llama-quantize's), perplexity by our llama-perplexity, beside
the **pristine upstream build's** (``make upstream``; ours when it is missing) llama-quantize Q2_K,
Q3_K_S, Q3_K_M, IQ2_XS, IQ2_S, IQ3_XS and the Q8_0 reference of the f16 file with that imatrix,
perplexity by upstream's llama-perplexity; the f16 file in both builds (they must agree). The imatrix
is wiki-train, the codebook converter's default calibration text. Bits per weight are the file's own:
sum of the tensors' stored bytes x 8 / their weights, over all tensors and over the layers' matrices
(blk.*, 2-D); ``--plot PNG`` draws perplexity against the latter (the Pareto view).
``--speed``: llama-bench pp/tg (``--bench-args``) of the cb2 file, Q2_K and IQ2_S in our build, and
Q2_K / IQ2_S in the pristine upstream build when it is there.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("bench", "interleaved4")))
sys.path.insert(0, str(Path(__file__).resolve().parents[2].joinpath("scripts")))
import bench_iq4_nl_quality as base  # noqa: E402
from default_models import cached, source, tool  # noqa: E402

from ggml_ext import assets, codebooks, tools  # noqa: E402
from ggml_ext.calibrate import imatrix  # noqa: E402
from ggml_ext.gguf import read_gguf  # noqa: E402
from ggml_ext.gguf.writer import GGUFWriter  # noqa: E402

F16_ID = 1
STOCK = ("Q2_K", "IQ2_XS", "IQ2_S", "Q3_K_S")
#: recipe name -> (template file type, {stock tensor type replaced: codebook bits})
RECIPES = {
    "CB2 (Q2_K mix)": ("Q2_K", {"Q2_K": 2}),
    "CB2+CB3 (Q2_K mix)": ("Q2_K", {"Q2_K": 2, "Q3_K": 3}),
    "CB3 (Q3_K_S mix)": ("Q3_K_S", {"Q3_K": 3}),
}


def fake_file(model: str, recipe: str, f16: Path, template: Path, im: Path, weighting: str,
              threads: int | None) -> Path:
    ftype, replace = RECIPES[recipe]
    code = [Path(codebooks.__file__), Path(__file__).resolve()]
    rec = {"model": model, "type": recipe, **tool("ggml_ext.codebooks", code),
           "tables_version": codebooks.tables_version(), "imatrix": source(im), "source": source(f16),
           "template": source(template)}
    if weighting != "importance":  # (the first runs' recipes had no weighting key: their files stay valid)
        rec["weighting"] = weighting
    stem = f"{model}-" + recipe.split(" ")[0].replace("+", "-") + f"-{ftype}-mix"
    stem += "" if weighting == "importance" else f"-{weighting}"
    what = (f"{template.name} with " + ", ".join(f"{k} tensors as CB{b}" for k, b in replace.items())
            + f" (fake-quantized to F16 from {f16.name}, imatrix {im.name}, weighting {weighting})")
    return cached(stem, what, rec, lambda out: _fake(f16, template, out, im, replace, weighting, threads),
                  base.work_dir())


def _fake(f16: Path, template: Path, out: Path, im: Path, replace: dict[str, int], weighting: str,
          threads: int | None) -> None:
    src, tpl = read_gguf(f16), read_gguf(template)
    imx = imatrix.load(im)
    w = GGUFWriter(out, force=True)
    for key, value in tpl.kv.items():
        if key != "general.alignment":
            w.add(key, tpl.kv_types[key], value)
    for t in tpl.tensors:
        if t.type_name in replace:
            w.add_tensor_info(t.name, t.shape, F16_ID, t.n_elements * 2)
        else:
            w.add_tensor_info(t.name, t.shape, t.type_id, t.nbytes)
    t0 = time.time()
    with w, open(f16, "rb") as fs, open(template, "rb") as ft:
        for t in tpl.tensors:
            if t.type_name in replace:
                s = src.tensor(t.name)
                fs.seek(s.file_offset)
                dtype = {"F16": np.float16, "F32": np.float32}[s.type_name]
                rows = np.frombuffer(fs.read(s.nbytes), dtype=dtype).astype(np.float32).reshape(-1, s.shape[0])
                y = codebooks.fake_quantize(rows, replace[t.type_name], imx.for_tensor(t.name, s.shape[0]),
                                            threads=threads, name=t.name, weighting=weighting)
                w.write_tensor(y.astype(np.float16))
            else:
                ft.seek(t.file_offset)
                w.write_tensor(ft.read(t.nbytes))
    print(f"# {out.name}: fake-quantized in {time.time() - t0:.0f} s", file=sys.stderr)


SWEEP = ("Q2_K", "IQ2_XS", "IQ2_S", "Q3_K", "CB2", "CB3")
#: sweep types beyond SWEEP: the codebook types with the quantizer's other weighting
SWEEP_EXTRA = ("CB2:sqrt_s2x2", "CB3:sqrt_s2x2")


def sweep_targets(g) -> list:
    """The layers' matrices whose rows are a multiple of 256 (what both the K-quants and CB types take)."""
    return [t for t in g.tensors if t.name.startswith("blk.") and len(t.shape) == 2 and t.shape[0] % 256 == 0]


def sweep_file(model: str, f16: Path, im: Path, ttype: str, threads: int | None) -> Path:
    code = [Path(codebooks.__file__), Path(__file__).resolve()]
    rec = {"model": model, "type": f"sweep-{ttype}", **tool("ggml_ext.quants", code),
           "tables_version": codebooks.tables_version(), "imatrix": source(im), "source": source(f16)}
    what = f"{f16.name} with its 256-divisible block matrices as {ttype} (imatrix {im.name}), the rest F16"
    return cached(f"{model}-sweep-{ttype.replace(':', '-')}", what, rec, lambda out: _sweep(f16, out, im, ttype, threads),
                  base.work_dir())


def _sweep(f16: Path, out: Path, im: Path, ttype: str, threads: int | None) -> None:
    from ggml_ext import quants
    src, imx = read_gguf(f16), imatrix.load(im)
    targets = {t.name for t in sweep_targets(src)}
    w = GGUFWriter(out, force=True)
    for key, value in src.kv.items():
        if key != "general.alignment":
            w.add(key, src.kv_types[key], value)
    ttype, _, weighting = ttype.partition(":")
    cb_bits = {"CB2": 2, "CB3": 3}.get(ttype)
    for t in src.tensors:
        if t.name not in targets:
            w.add_tensor_info(t.name, t.shape, t.type_id, t.nbytes)
        elif cb_bits:
            w.add_tensor_info(t.name, t.shape, F16_ID, t.n_elements * 2)
        else:
            w.add_tensor_info(t.name, t.shape, quants.type_id(ttype), t.n_rows * quants.row_size(ttype, t.shape[0]))
    t0 = time.time()
    with w, open(f16, "rb") as fs:
        for t in src.tensors:
            fs.seek(t.file_offset)
            data = fs.read(t.nbytes)
            if t.name not in targets:
                w.write_tensor(data)
                continue
            dtype = {"F16": np.float16, "F32": np.float32}[t.type_name]
            rows = np.frombuffer(data, dtype=dtype).astype(np.float32).reshape(-1, t.shape[0])
            imp = imx.for_tensor(t.name, t.shape[0])
            if cb_bits:
                w.write_tensor(codebooks.fake_quantize(rows, cb_bits, imp, threads=threads, name=t.name,
                                                       weighting=weighting or "importance").astype(np.float16))
            else:
                w.write_tensor(quants.quantize(rows, ttype, imatrix=imp, threads=threads))
    print(f"# {out.name}: {len(targets)} tensors as {ttype} in {time.time() - t0:.0f} s", file=sys.stderr)


def sweep_bpw(path: Path, ttype: str) -> tuple[float, float]:
    """Bits per weight of the swept tensors (as the type stores them) and their share of the block weights."""
    g = read_gguf(path)
    ts = sweep_targets(g)
    n = sum(t.n_elements for t in ts)
    blk = sum(t.n_elements for t in g.tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    if ttype.startswith("CB"):
        bpw = codebooks.bits_per_weight(int(ttype[2]))
    else:
        bpw = sum(t.nbytes for t in ts) * 8 / n
    return bpw, n / blk


def counted_bpw(path: Path, as_cb: dict[str, int] | None) -> tuple[float, float]:
    """Bits per weight of all tensors and of the layers' matrices, the replaced tensors counted at
    their codebook type's size (as_cb: template's replaced type -> bits) rather than as F16."""
    g, n_all, b_all, n_blk, b_blk = read_gguf(path), 0, 0, 0, 0
    tpl_types = {}
    if as_cb:
        tpl_types = {t.name: t.type_name for t in read_gguf(as_cb["__template__"]).tensors}
    for t in g.tensors:
        nbytes = t.nbytes
        ttype = tpl_types.get(t.name)
        if as_cb and ttype in as_cb:
            nbytes = t.n_elements // codebooks.QK * codebooks.BLOCK_BYTES[as_cb[ttype]]
        n_all += t.n_elements
        b_all += nbytes
        if t.name.startswith("blk.") and len(t.shape) == 2:
            n_blk += t.n_elements
            b_blk += nbytes
    return b_all * 8 / n_all, b_blk * 8 / n_blk


REAL_STOCK = ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ2_XS", "IQ2_S", "IQ3_XS")
REAL_RECIPES = ("cb2", "cb2_m", "cb3", "cb3_m")
#: the perplexity runs' order: each codebook recipe beside its peers first, so a cut run has the comparisons
REAL_ORDER = ("cb2", "cb2_m", "Q2_K", "IQ2_S", "IQ2_XS", "cb3", "cb3_m", "Q3_K_S", "Q3_K_M", "IQ3_XS", "Q8_0")
HF = {"smollm2": "smollm2-hf", "gemma3": "gemma3-hf"}


def upstream_bin() -> Path | None:
    """The pristine pinned llama.cpp's bin folder (``make upstream``), or None when it was not built."""
    import fetch_llama_cpp
    b = fetch_llama_cpp.cache_root() / f"upstream-{fetch_llama_cpp.COMMIT}" / "bin"
    return b if (b / "llama-quantize").is_file() and (b / "llama-perplexity").is_file() else None


def upstream_env(b: Path) -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": str(b)}


def quantize_upstream(model: str, f16: Path, ftype: str, im: Path, threads: int | None) -> Path:
    """The pristine upstream build's llama-quantize of the f16 file with --imatrix im (the stock baseline:
    ggml's quantizers and llama.cpp's mix exactly as shipped). Keyed by the binaries' sha256."""
    import subprocess
    from default_models import sha256_file
    import fetch_llama_cpp
    b = upstream_bin()
    bins = [b / "llama-quantize", *sorted(b.glob("lib*.so"))]
    recipe = {"model": model, "type": ftype, "tool": "llama-quantize", "build": f"upstream-{fetch_llama_cpp.COMMIT}",
              "binaries": {p.name: sha256_file(p) for p in bins}, "args": [ftype], "imatrix": source(im),
              "source": source(f16)}

    def make(out: Path) -> None:
        from ggml_ext import _atomic
        with _atomic.output_path(out) as tmp:
            cmd = [str(b / "llama-quantize"), "--imatrix", str(im), str(f16), str(tmp), ftype,
                   *([str(threads)] if threads else [])]
            r = subprocess.run(cmd, env=upstream_env(b), capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")

    return cached(f"{model}-{ftype}-imatrix-upstream",
                  f"pristine upstream llama-quantize {ftype} of {f16.name} with --imatrix {im.name}", recipe, make,
                  base.work_dir())


def cb_file(model: str, recipe: str, im: Path, threads: int | None) -> Path:
    """Our converter's codebook recipe of the model's HF folder with the imatrix ``im``."""
    import ggml_ext
    from ggml_ext import converters
    hf = assets.path(HF[model])
    root = Path(converters.__file__).resolve().parent
    code = [Path(codebooks.__file__), *sorted(root.glob("*.py")), Path(__file__).resolve()]
    rec = {"model": model, "type": recipe, **tool("ggml_ext.quants", code), "tables_version": codebooks.tables_version(),
           "imatrix": source(im), "source": source(hf)}

    def make(out: Path) -> None:
        t0 = time.time()
        ggml_ext.convert(hf, out, recipe, imatrix=im, threads=threads, force=True)
        print(f"# {model} {recipe}: converted in {time.time() - t0:.0f} s", file=sys.stderr)

    return cached(f"{model}-{recipe}-imatrix", f"ggml-ext convert --type {recipe} --imatrix {im.name} of {hf.name}",
                  rec, make, base.work_dir())


def plot(results: list[dict], out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'ggml-ext[bench]' (or matplotlib)") from None
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["model"] for r in results})
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = [r for r in results if r["model"] == model and r["quant"] != "f16" and not r["quant"].startswith("Q8_0")]
        q8 = next((r for r in results if r["model"] == model and r["quant"].startswith("Q8_0")), None)
        f16 = next((r for r in results if r["model"] == model and r["quant"] == "f16"), None)
        # files of one recipe's types (e.g. cb2_m and cb3 on a model where only ffn_down takes them) land on
        # the same point: one label per point, naming them all
        points: dict[tuple, list[dict]] = {}
        for r in rows:
            points.setdefault((round(r["bpw_blk"], 4), round(r["ppl"], 4)), []).append(r)
        for (x, y), rs in points.items():
            for cb in (True, False):
                names = [r["quant"].split(" ")[0] for r in rs if r["quant"].startswith("cb") == cb]
                if not names:
                    continue
                ax.errorbar(x, y, yerr=rs[0]["stderr"], fmt="o" if cb else "s", color="tab:red" if cb else "tab:blue",
                            capsize=2, alpha=0.8)
                ax.annotate(" = ".join(names), (x, y), textcoords="offset points", fontsize=8, va="center",
                            xytext=(-7, 0) if cb else (7, 0), ha="right" if cb else "left",
                            color="tab:red" if cb else "tab:blue")
        if f16:
            ax.axhline(f16["ppl"], color="gray", ls="--", lw=0.8, label=f"f16 {f16['ppl']:.2f}")
        if q8:
            ax.axhline(q8["ppl"], color="gray", ls=":", lw=0.8, label=f"Q8_0 {q8['ppl']:.2f} ({q8['bpw_blk']:.2f} bpw)")
        if f16 or q8:
            ax.legend(loc="upper right", fontsize=8)
        ax.set_xlabel("bits per weight of the layers' matrices (as stored)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_ylabel("perplexity (wiki-test, log scale)")
        ax.set_title(f"{model}: CB recipes (red) vs llama-quantize + imatrix (blue)", fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def speed(files: dict[str, Path], bench_args: list[str], threads: int | None) -> list[dict]:
    """llama-bench of each file in our build, and of the stock ones in the pristine upstream build."""
    import subprocess
    import fetch_llama_cpp
    up = fetch_llama_cpp.cache_root() / f"upstream-{fetch_llama_cpp.COMMIT}" / "bin" / "llama-bench"
    rows = []
    for label, p in files.items():
        builds = [("ours", tools.command("llama-bench"), tools.tool_env())]
        if not label.startswith("cb") and up.is_file():
            builds.append(("upstream", [str(up)], {**os.environ, "LD_LIBRARY_PATH": str(up.parent)}))
        for build, cmd, env in builds:
            args = [*cmd, "-m", str(p), "-o", "json", *bench_args, *(["-t", str(threads)] if threads else [])]
            r = subprocess.run(args, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"llama-bench failed:\n{r.stderr[-2000:]}")
            for t in json.loads(r.stdout):
                test = f"pp{t['n_prompt']}" if t["n_prompt"] else f"tg{t['n_gen']}"
                rows.append({"file": label, "build": build, "test": test, "t_s": t["avg_ts"], "stddev": t["stddev_ts"]})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--chunks", type=int, default=20, help="perplexity windows of 512 tokens")
    ap.add_argument("--imatrix-chunks", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--weightings", default="importance",
                    help="codebook quantizer error weightings to run, comma separated (importance, sqrt_s2x2)")
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--no-mixes", action="store_true", help="skip llama-quantize's mixes (run the sweep only)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the same-tensors sweep")
    ap.add_argument("--real", action="store_true", help="real CB files from our converter's recipes vs "
                    "llama-quantize's Q2_K, Q3_K_S/M, IQ2_XS/S, IQ3_XS (implies --no-mixes --no-sweep)")
    ap.add_argument("--plot", default=None, metavar="PNG", help="with --real: perplexity vs bits per weight")
    ap.add_argument("--speed", action="store_true", help="with --real: llama-bench of cb2, Q2_K, IQ2_S (first model)")
    ap.add_argument("--bench-args", default="-p 64 -n 16 -r 3", help="llama-bench arguments for --speed")
    ap.add_argument("--sweep-types", default=",".join(SWEEP),
                    help=f"types of the sweep (default: all of {','.join(SWEEP)}; also {','.join(SWEEP_EXTRA)})")
    a = ap.parse_args()
    if a.real:
        a.no_mixes = a.no_sweep = True
    text = assets.path("wiki-test")
    results = []
    speed_rows: list[dict] = []
    for model in a.models.split(","):
        f16 = base.f16_file(model)
        im = base.imatrix_file(model, f16, a.imatrix_chunks, a.threads)
        files = [("f16", f16, None, None)]
        if a.real:
            up = upstream_bin()
            if up is None:
                print("# no pristine upstream build (make upstream): the stock rows use our build", file=sys.stderr)
            quant = (lambda ft: quantize_upstream(model, f16, ft, im, a.threads)) if up else (
                lambda ft: base.quantize_ggml(model, f16, ft, im, a.threads))
            real = {k: cb_file(model, k, im, a.threads) if k in REAL_RECIPES else quant(k) for k in REAL_ORDER}
            if up:  # f16 in both builds: the two llama-perplexity binaries agree on the same file
                files.append(("f16", f16, None, up))
            files += [(k if k in REAL_RECIPES else f"{k} (llama-quantize)", p, None,
                       None if k in REAL_RECIPES else up) for k, p in real.items()]
            if a.speed and not speed_rows:
                speed_rows = speed({"cb2": real["cb2"], "Q2_K": real["Q2_K"], "IQ2_S": real["IQ2_S"]},
                                   a.bench_args.split(), a.threads)
        if not a.no_sweep:
            files += [(f"sweep: {tt}", sweep_file(model, f16, im, tt, a.threads), ("sweep", tt), None) for tt in a.sweep_types.split(",")]
        stock = {} if a.no_mixes else {ft: base.quantize_ggml(model, f16, ft, im, a.threads) for ft in STOCK}
        files += [(f"{ft} (llama-quantize)", p, None, None) for ft, p in stock.items()]
        for weighting in ([] if a.no_mixes else a.weightings.split(",")):
            for recipe, (ftype, replace) in RECIPES.items():
                p = fake_file(model, recipe, f16, stock[ftype], im, weighting, a.threads)
                label = recipe if weighting == "importance" else f"{recipe}, {weighting}"
                files.append((label, p, {**replace, "__template__": stock[ftype]}, None))
        f16_ppl = None
        for label, p, as_cb, up_bin in files:
            t0 = time.time()
            build = "upstream" if up_bin else "ours"
            r = tools.perplexity(p, text, n_ctx=512, chunks=a.chunks, threads=a.threads,
                                 **({"binary": up_bin / "llama-perplexity", "env": {"LD_LIBRARY_PATH": str(up_bin)}}
                                    if up_bin else {}))
            if isinstance(as_cb, tuple):  # a sweep file: bpw of the swept tensors, their share of the block weights
                bpw, bpw_blk = sweep_bpw(p, as_cb[1])
            else:
                bpw, bpw_blk = counted_bpw(p, as_cb)
            f16_ppl = f16_ppl or r.ppl
            row = {"model": model, "quant": label, "build": build, "ppl": r.ppl, "stderr": r.stderr, "ratio_f16": r.ppl / f16_ppl,
                   "bpw": bpw, "bpw_blk": bpw_blk, "n_ctx": r.n_ctx, "chunks": r.n_chunks, "file": p.name,
                   "seconds": round(time.time() - t0, 1)}
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if a.json:  # as it goes: a cut run keeps what it measured
                Path(a.json).write_text(json.dumps({"perplexity": results, "speed": speed_rows}, indent=1))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; wiki-test, ctx 512, {a.chunks} chunks; "
          f"imatrix: wiki-train, {a.imatrix_chunks} x 512 tokens; codebook tables v{codebooks.tables_version()}")
    print("| model | quantization | build (quantize + perplexity) | bits/weight (all / blk matrices; sweep: swept "
          "tensors / their share) | PPL | ratio to f16 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['model']} | {r['quant']} | {r['build']} | {r['bpw']:.3f} / {r['bpw_blk']:.3f} | {r['ppl']:.4f} +/- "
              f"{r['stderr']:.4f} | {r['ratio_f16']:.3f} |")
    if speed_rows:
        print("\n| file | build | test | t/s |")
        print("| --- | --- | --- | --- |")
        for r in speed_rows:
            print(f"| {r['file']} | {r['build']} | {r['test']} | {r['t_s']:.2f} +/- {r['stddev']:.2f} |")
    if a.plot:
        plot(results, Path(a.plot))
    if a.json:
        Path(a.json).write_text(json.dumps({"perplexity": results, "speed": speed_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
