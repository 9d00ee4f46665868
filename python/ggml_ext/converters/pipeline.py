"""Hugging Face folder -> GGUF: plan every tensor from the headers, then stream them out.

1. **Plan** (nothing read but headers): the architecture table maps and checks
   every source tensor (name, shape, required and optional ones, tied output),
   computed tensors are added (``rope_freqs``...), each tensor gets its ggml type
   (:mod:`.policy`), the tokenizer and metadata are collected. Any problem is
   reported here, before a byte is written.
2. **Write**: the header goes to a temp file next to the output; each tensor is
   read (float32), transformed, checked for NaN/inf, quantized by the conversion's
   method (:mod:`ggml_ext.methods`, looked up by name; ``rtn`` by default: the type's
   own quantizer in :mod:`ggml_ext.quants`) -- float types are converted by ggml's
   ``ggml_quantize_chunk`` directly -- and appended. The sha256 of
   the source files is computed on a second thread meanwhile and set in the header
   at the end; then the temp file is moved into place. On any error or interrupt
   the temp file is removed and no output exists.

A method that needs calibration (its ``calibration_needs``, e.g. ``gptq``: the Hessians) gets a
step 1b: the model's decoder layers are streamed over the calibration text by
:class:`ggml_ext.calibrate.stream.LayerStream`; when a layer's statistics are complete, each of its
quantized matrices goes through the method with ``calibration={"hessian": H, ...}``, the layer's
weights are replaced by what the written bytes dequantize to (ggml's ``to_float``), and the layer's
outputs are recomputed, so the next layer is calibrated on the quantized model's activations. The
bytes are kept (in memory: the quantized size of the decoder layers) and written in step 2; the
other matrices (embeddings, output) go through the method without calibration. A method that needs
the Fisher diagonal (``calibration_needs = ("fisher",)``, e.g. ``anyprec``) gets it from the
calibration engine's cached streamed Fisher of the unquantized model instead
(:func:`ggml_ext.calibrate.stats.collect`), as ``calibration={"fisher": F}`` in step 2. A method with a
``tensors(gguf_name, type_name, ggml_shape)`` may write a matrix as tensors of its own (anyprec: its
bitplanes and centroid tables); ``default_type`` is the ``type`` a method gets when none is asked.

Peak memory is about twice the largest tensor as float32 plus its converted
bytes: nothing else of the model is held.
"""
from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..gguf import GGUFWriter, GGUFWriteError

from .archs import Arch, HParams, Plan, find_arch, permute_qk
from .errors import ConversionError
from .options import ConvertOptions
from .policy import CODEBOOK_RECIPES, FILE_TYPES, OUTPUT_TYPES, KeepRule, choose_type, parse_keep
from .source import Checkpoint
from .vocab import Vocab, load_vocab

__all__ = ["convert", "plan", "ConvertOptions", "ConversionResult", "ConversionPlan"]

log = logging.getLogger("ggml_ext.convert")

GGML_QNT_VERSION = 2
_F16_MAX = 65504.0


@dataclass
class ConversionPlan:
    checkpoint: Checkpoint
    arch: Arch
    hparams: HParams
    out_type: str
    tensors: list[Plan]
    vocab: Vocab
    metadata: list[tuple[str, str, Any]]
    warnings: list[str] = field(default_factory=list)

    @property
    def total_elements(self) -> int:
        return sum(int(np.prod(p.shape)) for p in self.tensors)

    def type_counts(self) -> dict[str, int]:
        return dict(Counter(p.type_name for p in self.tensors))


@dataclass
class ConversionResult:
    """What :func:`convert` wrote."""

    path: Path
    architecture: str  # the Hugging Face class
    gguf_architecture: str
    out_type: str
    n_tensors: int
    type_counts: dict[str, int]
    size: int
    source_hash: str
    tokenizer_pre: str
    warnings: list[str]

    def __str__(self) -> str:
        types = ", ".join(f"{n} {t}" for t, n in sorted(self.type_counts.items(), key=lambda x: -x[1]))
        return (f"{self.path}: {self.gguf_architecture} ({self.architecture}), {self.out_type}, {self.n_tensors} tensors "
                f"({types}), {self.size / 2**20:.1f} MiB, tokenizer pre {self.tokenizer_pre!r}")


