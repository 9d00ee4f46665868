"""``ggml-ext compare``: a quality matrix of formats and methods for one model, by KL-divergence.

    ggml-ext compare HF_DIR_OR_GGUF -o OUT_DIR [--formats ours,upstream] [--calib wiki-train] [--eval wiki-test]

Every file is measured against the float model's own token distributions with llama-perplexity's
``--kl-divergence-base`` / ``--kl-divergence``: mean KLD, its 99th percentile, how often the top token
is the same, PPL, and bits per weight of the file. The steps, each cached in OUT_DIR:

1. **plan**: the formats (``--formats``, names below) become jobs, each with a recipe (what makes the
   file, from what, with which build) whose hash names its file and its manifest entry;
2. **files**: the float reference (``convert --type f16`` of a Hugging Face folder; a quantized GGUF
   dequantized to F16 by llama-quantize, so the reference of such a model is that file dequantized),
   an imatrix of the calibration text (our llama-imatrix, shared by ours and upstream's), then every
   format's file;
3. **base logits**: the reference's log-probabilities over the evaluation text (``--chunks`` windows
   of ``-c`` tokens), once;
4. **measure**: llama-perplexity ``--kl-divergence`` of each file (upstream's files by the pristine
   build's tool, ours by ours);
5. **report**: ``results.csv``, ``results.md`` and ``pareto.png`` (bits per weight against mean KLD).

A step whose recipe is in ``manifest.json`` with its file in place is not done again, so an
interrupted run resumes where it stopped; every file (and the manifest) is written to a temporary
name and renamed into place, so an interrupted write leaves no partial file.

Format names (``--formats``, comma-separated; presets ``ours``, ``upstream``, ``all``):

* ``upstream:TYPE``: the pristine upstream build's ``llama-quantize --imatrix`` of the reference
  (TYPE: Q2_K, Q3_K_S, Q3_K_M, IQ2_XS, IQ2_S, IQ3_XS, Q4_K_M, IQ4_NL, Q4_0, Q8_0, ...);
* ``TYPE``: ``ggml-ext convert --type TYPE`` with the converter's own method for the type (ggml's
  rounding; ggml-ext's IQ4_NL search; activation importance for the codebook recipes cb2/cb2_m/cb3/cb3_m),
  with the imatrix where the method takes one;
* ``METHOD:TYPE``: ``convert --method METHOD --type TYPE`` (gptq, ooc, rtn, act-importance) calibrated on
  the calibration text;
* ``anyprec:B``: one ``convert --method anyprec`` file, run at ``--apq-bits B`` (3..8); its bits per
  weight are what precision B reads.

``--kv`` measures KV cache types instead (docs/COMPARE.md): the reference's file with ``-ctk/-ctv``.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _atomic, cache, tools

__all__ = ["Format", "Row", "parse_formats", "compare", "add_arguments", "main", "PRESETS"]

UPSTREAM_TYPES = ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ2_XS", "IQ2_S", "IQ3_XS", "Q4_K_M", "IQ4_NL", "Q4_0", "Q8_0")
OURS = ("q4_0_8_8", "iq4_nl_8_8", "cb2", "cb2_m", "cb3", "cb3_m",
        "gptq:q4_0", "gptq:q3_k", "gptq:q2_k", "ooc:q4_0", "ooc:q3_k", "ooc:q2_k",
        *(f"anyprec:{b}" for b in range(3, 9)), "rtn:q4_0")
#: KV cache types: f16 (the reference), upstream's q8_0 and q4_0 (rotated at this commit), ours
KV_TYPES = ("f16", "q8_0", "q4_0", "nuq4", "nuq3", "nuq2")
PRESETS = {"ours": OURS, "upstream": tuple(f"upstream:{t}" for t in UPSTREAM_TYPES)}
PRESETS["all"] = PRESETS["ours"] + PRESETS["upstream"]
CALIBRATING = ("gptq", "ooc", "anyprec", "act-importance")
MANIFEST = "manifest.json"


class CompareError(RuntimeError):
    """A comparison that cannot run as asked (the message says why and what to do)."""


# ---------------------------------------------------------------- plan

@dataclass(frozen=True)
class Format:
    """One row of the matrix: ``spec`` as the user wrote it, who makes it (``ours`` / ``upstream``),
    the method (None: the converter's own for the type), the type, and extra llama-perplexity arguments."""

    spec: str
    origin: str
    method: str | None
    type: str
    run_args: tuple[str, ...] = ()

    @property
    def file_spec(self) -> str:
        """What identifies the file (anyprec's widths share one)."""
        return "anyprec" if self.method == "anyprec" else self.spec


def parse_format(spec: str) -> Format:
    """``upstream:Q4_K_M``, ``q4_0_8_8``, ``gptq:q3_k``, ``anyprec:4`` -> :class:`Format`."""
    from .convert import TYPES
    from . import methods
    head, _, tail = spec.partition(":")
    if not tail:
        if head.lower() not in TYPES:
            raise CompareError(f"unknown format {spec!r}: not a convert --type ({', '.join(TYPES)})")
        return Format(spec, "ours", None, head.lower())
    if head == "upstream":
        return Format(spec, "upstream", None, tail.upper())
    if head == "anyprec":
        if not (tail.isdigit() and 3 <= int(tail) <= 8):
            raise CompareError(f"{spec!r}: anyprec widths are 3..8")
        return Format(spec, "ours", "anyprec", "q8_0", ("--apq-bits", tail))
    if head not in methods.available():
        raise CompareError(f"{spec!r}: unknown method {head!r} ({', '.join(methods.available())}, upstream)")
    if tail.lower() not in TYPES:
        raise CompareError(f"{spec!r}: {tail!r} is not a convert --type")
    return Format(spec, "ours", head, tail.lower())


def parse_kv_format(spec: str) -> Format:
    """A KV cache type for ``--kv``: ``f16``, ``q8_0``, ``q4_0`` (upstream's), ``nuq4|3|2`` (ours; ``+outliers``:
    the calibration's dense-and-sparse outliers kept)."""
    base, plus, extra = spec.partition("+")
    if base not in KV_TYPES or (plus and (extra != "outliers" or not base.startswith("nuq"))):
        raise CompareError(f"unknown KV cache format {spec!r}: {', '.join(KV_TYPES)}, nuqN+outliers")
    outliers = ("--kv-outliers", "0.01", "--kv-sink", "1") if plus else ()
    # a quantized V cache needs flash attention; the f16 reference runs with it too, so only the cache differs
    return Format(spec, "ours" if base.startswith("nuq") else "upstream", None, base,
                  ("-fa", "on", "-ctk", base, "-ctv", base, *outliers))


def parse_formats(text: str | Iterable[str], kv: bool = False) -> list[Format]:
    items: list[str] = []
    for part in ([text] if isinstance(text, str) else list(text)):
        for s in (x.strip() for x in part.split(",")):
            if s:
                items += list(PRESETS[s]) if (s in PRESETS and not kv) else [s]
    if kv and not items:
        items = [*KV_TYPES, *(f"{t}+outliers" for t in KV_TYPES if t.startswith("nuq"))]
    fmts = [parse_kv_format(s) if kv else parse_format(s) for s in dict.fromkeys(items)]
    if not fmts:
        raise CompareError("no formats given")
    return fmts


def _fingerprint(path: Path) -> dict[str, Any]:
    """Cheap identity of an input: names, sizes and modification times (a model can be GBs); small files
    (texts, up to 64 MiB) by sha256."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    out = {}
    for p in files:
        st = p.stat()
        rel = str(p.relative_to(path)) if path.is_dir() else p.name
        out[rel] = (hashlib.sha256(p.read_bytes()).hexdigest() if st.st_size <= 64 << 20
                    else f"{st.st_size}:{st.st_mtime_ns}")
    return out


def _key(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-")


@dataclass
class Plan:
    model: Path
    hf: Path | None           # the Hugging Face folder our converter starts from
    calib: Path
    eval_text: Path
    out: Path
    formats: list[Format]
    n_ctx: int
    chunks: int
    threads: int | None
    imatrix_chunks: int
    calib_samples: int | None
    calib_seq_len: int | None
    upstream_bin: Path | None  # the pristine build's bin folder; None: our build stands in
    kv: bool = False
    kv_calib: Path | None = None
    tool_args: tuple[str, ...] = ()  # more llama-perplexity arguments for every run (e.g. -nr)
    progress: bool = True            # progress bars, those of the calibration inside our conversions too
    base: dict[str, Any] = field(default_factory=dict)  # what every recipe shares

    def recipe(self, step: str, **more: Any) -> dict[str, Any]:
        return {"step": step, **self.base, **more}

    def upstream_id(self) -> dict[str, Any] | None:
        """The pristine build's identity (its folder and its llama-quantize's size and time); None: ours."""
        if self.upstream_bin is None:
            return None
        return {"bin": str(self.upstream_bin), "llama-quantize": _fingerprint(self.upstream_bin / "llama-quantize")}


def _build_id() -> dict[str, str]:
    from . import build_info
    b = build_info.get()
    return {"ggml_ext": b.ggml_ext, "llama_cpp_commit": b.llama_cpp_commit}


def default_upstream_bin() -> Path | None:
    """The pristine pinned llama.cpp of ``make upstream`` (scripts/build_upstream.sh), if it was built."""
    commit = _build_id()["llama_cpp_commit"]
    for d in sorted(cache.cache_root().glob("upstream-*/bin")):
        if commit.startswith(d.parent.name[len("upstream-"):]) and (d / "llama-quantize").is_file():
            return d
    return None


def _text(name: str) -> Path:
    from . import assets
    p = Path(name)
    return p if p.is_file() else assets.path(name)


def make_plan(model: str | os.PathLike, out: str | os.PathLike, formats: list[Format], *, calib: str = "wiki-train",
              eval_text: str = "wiki-test", hf: str | os.PathLike | None = None, n_ctx: int = 512, chunks: int = 20,
              threads: int | None = None, imatrix_chunks: int = 32, calib_samples: int | None = None,
              calib_seq_len: int | None = None, upstream_bin: str | os.PathLike | None = None,
              kv: bool = False, kv_calib: str | os.PathLike | None = None, tool_args: Iterable[str] = ()) -> Plan:
    model = Path(model)
    if not model.exists():
        raise CompareError(f"model not found: {model}")
    if chunks * (n_ctx - 1 - n_ctx // 2) < 100:  # llama-perplexity prints no KLD statistics on fewer tokens
        raise CompareError(f"{chunks} chunks of {n_ctx} tokens score {chunks * (n_ctx - 1 - n_ctx // 2)} tokens; "
                           "llama-perplexity's KL-divergence needs at least 100: more --chunks or a longer -c")
    hf_dir = Path(hf) if hf else (model if model.is_dir() else None)
    needs_hf = [f.spec for f in formats if f.origin == "ours" and not kv]
    if needs_hf and hf_dir is None:
        raise CompareError(f"{', '.join(needs_hf)} start from a Hugging Face folder: pass --hf DIR (the GGUF's "
                           "float weights as a folder), or leave these formats out")
    up: Path | None = None
    if any(f.origin == "upstream" for f in formats) and not kv:
        if upstream_bin == "ours":
            up = None
        else:
            up = Path(upstream_bin) if upstream_bin else default_upstream_bin()
            if up is None or not (up / "llama-quantize").is_file():
                raise CompareError("the upstream formats need the pristine upstream build: run `make upstream`, or "
                                   "pass --upstream-bin DIR (or --upstream-bin ours: our build's llama-quantize, "
                                   "the same stock quantizers, marked as such)")
    if kv and any(f.type.startswith("nuq") for f in formats) and kv_calib is None and hf_dir is None:
        raise CompareError("the nuq cache types need a KV calibration: --kv-calib FILE (`ggml-ext calibrate kv`), "
                           "or --hf DIR to make one from the calibration text")
    plan = Plan(model, hf_dir, _text(calib), _text(eval_text), Path(out), formats, n_ctx, chunks, threads,
                imatrix_chunks, calib_samples, calib_seq_len, up, kv, Path(kv_calib) if kv_calib else None,
                tuple(tool_args))
    # every step depends on the model and our build (the reference, the imatrix and the base logits are ours);
    # only upstream's files and their measurements depend on the pristine build (Plan.upstream_id)
    plan.base = {"model": _fingerprint(model), "build": _build_id()}
    return plan


# ---------------------------------------------------------------- the manifest (resume)

class Manifest:
    """``OUT/manifest.json``: recipe key -> what was done (file, size, result). Written atomically after
    every step, so a run cut anywhere resumes from the last finished step."""

    def __init__(self, out: Path):
        self.path = out / MANIFEST
        self.out = out
        try:
            self.data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.data = {"format": 1, "steps": {}}
        except ValueError:
            raise CompareError(f"{self.path} is not readable JSON; move it away to start afresh") from None

    def done(self, key: str) -> dict[str, Any] | None:
        entry = self.data["steps"].get(key)
        if entry is None:
            return None
        f = entry.get("file")
        if f and not ((self.out / f).is_file() and (self.out / f).stat().st_size == entry.get("size")):
            return None
        return entry

    def record(self, key: str, entry: dict[str, Any]) -> None:
        f = entry.get("file")
        if f:
            entry["size"] = (self.out / f).stat().st_size
        self.data["steps"][key] = entry
        _atomic.write_json(self.path, self.data)


def _step(man: Manifest, recipe: dict[str, Any], name: str, make: Callable[[Path], dict[str, Any] | None],
          suffix: str = ".gguf") -> dict[str, Any]:
    """Do one step unless the manifest has it: ``make(tmp_path)`` writes the file (renamed into place on
    success), and may return a result to keep with it."""
    key = _key(recipe)
    entry = man.done(key)
    if entry is not None:
        return entry
    target = man.out / f"{_slug(name)}-{key}{suffix}" if suffix else None
    result = None
    if target is not None:
        with _atomic.output_path(target) as tmp:
            result = make(Path(tmp))
    else:
        result = make(man.out)
    entry = {"recipe": recipe, "file": target.name if target else None, "result": result}
    man.record(key, entry)
    return entry


# ---------------------------------------------------------------- making files

def _run(argv: list[str], env: dict[str, str], what: str, parse: Callable[[str], Any] | None = None) -> Any:
    """Run a tool; with `parse`, what it reads from the output (a run whose output lacks it runs again, as
    tools.run says), else the output."""
    rc, log = tools.run(argv, env, complete=None if parse is None else (lambda log: parse(log) is not None))
    got = log if parse is None else parse(log)
    if rc != 0 or got is None:
        raise CompareError(f"{what} failed (exit {rc}):\n{tools.log_tail(log)}")
    return got


def _bin(plan: Plan, origin: str, tool: str) -> tuple[list[str], dict[str, str]]:
    """argv head and environment of ``tool`` from the build that runs ``origin``'s files."""
    if origin == "upstream" and plan.upstream_bin is not None:
        return [str(plan.upstream_bin / tool)], {**os.environ, "LD_LIBRARY_PATH": str(plan.upstream_bin)}
    return tools.command(tool), tools.tool_env()


