"""`ggml-ext calibrate dec`: QDEC's offline step, a GGUF side file of residuals and bucket boundaries.

    ggml-ext calibrate dec BASE.gguf --hf HF_DIR -o OUT.dec.gguf [--text wiki-train] [--samples 16]
                                     [--seq-len 512] [--device cpu]

For every linear weight of the decoder layers that the base GGUF holds (any quantized type llama.cpp can
dequantize):

1. Ŵ = the base tensor dequantized by ggml; W = the Hugging Face weight, in the GGUF's row order (the
   converter's Q/K permutation for llama); R = W − Ŵ, quantized per output channel to symmetric 4 bits
   with a grid-searched scale and packed input-channel-major (:mod:`.residual`);
2. the calibration text runs through the Hugging Face model one decoder layer at a time
   (:class:`ggml_ext.calibrate.stream.LayerStream`); at each linear's input, per 1024-channel chunk of
   every token: b0 = the largest |x| seen, b15[k] = the largest k-th largest |x| (k in :data:`K_GRID`),
   and the mean |x| per channel (the static selection's ranking).

The side file (written atomically by :class:`ggml_ext.gguf.GGUFWriter`), for each linear ``N`` (its GGUF
name): ``N.dec_r`` I8 [ceil(M/2), K] (the packed codes: what DEC_MUL_MAT's ``r`` takes), ``N.dec_scale``
F32 [M], ``N.dec_bounds`` F32 [1 + len(K_GRID)] (b0, then b15 per k), ``N.dec_act`` F32 [K]; metadata
``qdec.*``: format version, the base GGUF's and the checkpoint's digests, ``k_chunks``, ``chunk``, ``bits``,
calibration text and size. :func:`load` checks all of it.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import BITS, CHUNK, K_GRID, residual

__all__ = ["DecError", "DecSideFile", "calibrate", "rebase", "load", "add_arguments", "main", "DEFAULT_SAMPLES",
           "DEFAULT_SEQ_LEN"]

FORMAT_VERSION = 1
DEFAULT_SAMPLES = 16
DEFAULT_SEQ_LEN = 512
GGML_F32, GGML_I8 = 0, 24


class DecError(ValueError):
    """A QDEC calibration that cannot be made or used: base and model disagree, a tensor is missing or
    non-finite, a side file is malformed or made for another model."""


@dataclass
class DecLinear:
    """One linear's compensation data (GGUF row order): packed codes [K, ceil(M/2)] uint8, scales [M],
    bounds [1 + len(k_chunks)] (b0, b15 per k), act [K] (calibration mean |x|)."""
    M: int
    K: int
    packed: np.ndarray
    scales: np.ndarray
    bounds: np.ndarray
    act: np.ndarray

    def codes(self) -> np.ndarray:
        return residual.unpack(self.packed, self.M)

    def residual(self) -> np.ndarray:
        return residual.dequantize(self.codes(), self.scales)

    def b0(self) -> float:
        return float(self.bounds[0])

    def b15(self, k_chunks: list[int], k: int) -> float:
        """b15 for k_chunk ``k``: the stored one, else that of the next larger stored k (a lower bound
        is safer than a higher one: it spreads more buckets over the magnitudes that matter)."""
        ks = list(k_chunks)
        for i, kk in enumerate(ks):
            if kk >= k:
                return float(self.bounds[1 + i])
        return float(self.bounds[len(ks)])


@dataclass
class DecSideFile:
    meta: dict
    linears: dict[str, DecLinear] = field(default_factory=dict)

    @property
    def k_chunks(self) -> list[int]:
        return [int(k) for k in self.meta["k_chunks"]]

    def save(self, path: str | os.PathLike, force: bool = False) -> None:
        from ggml_ext.gguf import GGUFWriter
        w = GGUFWriter(path, force=force)
        w.add("general.type", "str", "qdec")
        w.add("qdec.format_version", "u32", FORMAT_VERSION)
        w.add_values("qdec", self.meta)
        order = []
        for name in sorted(self.linears):
            d = self.linears[name]
            for suffix, a, shape, tid in (
                    ("dec_r", d.packed, (d.packed.shape[1], d.K), GGML_I8),
                    ("dec_scale", d.scales, (d.M,), GGML_F32),
                    ("dec_bounds", d.bounds, (d.bounds.size,), GGML_F32),
                    ("dec_act", d.act, (d.K,), GGML_F32)):
                a = np.ascontiguousarray(a, dtype=np.uint8 if tid == GGML_I8 else "<f4")
                w.add_tensor_info(f"{name}.{suffix}", shape, tid, a.nbytes)
                order.append(a)
        with w:
            for a in order:
                w.write_tensor(a)


def load(path: str | os.PathLike, base: str | os.PathLike | None = None) -> DecSideFile:
    """Read and validate a side file; with ``base``, refuse it unless it was made from that GGUF."""
    from ggml_ext.gguf import GGUFError, read_gguf
    try:
        g = read_gguf(path)
    except (GGUFError, OSError) as e:
        raise DecError(f"{path}: not a readable GGUF file ({e})") from None
    if g.kv.get("general.type") != "qdec":
        raise DecError(f"{path}: not a QDEC side file (general.type {g.kv.get('general.type')!r}); "
                       f"make one with `ggml-ext calibrate dec`")
    from ggml_ext.formats import versions
    why = versions.version_problem(g.kv, "qdec.format_version", path, required=True)
    if why:
        raise DecError(why)
    meta = {k[5:]: (list(v) if not isinstance(v, (str, int)) else v) for k, v in g.kv.items()
            if k.startswith("qdec.") and k != "qdec.format_version"}
    for need in ("k_chunks", "chunk", "bits", "base_sha256", "model_sha256"):
        if need not in meta:
            raise DecError(f"{path}: metadata qdec.{need} missing")
    if int(meta["chunk"]) != CHUNK or int(meta["bits"]) != BITS:
        raise DecError(f"{path}: chunk {meta['chunk']} / {meta['bits']} bits; this version uses {CHUNK} / {BITS}")
    if base is not None and _sha256(base) != meta["base_sha256"]:
        raise DecError(f"{path} was made from another base GGUF than {base} (sha256 {meta['base_sha256'][:12]})")
    side = DecSideFile(meta)
    parts: dict[str, dict] = {}
    with open(path, "rb") as f:
        for t in g.tensors:
            name, _, suffix = t.name.rpartition(".")
            if suffix not in ("dec_r", "dec_scale", "dec_bounds", "dec_act"):
                raise DecError(f"{path}: unexpected tensor {t.name}")
            f.seek(t.file_offset)
            raw = f.read(t.nbytes)
            a = np.frombuffer(raw, dtype=np.uint8 if suffix == "dec_r" else "<f4").copy()
            if suffix != "dec_r" and not np.isfinite(a).all():
                raise DecError(f"{path}: tensor {t.name} holds non-finite values")
            parts.setdefault(name, {})[suffix] = (a, tuple(t.shape), t.type_id)
    nk = len(meta["k_chunks"])
    for name, p in parts.items():
        if len(p) != 4:
            raise DecError(f"{path}: {name} lacks {', '.join(sorted({'dec_r', 'dec_scale', 'dec_bounds', 'dec_act'} - set(p)))}")
        (r, rs, rt), (s, ss, _), (b, bs, _), (act, as_, _) = (p["dec_r"], p["dec_scale"], p["dec_bounds"], p["dec_act"])
        M, K = ss[0], as_[0]
        if rt != GGML_I8 or rs != ((M + 1) // 2, K) or bs != (1 + nk,):
            raise DecError(f"{path}: {name}: dec_r {rs} type {rt}, dec_bounds {bs} do not fit M={M}, K={K}")
        side.linears[name] = DecLinear(M, K, r.reshape(K, (M + 1) // 2), s, b, act)
    return side


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _unpermute_rows(arch, hp, hf_name: str, w: np.ndarray) -> np.ndarray:
    """GGUF rows of a Q/K weight back to Hugging Face's order (the inverse of the converter's permute_qk)."""
    if not arch.permute_qk:
        return w
    if hf_name.endswith("self_attn.q_proj.weight"):
        n = hp.n_head
    elif hf_name.endswith("self_attn.k_proj.weight"):
        n = hp.n_head_kv
    else:
        return w
    hd = w.shape[0] // n
    return w.reshape(n, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def linear_map(base: str | os.PathLike, model_dir: str | os.PathLike, layers=None):
    """[(hf module name, hf weight name, gguf name, TensorInfo)] of the decoder-layer linears the base GGUF
    holds (of the decoder layers in ``layers`` only, when given), plus (arch, hparams, checkpoint).
    Refuses a base made from another model."""
    from ggml_ext.converters.archs import HParams, find_arch
    from ggml_ext.converters.source import open_checkpoint
    from ggml_ext.gguf import GGUFError, read_gguf
    ckpt = open_checkpoint(model_dir)
    arch = find_arch(ckpt.config)
    hp = HParams(ckpt.config, lambda m: None)
    try:
        g = read_gguf(base)
    except (GGUFError, OSError) as e:
        raise DecError(f"{base}: not a readable GGUF file ({e})") from None
    by_name = {t.name: t for t in g.tensors}
    out = []
    for hf_name, info in sorted(ckpt.tensors.items()):
        if not hf_name.startswith("model.layers.") or not hf_name.endswith(".weight") or len(info.shape) != 2:
            continue
        gname = arch.gguf_name(hf_name)
        if gname is None or gname.endswith("norm.weight"):
            continue
        if layers is not None and int(hf_name.split(".")[2]) not in layers:
            continue
        t = by_name.get(gname)
        if t is None:
            raise DecError(f"{base}: no tensor {gname} (the base of {hf_name}); is it a GGUF of this model?")
        if tuple(t.shape) != tuple(reversed(info.shape)):
            raise DecError(f"{base}: {gname} has shape {tuple(t.shape)} (ggml order), {model_dir} has "
                           f"{hf_name} {tuple(info.shape)}: the base is not a GGUF of this model")
        out.append((hf_name[:-len(".weight")], hf_name, gname, t))
    if not out:
        raise DecError(f"{model_dir}: no decoder-layer linear weights found")
    return out, arch, hp, ckpt


def base_weight(base: str | os.PathLike, t) -> np.ndarray:
    """Ŵ: the base tensor ``t`` dequantized by ggml, float32 [M, K] in GGUF row order."""
    from ggml_ext import quants
    with open(base, "rb") as f:
        f.seek(t.file_offset)
        raw = f.read(t.nbytes)
    w = quants.dequantize(raw, t.type_id, t.shape[0])
    if not np.isfinite(w).all():
        raise DecError(f"{base}: {t.name} ({t.type_name}) dequantizes to non-finite values")
    return w


class _Bounds:
    """Forward pre-hooks on a layer's linears: b0, b15 per k of :data:`K_GRID`, Σ|x| and rows per input."""

    def __init__(self, names: set[str]):
        self.names = names
        self.stats: dict[str, dict] = {}

    def attach(self, index, layer, prefix):
        import torch
        handles = []

        def make(name):
            def hook(module, args):
                x = args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float32)
                if not bool(torch.isfinite(x).all()):
                    raise DecError(f"non-finite activations at the input of {name}")
                a = x.abs()
                s = self.stats.setdefault(name, {"b0": 0.0, "b15": np.zeros(len(K_GRID)),
                                                 "sum": torch.zeros(a.shape[1], dtype=torch.float64), "rows": 0})
                s["b0"] = max(s["b0"], float(a.max()))
                s["sum"] += a.sum(0, dtype=torch.float64)
                s["rows"] += a.shape[0]
                for c in range(0, a.shape[1], CHUNK):
                    part = a[:, c:c + CHUNK]
                    top = torch.topk(part, min(max(K_GRID), part.shape[1]), dim=1).values  # descending
                    for i, k in enumerate(K_GRID):
                        s["b15"][i] = max(s["b15"][i], float(top[:, min(k, part.shape[1]) - 1].max()))
            return hook

        for path, m in layer.named_modules():
            full = f"{prefix}.{path}"
            if isinstance(m, torch.nn.Linear) and full in self.names:
                handles.append(m.register_forward_pre_hook(make(full)))
        return lambda: [h.remove() for h in handles]