def _layer_key(arch: Arch, hf_name: str) -> tuple[str, int | None]:
    m = re.match(r"^model\.layers\.([0-9]{1,9})\.(.+)$", hf_name)
    if m and hf_name not in arch.global_map:
        return m.group(2), int(m.group(1))
    return hf_name, None


def _order(name: str) -> tuple:
    if name.startswith("token_embd"):
        return (0, 0, name)
    m = re.match(r"^blk\.(\d+)\.", name)
    if m:
        return (1, int(m.group(1)), name)
    if name.startswith(("output_norm", "output.")):
        return (2, 0, name)
    return (3, 0, name)


def plan(model_dir: str | os.PathLike, out_type: str = "f16", *, keep: tuple[str | KeepRule, ...] | list = (),
         name: str | None = None, vocab_only: bool = False, has_imatrix: bool = False,
         pre_tokenizer: str | None = None, warn: Callable[[str], None] | None = None) -> ConversionPlan:
    """Check the model folder and decide everything :func:`convert` will write."""
    warnings: list[str] = []

    def _warn(msg: str) -> None:
        warnings.append(msg)
        (warn or log.warning)(msg)

    out_type = out_type.lower()
    if out_type not in OUTPUT_TYPES:
        raise ConversionError(f"unknown output type {out_type!r}; choose from {', '.join(OUTPUT_TYPES)}")
    keep_rules = tuple(k if isinstance(k, KeepRule) else parse_keep(k) for k in keep)
    ckpt = Checkpoint(model_dir, weights=not vocab_only)
    arch = find_arch(ckpt.config)
    hp = HParams(ckpt.config, _warn)
    kind = (hp.rope().get("rope_type") or "default").lower()
    if kind not in arch.rope_types:
        raise ConversionError(f"RoPE scaling {kind!r} is not supported for {arch.hf_class} "
                              f"(supported: {', '.join(sorted(arch.rope_types))})")
    metadata_arch = arch.metadata(hp)

    tensors: list[Plan] = []
    if not vocab_only:
        tensors = _plan_tensors(ckpt, arch, hp)
    has_output = any(p.gguf_name == "output.weight" for p in tensors)
    used: set[int] = set()
    for p in tensors:
        p.type_name = choose_type(p.gguf_name, tuple(reversed(p.shape)), out_type, has_output=has_output,
                                  keep=keep_rules, used=used, n_gqa=max(1, hp.n_head // max(1, hp.n_head_kv)),
                                  n_layer=hp.n_layer, has_imatrix=has_imatrix)
    if out_type in CODEBOOK_RECIPES:  # say which matrices could not hold codebook blocks
        fell = [f"{p.gguf_name} ({tuple(reversed(p.shape))[0]} per row -> {p.type_name})" for p in tensors
                if p.type_name not in ("F32", "Q6_K", "Q8_0") and not p.type_name.startswith("CB")
                and p.type_name not in CODEBOOK_RECIPES[out_type][1].values()]
        if fell:
            _warn(f"{len(fell)} matrices have rows that are not a multiple of 256 weights, which {out_type} "
                  f"blocks need; they fall back as llama-quantize's do: {', '.join(fell[:4])}"
                  f"{', ...' if len(fell) > 4 else ''}")
    if not vocab_only:
        for i, rule in enumerate(keep_rules):
            if i not in used:
                raise ConversionError(f"--keep {rule}: the pattern matches no weight matrix "
                                      "(GGUF names look like 'blk.0.attn_v.weight', 'token_embd.weight')")

    n_vocab = hp.vocab_size
    embd = ckpt.tensors.get("model.embed_tokens.weight")
    if embd is not None:
        n_vocab = embd.shape[0]
    vocab = load_vocab(ckpt.folder, ckpt.config, n_vocab, _warn, pre_tokenizer=pre_tokenizer)

    from .. import quants  # needs our compiled libggml-base

    model_name = name or _model_name(ckpt)
    meta: list[tuple[str, str, Any]] = [
        ("general.architecture", "str", arch.gguf_arch),
        ("general.type", "str", "model"),
        ("general.name", "str", model_name),
        ("general.file_type", "u32", FILE_TYPES[out_type]),
        ("general.quantization_version", "u32", GGML_QNT_VERSION),
        *metadata_arch,
        *vocab.metadata(),
        ("ggml_ext.format_version", "u32", quants.format_version()),
        ("ggml_ext.source_hash", "str", "0" * 64),  # set once the source files are hashed
    ]
    return ConversionPlan(ckpt, arch, hp, out_type, tensors, vocab, meta, warnings)


def _model_name(ckpt: Checkpoint) -> str:
    n = ckpt.config.get("_name_or_path") or ckpt.config.get("_model_name_or_path")
    if isinstance(n, str) and n.strip():
        return n.strip().rstrip("/").split("/")[-1]
    return ckpt.folder.resolve().name


def _plan_tensors(ckpt: Checkpoint, arch: Arch, hp: HParams) -> list[Plan]:
    shapes = arch.shapes(hp)
    tied_cfg = ckpt.config.get("tie_word_embeddings")
    tied = arch.tie_default if tied_cfg is None else bool(tied_cfg)
    if arch.always_tied and not tied:
        raise ConversionError(f"{arch.hf_class} with tie_word_embeddings=false: llama.cpp's {arch.gguf_arch} always "
                              "uses the token embedding as output layer")
    ignore = [re.compile(r) for r in arch.ignore]
    plans: list[Plan] = []
    seen: set[tuple[str, int | None]] = set()
    unknown: list[str] = []
    for ref in ckpt:
        if any(r.match(ref.name) for r in ignore):
            continue
        if ref.name == "lm_head.weight" and tied:
            continue  # tied: transformers uses the embedding for the output, whatever lm_head holds
        gguf = arch.gguf_name(ref.name)
        if gguf is None:
            unknown.append(ref.name)
            continue
        key, layer = _layer_key(arch, ref.name)
        if layer is not None and layer >= hp.n_layer:
            raise ConversionError(f"tensor {ref.name} belongs to layer {layer}, but config.json says "
                                  f"num_hidden_layers={hp.n_layer}")
        want = shapes.get(key)
        if want is not None and tuple(ref.shape) != tuple(want):
            raise ConversionError(f"tensor {ref.name} has shape {list(ref.shape)}, but config.json implies "
                                  f"{list(want)} for {arch.hf_class}")
        seen.add((key, layer))
        plans.append(Plan(gguf, ref.name, tuple(ref.shape)))
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ConversionError(f"{arch.hf_class}: tensors the converter does not know where to put: "
                              f"{', '.join(unknown[:5])}{more}")
    missing = [k for k in arch.global_map if (k, None) not in seen and k not in arch.optional]
    missing += [f"model.layers.{i}.{k}" for i in range(hp.n_layer) for k in arch.layer_map
                if (k, i) not in seen and k not in arch.optional]
    if not tied and "lm_head.weight" in arch.global_map and ("lm_head.weight", None) not in seen:
        missing.append("lm_head.weight (tie_word_embeddings is false)")
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ConversionError(f"{arch.hf_class}: missing tensors {', '.join(missing[:5])}{more}")
    for gguf, data in arch.extra_tensors(hp):
        plans.append(Plan(gguf, None, tuple(data.shape), data=data))
    plans.sort(key=lambda p: _order(p.gguf_name))
    return plans


def _transform(arch: Arch, hp: HParams, p: Plan, x: np.ndarray) -> np.ndarray:
    if arch.permute_qk and p.hf_name is not None:
        if p.hf_name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            x = permute_qk(x, hp.n_head)
        elif p.hf_name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            x = permute_qk(x, hp.n_head_kv)
    if arch.norm_offset and p.hf_name is not None and p.hf_name.endswith("norm.weight"):
        x = x + np.float32(arch.norm_offset)
    return x


def convert(model_dir: str | os.PathLike, output: str | os.PathLike, type: str | None = None, *,  # noqa: A002
            options: ConvertOptions | None = None, **fields: Any) -> ConversionResult:
    """Convert the Hugging Face model folder ``model_dir`` to the GGUF file ``output``.

    How is ``options`` (:class:`ConvertOptions`, whose fields document every choice). The keyword form
    builds it: ``type`` and ``fields`` are its fields (``convert(d, out, "q4_0", method="gptq")``), and
    given with ``options`` they replace those fields; a keyword that is no field is a TypeError.
    Raises :class:`ConversionError`; on any error no output file exists.
    """
    o = options if options is not None else ConvertOptions()
    if type is not None:
        fields["type"] = type
    if fields:
        o = o.replace(**fields)
    return _convert(model_dir, output, o)


def _convert(model_dir: str | os.PathLike, output: str | os.PathLike, o: ConvertOptions) -> ConversionResult:
    """:func:`convert` with its options resolved."""
    from .. import methods
    from ..calibrate.imatrix import Imatrix, ImatrixError, load as load_imatrix

    warn = o.warn
    im = None
    if o.imatrix is not None:
        try:
            im = o.imatrix if isinstance(o.imatrix, Imatrix) else load_imatrix(o.imatrix)
        except ImatrixError as e:
            raise ConversionError(str(e)) from None
    method = o.method
    if method is None:  # the codebook types weigh their error by activation importance (the paper's objective)
        method = "act-importance" if str(o.type).lower() in CODEBOOK_RECIPES and im is None else "rtn"
    options = {} if o.iq4_nl_weighting == "default" else {"iq4_nl_weighting": o.iq4_nl_weighting}
    options.update(o.method_options or {})
    try:
        quantizer = methods.create(method, **options)
    except methods.MethodError as e:
        raise ConversionError(str(e)) from None
    needs = tuple(getattr(quantizer, "calibration_needs", ()))
    out_type = o.type if o.type is not None else getattr(quantizer, "default_type", "f16")
    if not needs and (o.calib is not None or o.calib_samples is not None or o.calib_seq_len is not None):
        raise ConversionError(f"--calib is for methods that calibrate (method {method!r} does not); "
                              "for an importance matrix use --imatrix")
    # a calibrating method has what llama-quantize's imatrix gives: the same type mix as with one
    pl = plan(model_dir, out_type, keep=o.keep, name=o.name, vocab_only=o.vocab_only,
              has_imatrix=im is not None or bool(needs), pre_tokenizer=o.pre_tokenizer, warn=warn)
    supports = getattr(quantizer, "supports", None)
    if needs and supports is not None and not supports(OUTPUT_TYPES[pl.out_type]):
        raise ConversionError(f"{method} cannot round to {OUTPUT_TYPES[pl.out_type]} (--type {pl.out_type}); "
                              f"it supports {', '.join(getattr(quantizer, 'types', ()))}")
    out = Path(output)
    if needs and out.exists() and not o.force:  # said before minutes of calibration, not after
        raise ConversionError(f"{out} exists; pass --force (force=True) to replace it")
    precomputed: dict[str, np.ndarray] = {}
    fisher = None
    if "fisher" in needs and not o.vocab_only:
        fisher = _fisher(pl, method, calib=o.calib, n_samples=o.calib_samples, seq_len=o.calib_seq_len,
                         device=o.calib_device, progress=o.calib_progress)
    elif needs and not o.vocab_only:
        precomputed = _calibrate(pl, quantizer, method, needs, calib=o.calib, n_samples=o.calib_samples,
                                 seq_len=o.calib_seq_len, device=o.calib_device, threads=o.threads,
                                 progress=o.calib_progress)
        fallback = getattr(quantizer, "rtn_fallback", None)
        if fallback:
            msg = (f"method {method!r} has no rounding grid for the types of {len(fallback)} layer matrices "
                   f"({', '.join(fallback[:3])}{', ...' if len(fallback) > 3 else ''}): they were quantized RTN")
            pl.warnings.append(msg)
            (warn or log.warning)(msg)
    try:
        digest, no_imatrix = _write(pl, out, force=o.force, im=im, threads=o.threads, quantizer=quantizer,
                                    method=method, progress=o.progress, precomputed=precomputed, fisher=fisher)
    except GGUFWriteError as e:  # the output exists, its folder is missing...: the user's to fix, as ours
        raise ConversionError(str(e)) from None
    if no_imatrix:
        msg = (f"the imatrix has no entry for {len(no_imatrix)} quantized tensors "
               f"({', '.join(no_imatrix[:3])}{', ...' if len(no_imatrix) > 3 else ''}); "
               "they were quantized without one")
        pl.warnings.append(msg)
        (warn or log.warning)(msg)
    size = out.stat().st_size
    return ConversionResult(out, pl.arch.hf_class, pl.arch.gguf_arch, pl.out_type, len(pl.tensors), pl.type_counts(),
                            size, digest, pl.vocab.pre, pl.warnings)


def _quantized_row_order(arch: Arch, hp: HParams, p: Plan, rows: np.ndarray) -> np.ndarray:
    """The rows of a matrix quantized in the checkpoint's order, put in the GGUF's order (:func:`_transform`
    for matrices: q/k row permutation). Rows are quantized independently, so permuting whole quantized
    rows equals quantizing the permuted rows."""
    if arch.permute_qk and p.hf_name is not None:
        if p.hf_name.endswith("self_attn.q_proj.weight"):
            return permute_qk(rows, hp.n_head)
        if p.hf_name.endswith("self_attn.k_proj.weight"):
            return permute_qk(rows, hp.n_head_kv)
    return rows


def _calibrate(pl: ConversionPlan, quantizer: Any, method: str, needs: tuple[str, ...], *, calib, n_samples,
               seq_len, device: str, threads: int | None, progress: bool) -> dict[str, np.ndarray]:
    """Step 1b (see the module docstring): stream the decoder layers over the calibration text, quantize
    each layer's planned matrices with its statistics, feed the quantized layer's output onward.
    Returns GGUF name -> the tensor's bytes (GGUF row order)."""
    from .. import quants
    from ..calibrate import data
    from ..calibrate.collect import CalibrationError, Collector
    from ..calibrate.stream import LayerStream, StreamError
    from ..methods import MethodError
    import torch

    flows = tuple(getattr(quantizer, "workflows", ()))   # a method's parallel workflows (ooc: gptq, ooc)
    n_val = int(getattr(quantizer, "validation_samples", 0)) if flows else 0
    n_cal = n_samples or data.DEFAULT_SAMPLES
    try:
        tokens = data.tokenize(pl.checkpoint.folder, calib, n_samples=n_cal + n_val,
                               seq_len=seq_len or data.DEFAULT_SEQ_LEN)
    except (FileNotFoundError, ValueError) as e:
        raise ConversionError(f"calibration text for method {method!r}: {e}") from None
    ids, held_out = tokens.ids, None
    if n_val:   # validation windows spread over the text, the others calibrate
        val = np.unique(np.linspace(0, n_cal + n_val - 1, n_val).round().astype(np.int64))
        keep = np.setdiff1d(np.arange(n_cal + n_val), val)
        ids, held_out = tokens.ids[torch.from_numpy(keep)], tokens.ids[torch.from_numpy(val)]
    by_hf = {p.hf_name: p for p in pl.tensors if p.hf_name is not None}
    by_gguf = {p.gguf_name: p for p in pl.tensors}
    try:
        stream = LayerStream(pl.checkpoint.folder, device=device, attention_weights=any(n in needs for n in ("attn_hessian", "key_hessian")))
    except StreamError as e:
        raise ConversionError(f"method {method!r} cannot calibrate this model: {e}") from None
    collector = Collector(needs)
    done_by_flow: dict[str, dict[str, np.ndarray]] = {f: {} for f in (flows or ("",))}
    effective = getattr(quantizer, "effective_weight", None)

    def on_layer(index: int, layer, prefix: str, flow: int = 0) -> bool:
        name = flows[flow] if flows else ""
        done = done_by_flow[name]
        stats = collector.take(prefix)
        changed = False
        for module_name, st in stats.items():
            p = by_hf.get(f"{module_name}.weight")
            if p is None or p.type_name in ("F32", "F16", "BF16"):
                continue
            module = layer.get_submodule(module_name[len(prefix) + 1:])
            rows = np.ascontiguousarray(module.weight.detach().to("cpu", torch.float32).numpy())
            buf = np.empty(rows.shape[0] * quants.row_size(p.type_name, rows.shape[1]), dtype=np.uint8)
            what = f"tensor {p.hf_name} ({p.gguf_name})"
            cal = {**st, "module": module_name}
            if flows:
                cal["flow"] = name
            try:
                written = quantizer.quantize(p.gguf_name, p.type_name, rows, buf, threads=threads, calibration=cal)
            except (quants.QuantError, MethodError) as e:
                raise ConversionError(f"{what}: {e}") from None
            if written != buf.nbytes:
                raise ConversionError(f"{what}: method {method!r} wrote {written} bytes of {buf.nbytes}")
            deq = quants.dequantize(buf, p.type_name, rows.shape[1])
            if effective is not None:   # e.g. ooc: the bytes plus the matrix's column side-car
                deq = effective(p.gguf_name, deq, name)
            module.weight.data.copy_(torch.from_numpy(deq).to(module.weight.dtype))
            done[p.gguf_name] = _quantized_row_order(pl.arch, pl.hparams, p, buf.reshape(rows.shape[0], -1))
            changed = True
        return changed

    try:
        for _ in stream.run(ids, hooks=collector.attach, on_layer=on_layer, progress=progress,
                            flows=max(1, len(flows)), held_out=held_out):
            pass
    except (CalibrationError, StreamError) as e:
        raise ConversionError(f"calibration for method {method!r}: {e}") from None
    if flows:   # the workflows' models judged on the validation windows; the method keeps the better
        try:
            losses = {f: stream.head_loss(stream.final_held[i], held_out) for i, f in enumerate(flows)}
        except StreamError as e:
            raise ConversionError(f"method {method!r}: {e}") from None
        done = done_by_flow[quantizer.choose(losses)]
        for gguf in list(done):
            extra = getattr(quantizer, "companions", lambda n: [])(gguf)
            if extra:
                parts = [done[gguf].reshape(-1)]
                for _n, _t, arr, per_row in extra:
                    a = _quantized_row_order(pl.arch, pl.hparams, by_gguf[gguf], arr) if per_row else arr
                    parts.append(np.ascontiguousarray(a).view(np.uint8).reshape(-1))
                done[gguf] = np.concatenate(parts)
    else:
        done = done_by_flow[""]
    missing = [p.gguf_name for p in pl.tensors
               if p.gguf_name.startswith("blk.") and p.type_name not in ("F32", "F16", "BF16")
               and p.gguf_name not in done]
    if missing:
        raise ConversionError(f"method {method!r}: the layer stream saw no input for {len(missing)} quantized "
                              f"matrices ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    return done


class _FisherSource:
    """The Fisher diagonal of each source weight, from a calibration folder (:mod:`ggml_ext.calibrate.stats`),
    one decoder layer's file loaded at a time, in the GGUF's row order (the weights' own transform)."""

    def __init__(self, pl: ConversionPlan, stats: Any):
        self.pl, self.stats = pl, stats
        self._layer: tuple[int | None, dict] = (-1, {})

    def __call__(self, p: Plan) -> np.ndarray | None:
        if p.hf_name is None:
            return None
        _, index = _layer_key(self.pl.arch, p.hf_name)
        if self._layer[0] != index:
            if index is None:
                self._layer = (None, self.stats.outer())
            else:
                flat = {}
                for module, st in self.stats.layer(index).items():
                    for stat, v in st.items():
                        if stat.endswith("_fisher"):
                            flat[f"{module}.{stat[:-len('_fisher')]}"] = v
                self._layer = (index, flat)
        f = self._layer[1].get(p.hf_name)
        if f is None:
            return None
        return _transform(self.pl.arch, self.pl.hparams, p, np.asarray(f, dtype=np.float32))


def _fisher(pl: ConversionPlan, method: str, *, calib, n_samples, seq_len, device: str,
            progress: bool) -> _FisherSource:
    """Step 1b for methods that need the Fisher diagonal: the calibration engine's streamed Fisher over the
    calibration text (cached under the ggml-ext cache by model, text and sampling: a second conversion with
    the same inputs reads it back)."""
    from ..calibrate import data, stats
    from ..calibrate.collect import CalibrationError
    from ..calibrate.stream import StreamError
    try:
        st = stats.collect(pl.checkpoint.folder, text=calib, what=("fisher",),
                           n_samples=n_samples or data.DEFAULT_SAMPLES, seq_len=seq_len or data.DEFAULT_SEQ_LEN,
                           device=device, progress=progress)
    except (FileNotFoundError, ValueError) as e:
        raise ConversionError(f"calibration text for method {method!r}: {e}") from None
    except (StreamError, CalibrationError) as e:
        raise ConversionError(f"method {method!r} cannot calibrate this model: {e}") from None
    return _FisherSource(pl, st)


def _layout(quantizer: Any, p: Plan, ggml_shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], str, int]] | None:
    """The tensors a method writes for one planned matrix, when it writes its own (``tensors``, e.g.
    anyprec's bitplanes and tables): [(gguf name, ggml shape, ggml type name, bytes)], else None."""
    if p.type_name in ("F32", "F16", "BF16"):
        return None
    comp = getattr(quantizer, "companions", None)
    extra = comp(p.gguf_name) if comp is not None else []
    if extra:   # the matrix in its type, then companion tensors (ooc: the column side-car)
        from .. import quants
        nrows = int(np.prod(ggml_shape[1:]))
        return [(p.gguf_name, ggml_shape, p.type_name, nrows * quants.row_size(p.type_name, ggml_shape[0]))] + \
            [(n, tuple(reversed(a.shape)), t, a.nbytes) for n, t, a, _ in extra]
    f = getattr(quantizer, "tensors", None)
    return None if f is None else f(p.gguf_name, p.type_name, ggml_shape)