def _file_type(path: Path) -> str:
    from .gguf import read_gguf
    g = read_gguf(path)
    kinds = {t.type_name for t in g.tensors if len(t.shape) >= 2}
    return "float" if kinds <= {"F32", "F16", "BF16"} else "quantized"


def make_reference(plan: Plan, man: Manifest) -> Path:
    """The float reference: a Hugging Face folder converted to F16, a float GGUF as it is, a quantized GGUF
    dequantized to F16 (that file, not the unquantized model, is then the reference)."""
    if plan.model.is_dir():
        from .convert import convert

        def make(tmp: Path) -> dict[str, Any]:
            convert(plan.model, tmp, "f16", force=True, threads=plan.threads)
            return {"from": "ggml-ext convert --type f16"}
        e = _step(man, plan.recipe("reference", how="convert f16"), "reference-f16", make)
    elif _file_type(plan.model) == "float":
        return plan.model
    else:
        def make(tmp: Path) -> dict[str, Any]:
            argv, env = _bin(plan, "ours", "llama-quantize")
            _run([*argv, "--allow-requantize", str(plan.model), str(tmp), "F16"], env, "llama-quantize F16")
            return {"from": f"{plan.model.name} dequantized to F16 (the source is quantized)"}
        e = _step(man, plan.recipe("reference", how="requantize F16"), "reference-f16-dequantized", make)
    return plan.out / e["file"]