def calibrate(base: str | os.PathLike, model_dir: str | os.PathLike, text: str | os.PathLike | None = None,
              n_samples: int = DEFAULT_SAMPLES, seq_len: int = DEFAULT_SEQ_LEN, device: str = "cpu",
              progress: bool = True, layers=None) -> DecSideFile:
    """The QDEC side file's contents for ``base`` (a GGUF of the model in ``model_dir``); ``layers``: the
    decoder layers to cover (default all; a side file may cover a subset, the rest run uncompensated)."""
    from tqdm.auto import tqdm

    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.stream import LayerStream
    linears, arch, hp, ckpt = linear_map(base, model_dir, layers)
    tokens = tokenize(model_dir, text, n_samples, seq_len)
    st = LayerStream(model_dir, device=device)
    col = _Bounds({m for m, *_ in linears})
    for _ in st.run(tokens.ids, hooks=col.attach, progress=progress):
        pass
    side = DecSideFile({"k_chunks": list(K_GRID), "chunk": CHUNK, "bits": BITS,
                        "base_sha256": _sha256(base), "model_sha256": ckpt.source_hash(),
                        "model_id": Path(model_dir).name, "calib_text": Path(tokens.text_path).name,
                        "calib_samples": n_samples, "calib_seq_len": seq_len,
                        # each covered weight's ggml type in the base: the runtime refuses a side file whose
                        # residuals were computed against another quantization of the same shapes
                        "base_types": [f"{gname}:{t.type_id}" for _, _, gname, t in linears]})
    for module, hf_name, gname, t in tqdm(linears, desc="residuals", unit="linear", disable=not progress):
        s = col.stats.get(module)
        if s is None:
            raise DecError(f"{module}: the calibration never reached this linear")
        W = ckpt.load(hf_name).astype(np.float32)
        if not np.isfinite(W).all():
            raise DecError(f"{model_dir}: {hf_name} holds non-finite weights")
        W_gguf = _permute_rows(arch, hp, hf_name, W)
        R = W_gguf - base_weight(base, t)
        q, scales = residual.quantize(R)
        # the channel statistics are in input order, which the permutation (rows only) leaves alone
        side.linears[gname] = DecLinear(R.shape[0], R.shape[1], residual.pack(q), scales,
                                        np.array([s["b0"], *s["b15"]], np.float32),
                                        (s["sum"] / max(1, s["rows"])).numpy().astype(np.float32))
    return side


