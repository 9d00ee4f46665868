"""``ggml-ext codebooks``: discover codebook tables from model weights, and write the C header.

    ggml-ext codebooks discover MODEL... -o TABLES.json   # Algorithm 1 (default: SmolLM2 + Gemma-3-270M)
    ggml-ext codebooks header TABLES.json -o codebooks_tables.h
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._atomic import write_text as atomic_write_text
from . import discover as disc
from . import builtin as tables

DEFAULT_MODELS = ("smollm2-hf", "gemma3-hf")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    d = sub.add_parser("discover", help="Algorithm 1: k-means of sub-group histograms, then of values per cluster",
                       description="Find the CB2 (4 codebooks x 4 int8 entries) and CB3 (4 x 8) tables from the "
                       "block weights of Hugging Face folders or GGUF files (GGUF blocks are dequantized). "
                       "Seeded: the same inputs, seed and scikit-learn version give the same tables.")
    d.add_argument("models", nargs="*", metavar="MODEL",
                   help="HF model folders or .gguf files (default: the assets " + " and ".join(DEFAULT_MODELS) + ")")
    d.add_argument("-o", "--output", required=True, help="the tables JSON (with inputs' sha256, command, versions, seed)")
    d.add_argument("--max-groups", type=int, default=disc.DEFAULT_MAX_GROUPS,
                   help=f"sub-groups of 16 sampled over all inputs (default {disc.DEFAULT_MAX_GROUPS}: about 20 s for both default models on 2 cores)")
    d.add_argument("--bins", type=int, default=disc.DEFAULT_BINS, help=f"histogram bins (default {disc.DEFAULT_BINS})")
    d.add_argument("--seed", type=int, default=disc.DEFAULT_SEED, help=f"sampling and k-means seed (default {disc.DEFAULT_SEED})")
    d.add_argument("--header", help="also write the C header generated from the tables here")
    h = sub.add_parser("header", help="write the C header (codebooks_tables.h) of a tables JSON")
    h.add_argument("tables", help="a JSON written by `codebooks discover`")
    h.add_argument("-o", "--output", required=True, help="the header to write")


def _default_models() -> list[str]:
    from .. import assets
    return [str(assets.path(name)) for name in DEFAULT_MODELS]


def _command(args: argparse.Namespace, models: list[str]) -> list[str]:
    """The discover command as run, every setting spelled out (defaults included)."""
    cmd = ["ggml-ext", "codebooks", "discover", *models, "-o", args.output, "--max-groups", str(args.max_groups),
           "--bins", str(args.bins), "--seed", str(args.seed)]
    return cmd + (["--header", args.header] if args.header else [])


def main(args: argparse.Namespace) -> int:
    if args.action == "header":
        result = tables.load(args.tables)
        atomic_write_text(Path(args.output), tables.header_text(result, Path(args.tables).name))
        return 0
    models = args.models or _default_models()
    try:
        result = disc.discover(models, max_groups=args.max_groups, bins=args.bins, seed=args.seed,
                               command=_command(args, models), progress=True)
    except disc.DiscoveryError as e:
        print(f"ggml-ext codebooks: {e}", file=sys.stderr)
        return 1
    atomic_write_text(Path(args.output), disc.dumps(result))
    if args.header:
        atomic_write_text(Path(args.header), tables.header_text(result, Path(args.output).name))
    for name, t in result["types"].items():
        print(f"{name}: " + "  ".join(str(b) for b in t["codebooks"]))
    return 0
