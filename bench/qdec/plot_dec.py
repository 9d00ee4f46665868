#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "QDEC": draws docs/qdec_ppl.png from bench_dec.py's JSON.
"""Plot QDEC's perplexity ladder (docs/qdec_ppl.png) from the --json files of bench/qdec/bench_dec.py.

    python bench/qdec/plot_dec.py OUT.png smollm2.json gemma3.json

One panel per (model, base): perplexity against k_chunk for each selection mode, with the base alone
(k = 0) and the every-channel ceiling as horizontal lines. Needs matplotlib only.
"""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"dynamic": ("C0", "o", "dynamic (bucketed top-k)"), "exact": ("C4", "x", "exact top-k"),
         "static": ("C1", "s", "static (calibration)"), "random": ("C2", "^", "random")}


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, files = sys.argv[1], sys.argv[2:]
    panels = []
    for f in files:
        with open(f) as fh:
            res = json.load(fh)
        for tag, r in res["bases"].items():
            if "base" in r:
                panels.append((res, tag, r))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (res, tag, r) in zip(axes[0], panels):
        for mode, pts in r["table"].items():
            ks = sorted(int(k) for k in pts)
            if not ks:
                continue
            c, mk, label = STYLE.get(mode, ("k", ".", mode))
            ax.plot(ks, [pts[str(k)] for k in ks], color=c, marker=mk, label=label)
        ax.axhline(r["base"], color="grey", ls="--", lw=1, label="base alone (k=0)")
        ax.axhline(r["full"], color="k", ls=":", lw=1, label="every channel (4-bit R)")
        ax.set_xscale("log", base=2)
        ax.set_xticks([8, 16, 32, 64, 128], ["8", "16", "32", "64", "128"])
        ax.set_xlabel("k_chunk (channels per 1024)")
        ax.set_title(f"{res['model']} {tag} ({r['bpw']:.2f} bpw), {res['windows']} x {res['seq_len']}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("perplexity, wiki-test (llama-perplexity windows)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
