"""`ggml-ext calibrate`: the verb, whose actions belong to three packages.

    ggml-ext calibrate stats|ls|rm ...   statistics of the linear layers' inputs, cached (ggml_ext.calibrate.stats)
    ggml-ext calibrate kv HF_DIR -o OUT.gguf   KVQuant's KV cache calibration (ggml_ext.kvquant.calibration)
    ggml-ext calibrate dec BASE.gguf --hf HF_DIR -o OUT.gguf   QDEC residuals + bucket bounds (ggml_ext.qdec.calibration)

The verb lives above :mod:`ggml_ext.calibrate` because the family packages build on the calibration
engine (its text windows, layer stream and Fisher); were the verb inside it, the engine would import them back.
"""
from __future__ import annotations

import argparse

from .calibrate import stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    stats.add_stats_action(sub)
    kv = sub.add_parser("kv", help="KVQuant: Fisher-weighted nuq datatypes and key thresholds of a model's KV "
                                   "cache, saved as a GGUF side file (docs/KVQUANT.md)")
    from .kvquant import calibration as kvquant_calibrate
    kvquant_calibrate.add_arguments(kv)
    dec = sub.add_parser("dec", help="QDEC: 4-bit residuals of a quantized GGUF against the Hugging Face "
                                     "weights and top-k bucket bounds, saved as a GGUF side file (docs/QDEC.md)")
    from .qdec import calibration as qdec_calibrate
    qdec_calibrate.add_arguments(dec)
    stats.add_cache_actions(sub)


def main(args: argparse.Namespace) -> int:
    if args.action == "kv":
        from .kvquant import calibration as kvquant_calibrate
        return kvquant_calibrate.main(args)
    if args.action == "dec":
        from .qdec import calibration as qdec_calibrate
        return qdec_calibrate.main(args)
    return stats.main(args)