def make_imatrix(plan: Plan, man: Manifest, ref: Path) -> Path:
    """Our llama-imatrix of the reference on the calibration text, in windows of 512 tokens (llama-imatrix's
    default; shorter when the evaluation context is), however long the evaluation context."""
    from .calibrate import imatrix
    n_ctx = min(plan.n_ctx, 512)

    def make(tmp: Path) -> dict[str, Any]:
        imatrix.make(ref, tmp, plan.calib, chunks=plan.imatrix_chunks, n_ctx=n_ctx, threads=plan.threads,
                     force=True)
        return {"chunks": plan.imatrix_chunks, "n_ctx": n_ctx}
    recipe = plan.recipe("imatrix", calib=_fingerprint(plan.calib), chunks=plan.imatrix_chunks, n_ctx=n_ctx)
    return plan.out / _step(man, recipe, "imatrix", make)["file"]


def _method_defaults(method: str | None) -> dict[str, Any] | None:
    """A method's default options, part of its files' recipes: a file made with other defaults is made again."""
    if method is None:
        return None
    from . import methods
    m = methods.create(method)
    scalar = (str, int, float, bool, type(None))
    out = {k: v for k, v in vars(m).items() if isinstance(v, scalar)}
    out.update({k: v for k, v in (getattr(m, "options", None) or {}).items() if isinstance(v, scalar)})
    return dict(sorted(out.items()))


