"""`ggml-ext info`: what a GGUF file holds, and (--build) what this build is.

    ggml-ext info model.gguf             metadata summary, tensor types, bits per weight
    ggml-ext info model.gguf --tensors   ... and every tensor
    ggml-ext info model.gguf --json      the same, machine-readable
    ggml-ext info --build                the compiled llama.cpp / ggml_ext build
    ggml-ext info --types [--json]       every tensor type, stock and ggml-ext's (the format registry)
    ggml-ext info --types --markdown     README's "Which format?" table (ggml_ext.guide)
    python -m ggml_ext.info model.gguf   same as `ggml-ext info`

A malformed file gives ``error: FILE: <problem> (at byte offset N)`` on
stderr and exit status 1.
"""
from __future__ import annotations

import argparse
import array
import json
import math
import os
import sys
from typing import Any

from .gguf import GGUFError, GGUFFile, read_gguf

__all__ = ["format_info", "info_dict", "add_arguments", "main", "FILE_TYPES"]

#: llama_ftype of the pinned llama.h (general.file_type).
FILE_TYPES: dict[int, str] = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 4: "MOSTLY_Q4_1_SOME_F16 (removed)",
    7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S",
    12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L", 14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M",
    16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 19: "MOSTLY_IQ2_XXS",
    20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS",
    24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M",
    28: "MOSTLY_IQ2_S", 29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M",
    32: "MOSTLY_BF16", 33: "MOSTLY_Q4_0_4_4", 34: "MOSTLY_Q4_0_4_8", 35: "MOSTLY_Q4_0_8_8",
    36: "MOSTLY_TQ1_0", 37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4",
    40: "MOSTLY_Q1_0", 41: "MOSTLY_Q2_0", 1024: "GUESSED",
}

_MAX_VALUE_CHARS = 100


def _is_array(v: Any) -> bool:
    return isinstance(v, (list, array.array))


def _summarise(value: Any, tname: str) -> str:
    """A short display form of a KV value: arrays as '<array of N type>', long strings cut."""
    if _is_array(value):
        inner = tname[len("array["):-1] if tname.startswith("array[") else "?"
        return f"<array of {len(value)} {inner}>"
    if isinstance(value, str):
        r = repr(value)
        if len(r) > _MAX_VALUE_CHARS:
            return r[:_MAX_VALUE_CHARS] + f"... ({len(value)} chars)"
        return r
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _json_value(value: Any, tname: str) -> Any:
    if _is_array(value):
        inner = tname[len("array["):-1] if tname.startswith("array[") else "?"
        return {"array_of": inner, "length": len(value)}
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _summary(g: GGUFFile) -> list[tuple[str, Any]]:
    """(label, value) pairs of the headline metadata, None where absent."""
    kv = g.kv
    arch = kv.get("general.architecture")
    a = arch if isinstance(arch, str) else ""

    def k(suffix: str) -> Any:
        return kv.get(f"{a}.{suffix}") if a else None

    vocab = k("vocab_size")
    if vocab is None and _is_array(kv.get("tokenizer.ggml.tokens")):
        vocab = len(kv["tokenizer.ggml.tokens"])
    return [
        ("architecture", arch),
        ("name", kv.get("general.name")),
        ("context length", k("context_length")),
        ("embedding size", k("embedding_length")),
        ("layers", k("block_count")),
        ("attention heads", k("attention.head_count")),
        ("kv heads", k("attention.head_count_kv")),
        ("vocab size", vocab),
        ("file type", kv.get("general.file_type")),
        ("quantization version", kv.get("general.quantization_version")),
        ("ggml_ext.format_version", kv.get("ggml_ext.format_version")),
    ]


def _display(label: str, v: Any) -> str:
    if _is_array(v):
        return f"<array of {len(v)}>"
    if label == "file type" and isinstance(v, int) and not isinstance(v, bool):
        return f"{v} ({FILE_TYPES.get(v, 'unknown')})"
    return str(v)


