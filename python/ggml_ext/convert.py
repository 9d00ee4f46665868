"""`ggml-ext convert`: a Hugging Face model folder -> a GGUF file our llama.cpp and stock llama.cpp run.

    ggml-ext convert HF_DIR -o OUT.gguf --type q8_0
    ggml-ext convert HF_DIR -o OUT.gguf --type q4_0 --keep 'blk.*.ffn_down.weight=q8_0'

From Python (this module is callable, so ``ggml_ext.convert(...)`` works too)::

    import ggml_ext
    ggml_ext.convert("hf-folder", "model.gguf", "f16")

Types: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, the K-quants q2_k .. q6_k ("pure" files; ggml-ext's quantizer;
``--imatrix FILE`` for importance weights), and ggml-ext's interleaved
q4_0_4_4, q4_0_4_8, q4_0_8_8 (run by our build only; per-tensor policy in
``docs/CONVERT.md`` and :mod:`ggml_ext.converters.policy`). ``--method NAME`` picks the
quantization method by name from :mod:`ggml_ext.methods` (default ``rtn``, the type's own
quantizer; ``gptq``: GPTQ over the layers, calibrated on ``--calib TEXT``, see docs/GPTQ.md). Errors print ``error: ...`` and exit 1, leaving no output file.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import types

from . import methods as _methods
from .converters import policy as _policy

__all__ = ["convert", "options", "add_arguments", "main"]

#: --type values: the converter's output types (converters.policy.OUTPUT_TYPES, whose interleaved rows
#: come from the format registry)
TYPES = tuple(_policy.OUTPUT_TYPES)


def convert(model_dir: str | os.PathLike, output: str | os.PathLike, type: str | None = None, **kwargs):  # noqa: A002
    """Convert a Hugging Face folder to GGUF: ``ggml_ext.convert(d, out, "q4_0", method="gptq", ...)``, each
    keyword a field of :class:`ggml_ext.converters.ConvertOptions` (or ``options=ConvertOptions(...)``); see
    :func:`ggml_ext.converters.convert`."""
    from ggml_ext.converters import convert as _convert
    return _convert(model_dir, output, type, **kwargs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", metavar="HF_DIR", help="Hugging Face model folder (config.json, weights, tokenizer)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.gguf", help="file to write")
    p.add_argument("--type", default=None, choices=TYPES, type=str.lower,
                   help="output type (default f16; q8_0 for the matrices anyprec leaves alone); norms and other "
                        "1-D tensors stay f32")
    p.add_argument("--keep", action="append", default=[], metavar="PATTERN=TYPE",
                   help="type for the weight matrices whose GGUF name matches the glob PATTERN "
                        "(e.g. 'blk.*.attn_v.weight=q8_0'); repeatable, first match wins")
    p.add_argument("--imatrix", default=None, metavar="FILE",
                   help="importance matrix from llama-imatrix / `ggml-ext imatrix` (GGUF or legacy .dat): "
                        "used for every quantized matrix, as llama-quantize --imatrix")
    p.add_argument("--method", default=None, choices=_methods.available(),
                   help="quantization method for the quantized matrices (default rtn; act-importance for the "
                        "codebook types cb2/cb2_m/cb3/cb3_m without --imatrix): "
                        + "; ".join(f"{n}: {h}" for n, h in _methods.describe().items()))
    p.add_argument("--iq4-nl-weighting", default="default",
                   choices=("default", "one", "x2", "sqrt_s2x2", "s2x2"),
                   help="what each weight's IQ4_NL error is multiplied by, besides the imatrix (default: sqrt_s2x2); "
                        "an option of --method rtn")
    p.add_argument("--calib", default=None, metavar="TEXT",
                   help="calibration text (a file, or an asset name) for methods that calibrate, e.g. gptq, "
                        "act-importance (the codebook types' importance) "
                        "(default: the wiki-train asset)")
    p.add_argument("--calib-samples", type=int, default=None, metavar="N",
                   help="calibration samples (default 64)")
    p.add_argument("--calib-seq-len", type=int, default=None, metavar="L",
                   help="tokens per calibration sample (default 512)")
    p.add_argument("--device", default="cpu",
                   help="where calibrating methods run the layers and their own work (cpu, cuda, cuda:1; default cpu)")
    p.add_argument("--bits", default=None, metavar="S-P",
                   help="anyprec: seed and parent precisions, one file serving each of S..P bits (default 3-8)")
    p.add_argument("--percdamp", type=float, default=None,
                   help="gptq: damping, a fraction of the Hessian's mean diagonal (default 0.1; ooc: 0.01)")
    p.add_argument("--gptq-scales", choices=("dynamic", "static"), default=None,
                   help="gptq: a block's scales fixed before the sweep as llama-quantize --imatrix would write them "
                        "(static, default) or chosen when the sweep reaches it from the updated weights "
                        "(dynamic; ooc always; docs/GPTQ.md)")
    p.add_argument("--gptq-v-hessian", choices=("input", "attention"), default=None,
                   help="gptq: v_proj's Hessian, of the attention output it feeds, per kv head (attention, default) "
                        "or of its inputs like every matrix (input; docs/GPTQ.md)")
    p.add_argument("--gptq-k-hessian", choices=("input", "attention"), default=None,
                   help="gptq: k_proj's Hessian, of its inputs (input, default) or key-weighted by the queries and "
                        "attention that read each key, per kv head (attention; docs/GPTQ.md)")
    p.add_argument("--gptq-shrink", type=float, default=None, metavar="ALPHA",
                   help="gptq: scale the Hessian's off-diagonal by 1 - ALPHA (0: GPTQ, default; 1: the imatrix quantizer)")
    p.add_argument("--ooc-h", type=int, default=None, metavar="BITS",
                   help="ooc: bits of the clear columns (default 8); the matrix's own bits l are --type's")
    p.add_argument("--ooc-p", type=float, default=None, metavar="FRAC",
                   help="ooc: fraction of the clear group's columns kept at h bits in the side-car (default 0.1)")
    p.add_argument("--ooc-s", type=float, default=None, metavar="FRAC",
                   help="ooc: fraction of each matrix's 128-column groups scanned as clear-group candidates, "
                        "the most salient first (default 0.1; docs/GPTQ.md, OOC)")
    p.add_argument("--pre-tokenizer", default=None, metavar="NAME",
                   help="tokenizer.ggml.pre for a byte-level BPE tokenizer, instead of detecting it (for one "
                        "ggml-ext does not recognise, whose splitting matches llama.cpp's NAME, e.g. llama-bpe)")
    p.add_argument("--force", action="store_true", help="replace OUT.gguf if it exists")
    p.add_argument("--name", default=None, help="general.name (default: from config.json or the folder name)")
    p.add_argument("-t", "--threads", type=int, default=None, help="quantization threads (default: all cores)")
    p.add_argument("--vocab-only", action="store_true", help="write the tokenizer and metadata only")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _method_options(args: argparse.Namespace) -> dict:
    """The options of calibrating methods given on the command line (gptq: --percdamp, --device)."""
    opts: dict = {}
    if args.method in ("gptq", "ooc"):
        opts["device"] = args.device
        if args.percdamp is not None:
            opts["percdamp"] = args.percdamp
        if getattr(args, "gptq_scales", None) is not None:
            opts["scale_rule"] = args.gptq_scales
    else:  # refused by the method's option check, naming it
        if args.percdamp is not None:
            opts["percdamp"] = args.percdamp
        if getattr(args, "gptq_scales", None) is not None:
            opts["scale_rule"] = args.gptq_scales
    for flag, key in (("gptq_v_hessian", "v_hessian"), ("gptq_k_hessian", "k_hessian"), ("gptq_shrink", "shrink"),
                      ("ooc_h", "h"), ("ooc_p", "p"), ("ooc_s", "s")):
        if getattr(args, flag, None) is not None:   # refused by the other methods' option check, naming it
            opts[key] = getattr(args, flag)
    if args.bits is not None:
        opts["bits"] = args.bits  # anyprec's; refused by the other methods' option check
    return opts


def options(args: argparse.Namespace, **callbacks):
    """The :class:`~ggml_ext.converters.ConvertOptions` the flags ``args`` ask for (``callbacks``: progress, warn)."""
    from ggml_ext.converters import ConvertOptions
    return ConvertOptions(type=args.type, keep=args.keep, force=args.force, name=args.name, threads=args.threads,
                          vocab_only=args.vocab_only, imatrix=args.imatrix, method=args.method,
                          iq4_nl_weighting=args.iq4_nl_weighting, pre_tokenizer=args.pre_tokenizer,
                          method_options=_method_options(args), calib=args.calib, calib_samples=args.calib_samples,
                          calib_seq_len=args.calib_seq_len, calib_device=args.device, calib_progress=not args.quiet,
                          **callbacks)


def main(args: argparse.Namespace) -> int:
    from ggml_ext.converters import ConversionError

    def warn(msg: str) -> None:
        print(f"warning: {msg}", file=sys.stderr)

    bar = None
    if not args.quiet:
        from tqdm import tqdm
        bar = tqdm(total=0, unit="w", unit_scale=True, desc="converting", file=sys.stderr, leave=False,
                   disable=None, dynamic_ncols=True)

    def progress(done: int, total: int, name: str) -> None:
        if bar is None:
            return
        if bar.total != total:
            bar.total = total
        bar.set_postfix_str(name, refresh=False)
        bar.update(done - bar.n)

    # SIGTERM/SIGHUP (kill, timeout, a closed terminal) take the Ctrl-C path, so the temp file is removed too
    received: list[int] = []

    def on_signal(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    stops = [getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    try:
        previous = {s: signal.signal(s, on_signal) for s in stops}
    except ValueError:  # not the main thread: leave the handlers alone
        previous = {}
    try:
        result = convert(args.model_dir, args.output, options=options(args, progress=progress, warn=warn))
    except ConversionError as e:
        if bar is not None:
            bar.close()
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # disk full, I/O error: the writer has removed its temp file
        if bar is not None:
            bar.close()
        print(f"error: {e.filename or args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        print("interrupted; nothing was written", file=sys.stderr)
        return 128 + received[0] if received else 130
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if bar is not None:
        bar.close()
    print(result)
    return 0


class _CallableModule(types.ModuleType):
    """Lets ``ggml_ext.convert(...)`` call :func:`convert` although ``ggml_ext.convert`` is this module."""

    def __call__(self, *args, **kwargs):
        return convert(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    _p = argparse.ArgumentParser(prog="ggml-ext convert", description=__doc__.split("\n")[0])
    add_arguments(_p)
    sys.exit(main(_p.parse_args()))