def make_file(plan: Plan, man: Manifest, fmt: Format, ref: Path, im: Path | None) -> Path:
    """One format's file (cached by recipe)."""
    calib = {"calib": _fingerprint(plan.calib), "samples": plan.calib_samples, "seq_len": plan.calib_seq_len}
    if fmt.origin == "upstream":
        recipe = plan.recipe("file", spec=fmt.file_spec, imatrix=_key({"im": _fingerprint(im)}) if im else None,
                             upstream=plan.upstream_id())

        def make(tmp: Path) -> dict[str, Any]:
            argv, env = _bin(plan, "upstream", "llama-quantize")
            _run([*argv, *(["--imatrix", str(im)] if im else []), str(ref), str(tmp), fmt.type,
                  *([str(plan.threads)] if plan.threads else [])], env, f"llama-quantize {fmt.type}")
            return {"tool": "llama-quantize", "build": "pristine upstream" if plan.upstream_bin else "ours"}
    else:
        from .converters.policy import CODEBOOK_RECIPES
        from .convert import convert
        method = fmt.method
        takes_imatrix = method in (None, "rtn") and fmt.type not in CODEBOOK_RECIPES
        calibrates = method in CALIBRATING or (method is None and fmt.type in CODEBOOK_RECIPES)
        recipe = plan.recipe("file", spec=fmt.file_spec, hf=_fingerprint(plan.hf),
                             imatrix=_key({"im": _fingerprint(im)}) if takes_imatrix and im else None,
                             defaults=_method_defaults(method), **(calib if calibrates else {}))

        def make(tmp: Path) -> dict[str, Any]:
            kw: dict[str, Any] = {"method": method, "force": True, "threads": plan.threads}
            if takes_imatrix and im is not None:
                kw["imatrix"] = im
            if calibrates:
                kw.update(calib=plan.calib, calib_samples=plan.calib_samples, calib_seq_len=plan.calib_seq_len,
                          calib_progress=plan.progress)
            convert(plan.hf, tmp, None if method == "anyprec" else fmt.type, **kw)
            return {"tool": "ggml-ext convert", "method": method or "default", "type": fmt.type}
    return plan.out / _step(man, recipe, fmt.file_spec, make)["file"]