def format_info(gguf: GGUFFile, show_tensors: bool = False) -> str:
    """A human-readable report of a GGUF file's metadata and tensor types."""
    g = gguf
    out: list[str] = []
    out.append(f"file:          {g.path}")
    out.append(f"size:          {g.file_size} bytes ({_fmt_bytes(g.file_size)})")
    out.append(f"GGUF version:  {g.version}, alignment {g.alignment}, data at offset {g.data_offset}")
    out.append(f"counts:        {len(g.kv)} metadata keys, {len(g.tensors)} tensors")
    out.append("")
    out.append("summary:")
    for label, v in _summary(g):
        if v is None:
            continue
        out.append(f"  {label + ':':25s} {_display(label, v)}")
    out.append("")

    hist = g.type_histogram()
    out.append("tensor types:")
    if not hist:
        out.append("  (no tensors)")
    else:
        out.append(f"  {'type':12s} {'tensors':>8s} {'bytes':>16s} {'weights':>16s} {'bits/weight':>12s}")
        for s in hist.values():
            out.append(f"  {s.type_name:12s} {s.count:8d} {s.nbytes:16d} {s.n_weights:16d} {s.bits_per_weight:12.4f}")
        out.append(f"  {'total':12s} {len(g.tensors):8d} {g.tensor_bytes:16d} {g.n_weights:16d} "
                   f"{g.bits_per_weight():12.4f}")
    out.append(f"overall bits per weight: {g.bits_per_weight():.4f} "
               f"({g.n_weights} weights in {g.tensor_bytes} bytes, {_fmt_bytes(g.tensor_bytes)})")
    out.append("")
    if "ggml_ext.anyprec.version" in g.kv:
        out.append("any-precision (docs/formats/anyprec.md):")
        out.extend("  " + line for line in _anyprec_report(g).splitlines())
        out.append("")

    if _ooc_weights(g):
        out.append("OOC column side-cars (docs/GPTQ.md, OOC):")
        out.extend("  " + line for line in _ooc_report(g).splitlines())
        out.append("")

    out.append(f"metadata ({len(g.kv)} keys):")
    for key, value in g.kv.items():
        tname = g.kv_types.get(key, "?")
        out.append(f"  {key} [{tname}] = {_summarise(value, tname)}")

    if g.warnings:
        out.append("")
        out.append("warnings:")
        for w in g.warnings:
            out.append(f"  {w}")

    if show_tensors:
        out.append("")
        out.append(f"tensors ({len(g.tensors)}):")
        w = max((len(t.name) for t in g.tensors), default=4)
        for i, t in enumerate(g.tensors):
            shape = "x".join(str(d) for d in t.shape) or "scalar"
            out.append(f"  {i:5d} {t.name:{w}s} {t.type_name:10s} {shape:24s} {t.nbytes:12d} B  @ {t.file_offset}")
    return "\n".join(out) + "\n"


STOCK_REFUSES_OOC = ("stock llama.cpp cannot run this file: its loader finds more tensors than the architecture "
                     "asks for and refuses it (\"wrong number of tensors\"); ggml-ext's llama.cpp loads the "
                     "side-cars with their weights and adds y += S.x[idx] to each weight's matmul")


def _ooc_weights(g: GGUFFile) -> list[str]:
    """The weights that have an OOC side-car (``<w>.ooc_idx``)."""
    return [t.name[:-len(".ooc_idx")] for t in g.tensors if t.name.endswith(".ooc_idx")]


def _ooc_report(g: GGUFFile) -> str:
    ws = _ooc_weights(g)
    by = {t.name: t for t in g.tensors}
    k = sum(by[w + ".ooc_idx"].shape[0] for w in ws)
    h = g.kv.get("ggml_ext.ooc.h")
    p = g.kv.get("ggml_ext.ooc.p")
    s = g.kv.get("ggml_ext.ooc.s")
    params = f"h={h}, p={p:.3g}, s={s:.3g}" if None not in (h, p, s) else "parameters not recorded"
    return (f"{len(ws)} weights with a clear group ({k} clear columns in all; {params})\n"
            f"{STOCK_REFUSES_OOC}\n")


def _anyprec_report(g: GGUFFile) -> str:
    """The precisions an any-precision file serves and the bytes each reads (ggml-ext anyprec info)."""
    from .anyprec import AnyPrecError
    from .anyprec.extract import describe
    try:
        return describe(g.path)
    except (AnyPrecError, OSError) as e:  # OSError: metadata parsed from bytes (no file to read planes from)
        return f"not a usable any-precision file: {e}"


def _anyprec_dict(g: GGUFFile) -> dict[str, Any] | None:
    from .anyprec import AnyPrecError
    from .anyprec.extract import open_file
    try:
        f = open_file(g.path)
    except (AnyPrecError, OSError) as e:
        return {"error": str(e)}
    return {"seed_bits": f.seed, "parent_bits": f.parent, "precisions": list(range(f.seed, f.parent + 1)),
            "matrices": len(f.matrices)}


