"""`ggml-ext perplexity`: perplexity the way llama-perplexity computes it.

Fixed windows of n_ctx tokens, the second half of each scored. Always report the
context length and the number of tokens with a figure.
"""
from __future__ import annotations

import argparse
import sys

from . import tools
from ._args import int_range


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    p.add_argument("--text", required=True, help="text file (e.g. `ggml-ext assets path wiki-test`)")
    p.add_argument("-c", "--ctx-size", type=int, default=512)
    p.add_argument("--chunks", type=int, default=None, help="score only the first N windows")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--apq-bits", type=int_range(1, 8), default=None, metavar="B",
                   help="precision of an any-precision file (convert --method anyprec; default: its highest)")
    p.add_argument("-v", "--verbose", action="store_true", help="show llama-perplexity's output")


def main(args: argparse.Namespace) -> int:
    try:
        result = tools.perplexity(args.model, args.text, args.ctx_size, args.chunks, args.threads, echo=args.verbose,
                                  apq_bits=args.apq_bits)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(result)
    return 0