def make_kv_calib(plan: Plan, man: Manifest) -> Path:
    """KVQuant's calibration of the Hugging Face folder on the calibration text (`ggml-ext calibrate kv`, run as
    the CLI does, so the nuq tables are exactly what a user's own calibration gives)."""
    def make(tmp: Path) -> dict[str, Any]:
        argv = [sys.executable, "-m", "ggml_ext.cli", "calibrate", "kv", str(plan.hf), "-o", str(tmp), "--force",
                "-q", "--text", str(plan.calib)]
        argv += ["--samples", str(plan.calib_samples)] if plan.calib_samples else []
        argv += ["--seq-len", str(plan.calib_seq_len)] if plan.calib_seq_len else []
        _run(argv, dict(os.environ), "ggml-ext calibrate kv")
        return {"tool": "ggml-ext calibrate kv", "samples": plan.calib_samples, "seq_len": plan.calib_seq_len}
    recipe = plan.recipe("kv-calib", hf=_fingerprint(plan.hf), calib=_fingerprint(plan.calib),
                         samples=plan.calib_samples, seq_len=plan.calib_seq_len)
    return plan.out / _step(man, recipe, "kv-calib", make)["file"]


# ---------------------------------------------------------------- measuring

_KLD = {
    "ppl": re.compile(r"Mean PPL\(Q\)\s*:\s*([0-9.eE+-]+)"),
    "ppl_base": re.compile(r"Mean PPL\(base\)\s*:\s*([0-9.eE+-]+)"),
    "kld_mean": re.compile(r"Mean\s+KLD:\s*([0-9.eE+-]+)"),
    "kld_p99": re.compile(r"99\.0%\s+KLD:\s*([0-9.eE+-]+)"),
    "same_top_pct": re.compile(r"Same top p:\s*([0-9.eE+-]+)"),
}


def parse_kld(log: str) -> dict[str, float] | None:
    """The figures of a ``llama-perplexity --kl-divergence`` log, None when the summary is missing."""
    out = {}
    for k, rx in _KLD.items():
        m = rx.search(log)
        if m is None:
            return None
        out[k] = float(m.group(1))
    return out


def _common_args(plan: Plan) -> list[str]:
    return ["-c", str(plan.n_ctx), "--no-warmup", *(["-t", str(plan.threads)] if plan.threads else []),
            *plan.tool_args]