def info_dict(gguf: GGUFFile, show_tensors: bool = False) -> dict[str, Any]:
    """The --json form of format_info()."""
    g = gguf
    d: dict[str, Any] = {
        "file": g.path,
        "file_size": g.file_size,
        "version": g.version,
        "alignment": g.alignment,
        "data_offset": g.data_offset,
        "n_kv": len(g.kv),
        "n_tensors": len(g.tensors),
        "summary": {label.replace(" ", "_"): (len(v) if _is_array(v) else _json_value(v, ""))
                    for label, v in _summary(g) if v is not None},
        "types": {name: {"id": s.type_id, "tensors": s.count, "bytes": s.nbytes, "weights": s.n_weights,
                         "bits_per_weight": s.bits_per_weight}
                  for name, s in g.type_histogram().items()},
        "file_type_name": (FILE_TYPES.get(g.kv["general.file_type"], "unknown")
                           if isinstance(g.kv.get("general.file_type"), int) else None),
        "tensor_bytes": g.tensor_bytes,
        "n_weights": g.n_weights,
        "bits_per_weight": g.bits_per_weight(),
        "metadata": {k: {"type": g.kv_types.get(k, "?"), "value": _json_value(v, g.kv_types.get(k, "?"))}
                     for k, v in g.kv.items()},
        "warnings": list(g.warnings),
    }
    if "ggml_ext.anyprec.version" in g.kv:
        d["anyprec"] = _anyprec_dict(g)
    if _ooc_weights(g):
        d["ooc"] = {"weights": _ooc_weights(g), "stock_llama_cpp": STOCK_REFUSES_OOC}
    if show_tensors:
        d["tensors"] = [{"name": t.name, "type": t.type_name, "type_id": t.type_id, "shape": list(t.shape),
                         "offset": t.offset, "file_offset": t.file_offset, "nbytes": t.nbytes}
                        for t in g.tensors]
    return d


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", nargs="?", help="a GGUF file")
    parser.add_argument("--tensors", action="store_true", help="list every tensor")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--build", action="store_true",
                        help="describe this build (llama.cpp commit, backends, CPU features, the kernel each "
                             "interleaved type runs on this CPU)")
    parser.add_argument("--types", action="store_true",
                        help="list every tensor type, stock and ggml-ext's: id, block, bytes, bits per weight, "
                             "whether stock llama.cpp reads it, family, the kernels this CPU dispatches")
    parser.add_argument("--markdown", action="store_true",
                        help="with --types: README's \"Which format?\" table (the types README lists, their "
                             "kernels per architecture, when to pick each, links to docs/RESULTS.md)")


def _build_report() -> tuple[int, str]:
    try:
        from ggml_ext import build_info  # written separately; may be absent in a partial checkout
    except ImportError as e:
        return 1, f"build information is not available: ggml_ext.build_info cannot be imported ({e})"
    try:
        return 0, build_info.report()
    except Exception as e:  # noqa: BLE001 - report, never a traceback
        return 1, f"build information is not available: {type(e).__name__}: {e}"


def _types_report(as_json: bool, as_markdown: bool = False) -> tuple[int, str]:
    try:
        from ggml_ext import formats
        rows = formats.table()
    except Exception as e:  # noqa: BLE001 - report, never a traceback
        return 1, f"the type registry is not available: {type(e).__name__}: {e}"
    if as_markdown:
        from ggml_ext import guide
        return 0, guide.markdown(rows)
    return 0, json.dumps(rows, indent=2) if as_json else formats.format_table(rows)


def main(args: argparse.Namespace) -> int:
    try:  # hostile metadata could hold anything; never die on printing it
        sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        pass
    path = getattr(args, "file", None)
    rc = 0
    if getattr(args, "types", False):
        code, text = _types_report(getattr(args, "json", False), getattr(args, "markdown", False))
        if code:
            print(f"error: {text}", file=sys.stderr)
            return 1
        print(text.rstrip("\n"))
        if path is None and not getattr(args, "build", False):
            return 0
        print()
    if getattr(args, "build", False):
        code, text = _build_report()
        if code:
            print(f"error: {text}", file=sys.stderr)
            rc = 1
        else:
            print(text.rstrip("\n"))
        if path is None:
            return rc
        print()
    if path is None:
        print("error: no FILE given (usage: ggml-ext info FILE [--tensors] [--json] | --build | --types [--json | --markdown])", file=sys.stderr)
        return 2
    try:
        g = read_gguf(path)
    except GGUFError as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError:
        print(f"error: {path}: no such file", file=sys.stderr)
        return 1
    except IsADirectoryError:
        print(f"error: {path}: is a directory", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {path}: {e.strerror or e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a reader bug; say so without a traceback
        if os.environ.get("GGML_EXT_DEBUG"):
            raise
        print(f"error: {path}: internal error reading the file ({type(e).__name__}: {e}); "
              "please report it (set GGML_EXT_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
    from .formats import versions
    why = versions.problem(g.kv, path, g)
    if why:  # a newer ggml-ext's file, or keys that contradict its tensors: its report would mislead
        print(f"error: {why}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(info_dict(g, getattr(args, "tensors", False)), indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(format_info(g, getattr(args, "tensors", False)))
    return rc


def _entry(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ggml-ext info", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return main(args)
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(_entry())