def _write(pl: ConversionPlan, out: Path, *, force: bool, im: Any, threads: int | None, quantizer: Any, method: str,
           progress: Callable[[int, int, str], None] | None,
           precomputed: dict[str, np.ndarray] | None = None,
           fisher: Callable[[Plan], np.ndarray | None] | None = None) -> tuple[str, list[str]]:
    """Stream ``pl``'s tensors into ``out``, each quantized matrix through ``quantizer`` (the method
    ``method``) unless ``precomputed`` (from :func:`_calibrate`) holds its bytes already; returns the
    source hash and the quantized tensors the imatrix missed. ``fisher``: a matrix's Fisher diagonal
    (GGUF row order), handed to the method as ``calibration={"fisher": F}``. A method with ``tensors``
    may write a matrix as several tensors of its own (:func:`_layout`): its ``quantize`` then fills
    their bytes, concatenated, into ``out``."""
    precomputed = precomputed or {}
    from .. import quants
    from ..calibrate.imatrix import ImatrixError
    from ..methods import MethodError

    no_imatrix: list[str] = []
    writer = GGUFWriter(out, force=force)
    for key, vtype, value in pl.metadata:
        writer.add(key, vtype, value)
    for key, vtype, value in getattr(quantizer, "metadata", lambda: [])():  # a method's own keys (anyprec)
        writer.add(key, vtype, value)
    layouts: dict[str, list] = {}
    for p in pl.tensors:
        ggml_shape = tuple(reversed(p.shape))
        nrows = int(np.prod(ggml_shape[1:])) if len(ggml_shape) > 1 else 1
        own = _layout(quantizer, p, ggml_shape)
        if own is not None:
            layouts[p.gguf_name] = own
            for name, shape, tname, nbytes in own:
                writer.add_tensor_info(name, shape, quants.type_id(tname), nbytes)
            continue
        writer.add_tensor_info(p.gguf_name, ggml_shape, quants.type_id(p.type_name),
                               nrows * quants.row_size(p.type_name, ggml_shape[0]))

    stop = threading.Event()
    total = pl.total_elements
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="source-hash") as hasher:
        fut = hasher.submit(pl.checkpoint.source_hash, None, stop.is_set)
        try:
            with writer:
                done = 0
                for p in pl.tensors:
                    x = p.data if p.data is not None else pl.checkpoint.load(p.hf_name)
                    x = _transform(pl.arch, pl.hparams, p, np.asarray(x, dtype=np.float32))
                    what = f"tensor {p.hf_name} ({p.gguf_name})" if p.hf_name else f"tensor {p.gguf_name}"
                    lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)  # no temporaries
                    if not (math.isfinite(lo) and math.isfinite(hi)):  # min/max are NaN if any value is
                        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
                        raise ConversionError(f"{what} holds {bad} NaN or infinite values; refusing to convert")
                    peak = max(hi, -lo)
                    if p.type_name == "F16" and peak > _F16_MAX:
                        raise ConversionError(f"{what} has values up to {peak:g}, beyond float16's range: "
                                              f"use --type bf16/f32 or --keep '{p.gguf_name}=f32'")
                    rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1))
                    own = layouts.get(p.gguf_name)
                    size = (sum(t[3] for t in own) if own is not None
                            else rows.shape[0] * quants.row_size(p.type_name, rows.shape[1]))
                    buf = np.empty(size, dtype=np.uint8)
                    weights = None
                    plain = p.type_name in ("F32", "F16", "BF16")  # converted by ggml, not quantized by a method
                    if im is not None and not plain and rows.shape[0] > 1:
                        try:
                            weights = im.for_tensor(p.gguf_name, rows.shape[1])
                        except ImatrixError as e:
                            raise ConversionError(str(e)) from None
                        if weights is None:
                            no_imatrix.append(p.gguf_name)
                    try:
                        if plain:
                            written = quants.quantize_rows_into(p.type_name, rows, buf, threads=threads)
                        elif p.gguf_name in precomputed:  # quantized during calibration (step 1b)
                            buf = np.ascontiguousarray(precomputed.pop(p.gguf_name)).reshape(-1)
                            written = buf.nbytes
                        else:
                            f = fisher(p) if fisher is not None else None
                            written = quantizer.quantize(p.gguf_name, p.type_name, rows, buf, imatrix=weights,
                                                         threads=threads,
                                                         calibration=None if f is None else {"fisher": f})
                    except (quants.QuantError, MethodError) as e:
                        raise ConversionError(f"{what}: {e}") from None
                    if written != buf.nbytes:
                        raise ConversionError(f"{what}: method {method!r} wrote {written} bytes of {buf.nbytes} "
                                              f"({p.type_name})")
                    # the f16 block scales of the quantized types (and BF16's own range) can overflow to inf,
                    # only for values beyond float16's range: ggml's row check finds them (llama.cpp refuses
                    # such a file when it checks tensors, and computes NaN when it does not)
                    if own is None and peak > _F16_MAX and p.type_name != "F32" and not quants.validate(p.type_name, buf):
                        raise ConversionError(f"{what} has values up to {peak:g}: too large for {p.type_name} "
                                              f"(they overflow to inf): use --type f32 or --keep '{p.gguf_name}=f32'")
                    del x, rows
                    if own is None:
                        writer.write_tensor(buf)
                    else:
                        at = 0
                        for _name, _shape, _tname, nbytes in own:
                            writer.write_tensor(buf[at:at + nbytes])
                            at += nbytes
                    del buf
                    done += int(np.prod(p.shape))
                    if progress:
                        progress(done, total, p.gguf_name)
                digest = fut.result()
                if digest is None:
                    raise ConversionError("hashing the source files was interrupted")
                writer.set("ggml_ext.source_hash", digest)
        except BaseException:
            stop.set()
            raise
        finally:
            pl.checkpoint.close()
    return digest, no_imatrix