def rebase(side: DecSideFile, base: str | os.PathLike, model_dir: str | os.PathLike,
           progress: bool = False) -> DecSideFile:
    """``side``'s compensation for another base GGUF of the same model: new residuals R = W - Ŵ(base),
    the activation statistics (b0, b15, mean |x|) kept, since the calibration runs the full-precision
    model, not the base. Saves the calibration forward when several bases of one model are compared."""
    from tqdm.auto import tqdm
    linears, arch, hp, ckpt = linear_map(base, model_dir)
    if ckpt.source_hash() != side.meta["model_sha256"]:
        raise DecError(f"the side file was made for another model than {model_dir}")
    out = DecSideFile({**side.meta, "base_sha256": _sha256(base)})
    for module, hf_name, gname, t in tqdm(linears, desc="residuals", unit="linear", disable=not progress):
        d = side.linears.get(gname)
        if d is None:
            continue
        W = _permute_rows(arch, hp, hf_name, ckpt.load(hf_name).astype(np.float32))
        q, scales = residual.quantize(W - base_weight(base, t))
        out.linears[gname] = DecLinear(d.M, d.K, residual.pack(q), scales, d.bounds, d.act)
    return out


def _permute_rows(arch, hp, hf_name, w):
    from ggml_ext.converters.archs import permute_qk
    if arch.permute_qk and hf_name.endswith("self_attn.q_proj.weight"):
        return permute_qk(w, hp.n_head)
    if arch.permute_qk and hf_name.endswith("self_attn.k_proj.weight"):
        return permute_qk(w, hp.n_head_kv)
    return w


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .._args import ranges
    p.add_argument("base", help="the quantized base model (GGUF) whose error to compensate")
    p.add_argument("--hf", required=True, help="the Hugging Face folder of the same model (the reference weights)")
    p.add_argument("-o", "--output", required=True, help="the side file to write (GGUF)")
    p.add_argument("--text", "--calib", dest="text", default=None,
                   help="calibration text: a file or an asset name (default wiki-train)")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help=f"calibration windows (default {DEFAULT_SAMPLES})")
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"tokens per window (default {DEFAULT_SEQ_LEN})")
    p.add_argument("--device", default="cpu", help="torch device for the calibration forward (cpu, cuda)")
    p.add_argument("--layers", type=ranges(), default=None, help="decoder layers to cover, e.g. 0-3,8 (default all)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite the output")


def main(args: argparse.Namespace) -> int:
    t0 = time.time()
    if Path(args.output).exists() and not args.force:
        print(f"error: {args.output} exists (use --force)", file=sys.stderr)
        return 1
    try:
        side = calibrate(args.base, args.hf, args.text, args.samples, args.seq_len, args.device,
                         layers=args.layers)
        side.save(args.output, force=args.force)
    except DecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {len(side.linears)} linears, k_chunks {side.k_chunks}, {time.time() - t0:.0f} s")
    return 0
