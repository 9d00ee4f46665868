"""`ggml-ext tune`: parameters measured on the GPU. `tune dec`: QDEC's k_chunk and n_tb per linear type for
target slowdowns (ggml_ext.qdec.tune; docs/QDEC.md "The tuner")."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="WHAT", required=True)
    dec = sub.add_parser("dec", help="QDEC: k_chunk and n_tb per linear type for each target slowdown of "
                                     "decoding, measured with llama-bench on the GPU; writes --dec-config files")
    from ggml_ext.qdec import tune
    tune.add_arguments(dec)


def main(args: argparse.Namespace) -> int:
    from ggml_ext.qdec import tune
    return tune.main(args)
