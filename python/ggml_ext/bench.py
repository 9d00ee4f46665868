"""`ggml-ext bench`: llama-bench of our build (all llama-bench arguments pass through).

``--apq-bits 3,4,8`` (first, before llama-bench's own arguments) runs llama-bench once per precision of an
any-precision file (GGML_EXT_APQ_BITS: llama-bench does not parse --apq-bits itself), so tokens/s can be
read off per precision; `ggml-ext perplexity --apq-bits B` gives the matching quality.
"""
from __future__ import annotations

import argparse
import os

from . import tools


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="[--apq-bits B[,B...]] llama-bench arguments, e.g. -m FILE -p 512 -n 128 -t 1,2")


def split_apq_bits(args: list[str]) -> tuple[list[int], list[str]]:
    """(precisions asked for with --apq-bits B[,B...] / --apq-bits=..., the other arguments)."""
    bits: list[int] = []
    rest: list[str] = []
    it = iter(args)
    for a in it:
        if a == "--apq-bits" or a.startswith("--apq-bits="):
            v = a.split("=", 1)[1] if "=" in a else next(it, "")
            try:
                bits += [int(b) for b in v.split(",")]
            except ValueError:
                raise SystemExit(f"error: --apq-bits takes precisions like 3,4,8, not {v!r}") from None
        elif a != "--":
            rest.append(a)
    return bits, rest


def main(args: argparse.Namespace) -> int:
    bits, rest = split_apq_bits(args.args)
    if not bits:
        return tools.exec_tool("llama-bench", rest)
    rc = 0
    for b in bits:
        print(f"# --apq-bits {b}", flush=True)
        os.environ["GGML_EXT_APQ_BITS"] = str(b)
        rc = tools.exec_tool("llama-bench", rest) or rc
    return rc
