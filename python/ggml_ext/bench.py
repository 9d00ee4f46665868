"""`ggml-ext bench`: llama-bench of our build (all llama-bench arguments pass through)."""
from __future__ import annotations

import argparse

from . import tools


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs=argparse.REMAINDER, help="llama-bench arguments, e.g. -m FILE -p 512 -n 128 -t 1,2")


def main(args: argparse.Namespace) -> int:
    return tools.exec_tool("llama-bench", [a for a in args.args if a != "--"])