def base_logits(plan: Plan, man: Manifest, ref: Path) -> Path:
    """The reference's log-probabilities over the evaluation text (llama-perplexity --kl-divergence-base)."""
    extra = list(parse_kv_format("f16").run_args) if plan.kv else []

    def make(tmp: Path) -> dict[str, Any]:
        argv, env = _bin(plan, "ours", "llama-perplexity")
        args = [*argv, "-m", str(ref), "-f", str(plan.eval_text), "--chunks", str(plan.chunks),
                "--kl-divergence-base", str(tmp), *_common_args(plan), *extra]
        m = _run(args, env, "llama-perplexity --kl-divergence-base", parse=tools._FINAL.search)
        return {"ppl": float(m.group(1))}
    recipe = plan.recipe("base", ref=_fingerprint(ref), eval=_fingerprint(plan.eval_text), chunks=plan.chunks,
                         n_ctx=plan.n_ctx, kv=plan.kv, tool_args=list(plan.tool_args))
    return plan.out / _step(man, recipe, "base-logits", make, suffix=".kld")["file"]


def bits_per_weight(path: Path, apq_bits: int | None = None) -> float:
    """Bits per weight of the whole file: every tensor's stored bits over its weights (OOC side-cars counted
    into their weights); an any-precision file at ``apq_bits`` counts what that precision reads."""
    from .bits import file_bits
    from .gguf import read_gguf
    g = read_gguf(path)
    if apq_bits is None:
        return file_bits(g).a_total
    from .anyprec import planes_bytes, tables_bytes
    from .anyprec.extract import TABLES_SUFFIX, open_file
    f = open_file(path)
    mats = set(f.matrices)
    bits = weights = 0
    for t in g.tensors:
        if t.name.endswith(TABLES_SUFFIX) and t.name[:-len(TABLES_SUFFIX)] in mats:
            continue
        if t.name in mats:
            k, n = f.dims(t.name)
            bits += 8 * (planes_bytes(n, k, apq_bits) + tables_bytes(n, apq_bits))
            weights += k * n
        else:
            bits += 8 * t.nbytes
            weights += t.n_elements
    return bits / weights


def measure(plan: Plan, man: Manifest, fmt: Format, path: Path, base: Path) -> dict[str, Any]:
    runner = "pristine upstream" if fmt.origin == "upstream" and plan.upstream_bin else "ours"
    extra = list(fmt.run_args)
    if plan.kv and fmt.type.startswith("nuq"):
        extra += ["--kv-calib", str(plan.kv_calib)]

    def make(_: Path) -> dict[str, Any]:
        argv, env = _bin(plan, fmt.origin if not plan.kv else "ours", "llama-perplexity")
        got = _run([*argv, "-m", str(path), "--kl-divergence-base", str(base), "--kl-divergence", *_common_args(plan),
                    *extra], env, f"llama-perplexity --kl-divergence ({fmt.spec})", parse=parse_kld)
        apq = int(fmt.run_args[1]) if fmt.method == "anyprec" else None
        kv_bits = _kv_bits(fmt.type) if plan.kv else None
        return {**got, "bpw": kv_bits if plan.kv else bits_per_weight(path, apq), "runner": runner}
    recipe = plan.recipe("measure", spec=fmt.spec, file=_fingerprint(path), base=_fingerprint(base),
                         runner=plan.upstream_id() if fmt.origin == "upstream" and not plan.kv else None,
                         tool_args=list(plan.tool_args),
                         kv_calib=_fingerprint(plan.kv_calib) if plan.kv_calib and fmt.type.startswith("nuq") else None)
    return _step(man, recipe, fmt.spec, make, suffix="")["result"]


def _kv_bits(cache_type: str) -> float:
    """Bits per cached element of a KV cache type (its block's bytes over its elements)."""
    from . import formats
    t = formats.type_by_name(cache_type.upper())
    return t.type_size * 8 / t.block_size


# ---------------------------------------------------------------- report

@dataclass
class Row:
    format: str
    origin: str
    bpw: float
    kld_mean: float
    kld_p99: float
    same_top_pct: float
    ppl: float
    ppl_base: float
    runner: str
    beaten_by: str = ""  # an upstream file both smaller and better in mean KLD, if any (ours only)


COLUMNS = [f.name for f in Row.__dataclass_fields__.values()]


def _label_points(fig, ax, points: list[tuple[str, float, float]]) -> None:
    """Each point's name beside it, moved up or down until it overlaps no name placed before (files of one size
    sit on top of each other: four 4-bit files within 0.01 bits), with a thin line back to its point when moved."""
    ax.autoscale_view()
    fig.canvas.draw()  # the axes' limits, so data and pixels map as they will be drawn
    px = fig.dpi / 72.0   # pixels per point
    placed: list[tuple[float, float, float, float]] = []
    for name, x, y in sorted(points, key=lambda p: (p[1], -p[2])):
        X, Y = ax.transData.transform((x, y))
        w, h = (len(name) * 4.3 + 4) * px, 9 * px
        for dy in (3, -11, 14, -22, 25, -33, 36, -44, 47, -55):
            box = (X + 3 * px, Y + dy * px, X + 3 * px + w, Y + dy * px + h)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        placed.append(box)
        ax.annotate(name, (x, y), xytext=(3, dy), textcoords="offset points", fontsize=7,
                    arrowprops=dict(arrowstyle="-", lw=0.5, alpha=0.5) if abs(dy) > 3 else None)

def mark_dominated(rows: list[Row]) -> None:
    """Fill ``beaten_by`` of our rows: the upstream row of fewest bits that is no larger and has lower mean KLD
    (our format is then off upstream's Pareto front)."""
    upstream = sorted((r for r in rows if r.origin == "upstream"), key=lambda r: (r.bpw, r.kld_mean))
    for r in rows:
        if r.origin == "ours":
            r.beaten_by = next((u.format for u in upstream if u.bpw <= r.bpw and u.kld_mean < r.kld_mean), "")


def write_reports(plan: Plan, rows: list[Row]) -> dict[str, Path]:
    """results.csv, results.md and pareto.png in the output folder (each written atomically)."""
    mark_dominated(rows)
    out = {}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([getattr(r, c) if not isinstance(getattr(r, c), float) else f"{getattr(r, c):.6g}"
                    for c in COLUMNS])
    out["csv"] = plan.out / "results.csv"
    _atomic.write_text(out["csv"], buf.getvalue())
    out["md"] = plan.out / "results.md"
    _atomic.write_text(out["md"], markdown(plan, rows))
    png = plan.out / "pareto.png"
    if pareto_png(plan, rows, png):
        out["png"] = png
    return out


def markdown(plan: Plan, rows: list[Row]) -> str:
    unit = "bits/element" if plan.kv else "bits/weight"
    ref = "f16 cache" if plan.kv else "the float reference"
    head = (f"Model `{plan.model.name}`; KLD against {ref} on `{plan.eval_text.name}`, {plan.chunks} chunks of "
            f"{plan.n_ctx} tokens; calibration `{plan.calib.name}`.\n\n"
            f"| format | by | {unit} | mean KLD | 99% KLD | same top % | PPL | beaten by |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
    body = "".join(f"| {r.format} | {_by(r, plan.kv)} | {r.bpw:.3f} | {r.kld_mean:.5f} | {r.kld_p99:.4f} | "
                   f"{r.same_top_pct:.2f} | {r.ppl:.3f} | {r.beaten_by} |\n" for r in sorted(rows, key=lambda r: r.bpw))
    base = f"\nPPL of the reference: {rows[0].ppl_base:.3f}.\n" if rows else ""
    return head + body + base


def _by(r: Row, kv: bool) -> str:
    """Who made and ran the row's file; upstream's types made by our build say so (KV cache types always run
    in our build, whose upstream cache types are upstream's code)."""
    return "upstream (our build)" if r.origin == "upstream" and r.runner == "ours" and not kv else r.origin


def pareto_png(plan: Plan, rows: list[Row], target: Path) -> bool:
    """Bits per weight against mean KLD, ours and upstream's marked apart; False (and a note) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("note: no pareto.png: matplotlib is not installed (pip install 'ggml-ext[bench]')", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for origin, marker, color in (("ours", "o", "tab:blue"), ("upstream", "s", "tab:orange")):
        pts = [r for r in rows if r.origin == origin]
        ax.scatter([r.bpw for r in pts], [max(r.kld_mean, 1e-6) for r in pts], marker=marker, color=color,
                   label=origin)
    ax.set_yscale("log")
    _label_points(fig, ax, [(r.format.replace("upstream:", ""), r.bpw, max(r.kld_mean, 1e-6)) for r in rows])
    front, best = [], float("inf")   # upstream's Pareto front: no upstream file both smaller and better
    for r in sorted((r for r in rows if r.origin == "upstream"), key=lambda r: (r.bpw, r.kld_mean)):
        if r.kld_mean < best:
            front.append(r)
            best = r.kld_mean
    if len(front) > 1:
        ax.step([r.bpw for r in front], [max(r.kld_mean, 1e-6) for r in front], where="post", linestyle="--",
                color="tab:orange", alpha=0.6, label="upstream's front")
    ax.set_xlabel("bits per element (KV cache)" if plan.kv else "bits per weight (whole file)")
    ax.set_ylabel("mean KL-divergence (log)")
    ax.set_title(f"{plan.model.name}: {plan.chunks} x {plan.n_ctx} tokens of {plan.eval_text.name}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    _atomic.write_bytes(target, png.getvalue())
    return True


# ---------------------------------------------------------------- the pipeline

def compare(plan: Plan, progress: bool = True) -> tuple[list[Row], dict[str, Path]]:
    """Run the plan (resuming from the manifest); returns the rows and the report files."""
    from tqdm import tqdm
    plan.progress = progress
    plan.out.mkdir(parents=True, exist_ok=True)
    man = Manifest(plan.out)
    ref = make_reference(plan, man)
    files: dict[str, Path] = {}
    if plan.kv:
        files = {f.spec: ref for f in plan.formats}
        if plan.kv_calib is None and any(f.type.startswith("nuq") for f in plan.formats):
            plan.kv_calib = make_kv_calib(plan, man)
    else:
        im = make_imatrix(plan, man, ref) if any(f.method is None or f.origin == "upstream" or f.method == "rtn"
                                                  for f in plan.formats) else None
        for fmt in tqdm(plan.formats, desc="files", unit="file", disable=not progress, file=sys.stderr):
            files[fmt.spec] = make_file(plan, man, fmt, ref, im)
    base = base_logits(plan, man, ref)
    rows = []
    for fmt in tqdm(plan.formats, desc="measuring", unit="file", disable=not progress, file=sys.stderr):
        r = measure(plan, man, fmt, files[fmt.spec], base)
        rows.append(Row(fmt.spec, fmt.origin, r["bpw"], r["kld_mean"], r["kld_p99"], r["same_top_pct"], r["ppl"],
                        r["ppl_base"], r["runner"]))
    return rows, write_reports(plan, rows)


# ---------------------------------------------------------------- CLI

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="Hugging Face folder or GGUF file (a quantized GGUF is dequantized to F16 and "
                                 "that becomes the reference)")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="output folder: files, manifest.json (resume), results.csv, results.md, pareto.png")
    p.add_argument("--formats", default="all", metavar="LIST",
                   help="comma-separated formats or presets (ours, upstream, all; default all): upstream:TYPE, TYPE "
                        "(convert --type), METHOD:TYPE, anyprec:B; with --kv: f16, q8_0, q4_0, nuq4/3/2[+outliers]")
    p.add_argument("--calib", default="wiki-train", metavar="TEXT", help="calibration text, file or asset (default wiki-train)")
    p.add_argument("--eval", dest="eval_text", default="wiki-test", metavar="TEXT",
                   help="evaluation text, file or asset (default wiki-test)")
    p.add_argument("--hf", default=None, metavar="DIR", help="Hugging Face folder of a GGUF model, for our formats")
    p.add_argument("-c", "--ctx-size", type=int, default=512)
    p.add_argument("--chunks", type=int, default=20, help="evaluation windows of --ctx-size tokens (default 20)")
    p.add_argument("--imatrix-chunks", type=int, default=32, help="calibration windows of the imatrix (default 32)")
    p.add_argument("--calib-samples", type=int, default=None, help="calibration samples of our calibrating methods")
    p.add_argument("--calib-seq-len", type=int, default=None, help="tokens per calibration sample")
    p.add_argument("--upstream-bin", default=None, metavar="DIR",
                   help="the pristine build's bin folder (default: make upstream's); 'ours': our build's tools")
    p.add_argument("--kv", action="store_true", help="compare KV cache types on the reference model instead")
    p.add_argument("--kv-calib", default=None, metavar="FILE", help="KV calibration (ggml-ext calibrate kv) for nuq*")
    p.add_argument("--tool-args", default="", metavar="ARGS",
                   help="more arguments for every llama-perplexity run, one string (e.g. '-nr': no runtime repack)")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from .assets import AssetError
    try:
        fmts = parse_formats(args.formats if not (args.kv and args.formats == "all") else "", kv=args.kv)
        plan = make_plan(args.model, args.output, fmts, calib=args.calib, eval_text=args.eval_text, hf=args.hf,
                         n_ctx=args.ctx_size, chunks=args.chunks, threads=args.threads,
                         imatrix_chunks=args.imatrix_chunks, calib_samples=args.calib_samples,
                         calib_seq_len=args.calib_seq_len, upstream_bin=args.upstream_bin, kv=args.kv,
                         kv_calib=args.kv_calib, tool_args=args.tool_args.split())
        rows, files = compare(plan, progress=not args.quiet)
    except (CompareError, AssetError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(files["md"].read_text(encoding="utf-8"), end="")
    print("\n" + "\n".join(str(files[k]) for k in ("csv", "md", "png") if k in files))
    return 0


def rows_of(results_csv: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a results.csv, as dicts (for notebooks)."""
    with open(results_csv, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
