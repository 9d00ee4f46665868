"""`ggml-ext calibrate kv`: KVQuant's offline calibration of a Hugging Face model, saved as a GGUF side file.

    ggml-ext calibrate kv HF_DIR -o OUT.gguf [--text wiki-train] [--samples 16] [--seq-len 2048]
                                             [--bits 2,3,4] [--outliers 0.01] [--device cpu]

What it does, layer by layer (the paper's 4.1.1 setup: 16 samples of 2K tokens of the training text):

1. the Fisher information of the K and V projection outputs (:mod:`ggml_ext.calibrate.fisher`, streamed
   one decoder layer at a time, GQA included): each sample's projection output and its squared gradient
   of the loss, per element;
2. keys (per channel, pre-RoPE: the k_proj output): per-channel thresholds over the calibration tokens,
   min/max (no outliers) and the ``outliers``/2 and 1 - ``outliers``/2 quantiles (dense-and-sparse);
   values (per token): thresholds are computed online at run time, nothing to store;
3. for each bit width and each of (no outliers, outliers): the activations normalised to [-1, 1] by those
   thresholds (outliers left out) and the Fisher-weighted k-means levels (:func:`.quant.fit_nuq`), Q-Norm
   applied for the bit widths in ``qnorm_bits`` (2 by default, as the paper does).

The side file is an ordinary GGUF (written atomically by :class:`ggml_ext.gguf.GGUFWriter`; no pickles):
metadata under ``kvquant.*`` (model digest and id, layers, KV heads, head dim, bits, outlier fraction,
calibration text and size) and float32 tensors per layer ``kvq.<layer>.<name>``; docs/KVQUANT.md lists
them. :meth:`KVCalibration.load` checks every shape and refuses a file made for another model.

Architectures whose attention has a K norm (Gemma-3, Qwen3) are calibrated and simulated at the k_proj
output too: the cached key is then before both the norm and RoPE (the norm is applied with RoPE after
dequantization). A fused QKV projection (Phi-3's qkv_proj, q | k | v) is calibrated on its k and v parts
(:func:`ggml_ext.calibrate.fisher.kv_parts`), which are what llama.cpp's phi3 graph caches.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .quant import fit_nuq, q_norm, quantile_thresholds, token_thresholds

__all__ = ["KVCalibration", "KVCalibrationError", "calibrate", "DEFAULT_BITS", "DEFAULT_OUTLIERS",
           "DEFAULT_SAMPLES", "DEFAULT_SEQ_LEN", "add_arguments", "main"]

FORMAT_VERSION = 1
DEFAULT_BITS = (2, 3, 4)
DEFAULT_OUTLIERS = 0.01
DEFAULT_QNORM_BITS = (2,)
DEFAULT_SAMPLES = 16      # the paper's calibration set: 16 samples of 2K tokens of WikiText-2 train
DEFAULT_SEQ_LEN = 2048
MAX_POINTS = 50_000       # normalised values per k-means fit (a deterministic subsample beyond that)
F32 = 0


class KVCalibrationError(ValueError):
    """A KV calibration that cannot be made or used: wrong model, bad file, unsupported architecture."""


def _torch():
    import torch
    return torch


@dataclass
class KVCalibration:
    """Per-layer KVQuant quantizers of one model. ``layers[i]`` maps tensor names to float32 arrays:
    ``k_lo0``/``k_hi0`` (per-channel key min/max), ``k_lo``/``k_hi`` (per-channel key outlier thresholds),
    ``{k,v}_nuq{b}[_o]`` (the nuq levels, without / with outliers) and ``{k,v}_deq{b}[_o]`` (their
    dequantization values: Q-Normed, or equal to the levels), ``k_fisher``/``v_fisher`` (Fisher per
    channel, for reference); ``meta`` holds the ``kvquant.*`` metadata without its prefix."""

    meta: dict
    layers: list[dict[str, np.ndarray]] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return int(self.meta["n_layers"])

    def levels(self, layer: int, which: str, bits: int, outliers: bool) -> tuple[np.ndarray, np.ndarray]:
        """(rounding levels, dequantization values) of nuq``bits`` for ``which`` ("k" or "v")."""
        tag = f"{bits}" + ("_o" if outliers else "")
        name = f"{which}_nuq{tag}"
        try:
            return self.layers[layer][name], self.layers[layer][f"{which}_deq{tag}"]
        except KeyError:
            raise KVCalibrationError(f"the KV calibration has no {name} for layer {layer} "
                                     f"(calibrated bits: {self.meta['bits']})") from None

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        d = int(self.meta["n_kv_heads"]) * int(self.meta["head_dim"])
        shapes = {n: (d,) for n in ("k_lo", "k_hi", "k_lo0", "k_hi0", "k_fisher", "v_fisher")}
        for b in self.meta["bits"]:
            for kv in "kv":
                for t in ("nuq", "deq"):
                    shapes[f"{kv}_{t}{b}"] = (2 ** int(b),)
                    shapes[f"{kv}_{t}{b}_o"] = (2 ** int(b),)
            for t in ("nuq", "deq"):
                for tag in V_TABLE_TAGS:  # optional (calibrations before them lack them)
                    shapes[f"v_{t}{b}{tag}"] = (2 ** int(b),)
                for tag in K_TABLE_TAGS:
                    shapes[f"k_{t}{b}{tag}"] = (2 ** int(b),)
        return shapes

    # ---------------------------------------------------------------- file
    def save(self, path: str | os.PathLike, force: bool = False) -> None:
        from ggml_ext.gguf import GGUFWriter
        w = GGUFWriter(path, force=force)
        w.add("general.type", "str", "kvquant")
        w.add("kvquant.format_version", "u32", FORMAT_VERSION)
        w.add_values("kvquant", self.meta)
        order = []
        for i, layer in enumerate(self.layers):
            for name in sorted(layer):
                a = np.ascontiguousarray(layer[name], dtype="<f4")
                w.add_tensor_info(f"kvq.{i}.{name}", (a.size,), F32, a.nbytes)
                order.append(a)
        with w:
            for a in order:
                w.write_tensor(a)

    @classmethod
    def load(cls, path: str | os.PathLike, model_dir: str | os.PathLike | None = None) -> "KVCalibration":
        """Read and validate a side file; with ``model_dir``, refuse it unless it was made for that model."""
        from ggml_ext.gguf import GGUFError, read_gguf
        try:
            g = read_gguf(path)
        except (GGUFError, OSError) as e:
            raise KVCalibrationError(f"{path}: not a readable GGUF file ({e})") from None
        if g.kv.get("general.type") != "kvquant":
            raise KVCalibrationError(f"{path}: not a KV calibration (general.type {g.kv.get('general.type')!r}); "
                                     f"make one with `ggml-ext calibrate kv`")
        from ggml_ext.formats import versions
        why = versions.version_problem(g.kv, "kvquant.format_version", path, required=True)
        if why:
            raise KVCalibrationError(why)
        meta = {}
        for k, v in g.kv.items():
            if k.startswith("kvquant.") and k != "kvquant.format_version":
                meta[k[len("kvquant."):]] = list(v) if not isinstance(v, (str, int, float, bool)) else v
        for need in ("n_layers", "n_kv_heads", "head_dim", "bits", "model_sha256"):
            if need not in meta:
                raise KVCalibrationError(f"{path}: metadata kvquant.{need} missing")
        cal = cls(meta, [dict() for _ in range(int(meta["n_layers"]))])
        shapes = cal.expected_shapes()
        with open(path, "rb") as f:
            for t in g.tensors:
                parts = t.name.split(".")
                if len(parts) != 3 or parts[0] != "kvq" or not parts[1].isdigit():
                    raise KVCalibrationError(f"{path}: unexpected tensor {t.name}")
                i, name = int(parts[1]), parts[2]
                if i >= cal.n_layers or name not in shapes:
                    raise KVCalibrationError(f"{path}: unexpected tensor {t.name}")
                if t.type_id != F32 or tuple(t.shape) != shapes[name]:
                    raise KVCalibrationError(f"{path}: tensor {t.name} has shape {tuple(t.shape)} type {t.type_name}, "
                                             f"expected F32 {shapes[name]}")
                f.seek(t.file_offset)
                a = np.frombuffer(f.read(t.nbytes), dtype="<f4").copy()
                if not np.isfinite(a).all():
                    raise KVCalibrationError(f"{path}: tensor {t.name} holds non-finite values")
                cal.layers[i][name] = a
        optional = {n for n in shapes if (n.startswith("v_") and n.endswith(V_TABLE_TAGS))
                    or (n.startswith("k_") and n.endswith(K_TABLE_TAGS))}
        for i, layer in enumerate(cal.layers):
            missing = sorted(set(shapes) - optional - set(layer))
            if missing:
                raise KVCalibrationError(f"{path}: layer {i} lacks {', '.join(missing)}")
        if model_dir is not None:
            cal.check_model(model_dir, path)
        return cal

    def check_model(self, model_dir: str | os.PathLike, path: str | os.PathLike = "the KV calibration") -> None:
        """Refuse a calibration made for another model (by checkpoint digest and shapes)."""
        from ggml_ext.converters.source import open_checkpoint
        digest = open_checkpoint(model_dir).source_hash()
        if digest != self.meta["model_sha256"]:
            raise KVCalibrationError(
                f"{path} was calibrated for model {self.meta.get('model_id')!r} (sha256 {self.meta['model_sha256'][:12]}), "
                f"not {Path(model_dir).name!r} (sha256 {digest[:12]}); calibrate this model with `ggml-ext calibrate kv`")

    def check_config(self, config) -> None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        n = text.num_hidden_layers
        kvh = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        hd = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        if (n, kvh, hd) != (self.n_layers, int(self.meta["n_kv_heads"]), int(self.meta["head_dim"])):
            raise KVCalibrationError(
                f"the KV calibration is for {self.n_layers} layers x {self.meta['n_kv_heads']} KV heads x head dim "
                f"{self.meta['head_dim']} ({self.meta.get('model_id')!r}), the model has {n} x {kvh} x {hd}")


def _model_shape(model_dir) -> tuple[str, int, int, int]:
    from transformers import AutoConfig
    c = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    t = c.get_text_config()
    kvh = getattr(t, "num_key_value_heads", None) or t.num_attention_heads
    hd = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    return t.model_type, t.num_hidden_layers, kvh, hd


VBLOCK = 64              # llama.cpp's NUQ value block (one scale per 64 values of a token)
V_TABLE_TAGS = ("_b", "_bo", "_r", "_ro")  # the block tables: plain / one outlier slot, unrotated / Hadamard-rotated
K_TABLE_TAGS = ("_r", "_ro",  # keys after RoPE, Hadamard-rotated, in 64-value blocks (GGML_EXT_KV_KROT=1)
                "_h", "_ho")  # keys before RoPE, per channel and then per 64-channel block (GGML_EXT_KV_KBLOCK=1)


def hadamard(n: int = VBLOCK) -> np.ndarray:
    """The orthonormal Sylvester-Walsh-Hadamard matrix of order n (symmetric, H @ H = I): the rotation
    llama.cpp applies to a quantized V cache per 64 channels (``attn_rot_v``), ``1/sqrt(n)`` times +-1."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    if h.shape[0] != n:
        raise ValueError(f"hadamard: order {n} is not a power of two")
    return h / np.sqrt(n)


def rotate_blocks(x, n: int = VBLOCK):
    """Each token's channels, n at a time, times the order-n Hadamard matrix (llama.cpp's V rotation)."""
    torch = _torch()
    h = torch.as_tensor(hadamard(n), dtype=x.dtype)
    return (x.reshape(-1, n) @ h).reshape(x.shape)


def block_normalised(x, slot: bool):
    """Values normalised as llama.cpp's NUQ value blocks are written (src/backend/kvquant_base.c): per 64
    values of a token mid / half from the min and max, with ``slot`` after taking out the block's minimum
    or maximum, whichever leaves the narrower range (it goes to the block's outlier slot). Returns the
    normalised values (blocks x 64) and the mask of those quantized densely (all but the slot's)."""
    torch = _torch()
    b = x.reshape(-1, VBLOCK)
    keep = torch.ones_like(b, dtype=torch.bool)
    if slot:
        s, _ = b.sort(-1)
        drop_max = (s[:, -1] - s[:, -2]) >= (s[:, 1] - s[:, 0])
        idx = torch.where(drop_max, b.argmax(-1), b.argmin(-1))
        keep[torch.arange(b.shape[0]), idx] = False
    inf = torch.tensor(float("inf"), dtype=b.dtype)
    lo = torch.where(keep, b, inf).amin(-1, keepdim=True)
    hi = torch.where(keep, b, -inf).amax(-1, keepdim=True)
    mid, half = (hi + lo) / 2, ((hi - lo) / 2).clamp_min(1e-8)
    return (b - mid) / half, keep


def key_rotation(head_dim: int) -> int:
    """The order of llama.cpp's Hadamard rotation of K (``build_input_k_rot``): the largest power of two
    dividing the head dimension."""
    n = 1
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def rope_default(model_dir) -> float | None:
    """The RoPE base of a model with plain RoPE on every channel (``rope_type`` default, no partial rotation),
    else None (no rotated key tables: their keys would need the model's own RoPE variant)."""
    from transformers import AutoConfig
    t = AutoConfig.from_pretrained(model_dir, local_files_only=True).get_text_config()
    rp = getattr(t, "rope_parameters", None) or getattr(t, "rope_scaling", None) or {}
    if isinstance(rp, dict) and set(rp) - {"rope_theta", "rope_type"}:
        return None  # per-layer-type dicts (Gemma-3) or scaled RoPE
    if (rp.get("rope_type") or "default") != "default" or (getattr(t, "partial_rotary_factor", None) or 1) != 1:
        return None
    theta = rp.get("rope_theta") or getattr(t, "rope_theta", None)
    return float(theta) if theta else None


def keys_as_cached_rotated(x, head_dim: int, theta: float, permuted: bool):
    """Keys (or their gradients: RoPE and the rotation are orthogonal) of one sequence, tokens x channels at
    positions 0, 1, ..., as llama.cpp caches them with GGML_EXT_KV_KROT=1: roped (HF's rotate-half pairs
    (j, j + hd/2)), in the cache's channel order (``permuted``: llama-arch GGUFs interleave the pairs, channel 2j
    <- j, 2j + 1 <- j + hd/2), times the Hadamard matrix of :func:`key_rotation` per head."""
    torch = _torch()
    t, d = x.shape
    h2 = head_dim // 2
    inv = theta ** (-torch.arange(0, h2, dtype=torch.float64) * 2 / head_dim)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    xh = x.double().reshape(t, d // head_dim, head_dim)
    a, b = xh[..., :h2], xh[..., h2:]
    r = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    if permuted:
        r = torch.stack([r[..., :h2], r[..., h2:]], -1).reshape(t, -1, head_dim)
    return rotate_blocks(r.reshape(t, d), key_rotation(head_dim)).to(x.dtype)


def _subsample(n: int, limit: int, seed: int):
    if n <= limit:
        return None
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=limit, replace=False))


def fit_layer(keys, key_fisher, values, value_fisher, bits=DEFAULT_BITS, outliers: float = DEFAULT_OUTLIERS,
              qnorm_bits=DEFAULT_QNORM_BITS, max_points: int = MAX_POINTS, seed: int = 0,
              value_fisher_rot=None, keys_rot=None, key_fisher_rot=None,
              key_order=None) -> dict[str, np.ndarray]:
    """One layer's quantizers from its calibration keys/values (tokens x channels, float tensors) and their
    per-element Fisher information (same shape): the paper's offline part. With ``value_fisher_rot`` (the
    Fisher of the Hadamard-rotated values: the squared gradient, rotated before squaring) and channels a
    multiple of 64, also the value tables of llama.cpp's 64-value blocks (``v_{nuq,deq}B_{b,bo,r,ro}``:
    plain / one outlier slot, unrotated / rotated; :func:`block_normalised`); with ``keys_rot`` and
    ``key_fisher_rot`` (keys as cached with GGML_EXT_KV_KROT=1: :func:`keys_as_cached_rotated`) the key tables
    ``k_{nuq,deq}B_{r,ro}`` of those blocks; with ``key_order`` (the cache's channel order: an index array into
    the calibration's) the tables ``k_{nuq,deq}B_{h,ho}`` of keys normalised per channel (min / max, or the
    outlier thresholds) and then per 64-channel block of a token (GGML_EXT_KV_KBLOCK=1)."""
    torch = _torch()
    k, kf = keys.float(), key_fisher.double()
    v, vf = values.float(), value_fisher.double()
    out: dict[str, np.ndarray] = {"k_fisher": kf.sum(0).float().numpy(), "v_fisher": vf.sum(0).float().numpy()}
    # keys: per-channel thresholds calibrated offline (min/max, and the dense-and-sparse quantiles)
    lo0, hi0 = quantile_thresholds(k, 0.0)
    lo, hi = quantile_thresholds(k, outliers)
    out.update(k_lo0=lo0.numpy(), k_hi0=hi0.numpy(), k_lo=lo.numpy(), k_hi=hi.numpy())
    # values: per-token thresholds, online (here: on the calibration tokens)
    vlo0, vhi0 = token_thresholds(v, 0.0)
    vlo, vhi = token_thresholds(v, outliers)

    def normalised(x, w, lo_, hi_, drop_outliers):
        mid, half = (hi_ + lo_) / 2, ((hi_ - lo_) / 2).clamp_min(1e-8)
        xn = ((x - mid) / half).reshape(-1)
        w = w.reshape(-1)
        if drop_outliers:
            keep = ((x >= lo_) & (x <= hi_)).reshape(-1)
            xn, w = xn[keep], w[keep]
        else:
            xn = xn.clamp(-1, 1)
        idx = _subsample(xn.numel(), max_points, seed)
        xn, w = xn.numpy(), w.numpy()
        return (xn, w) if idx is None else (xn[idx], w[idx])

    for which, x, w, plain, sparse in (("k", k, kf, (lo0, hi0), (lo, hi)), ("v", v, vf, (vlo0, vhi0), (vlo, vhi))):
        for tag, (lo_, hi_), drop in (("", plain, False), ("_o", sparse, True)):
            xn, wn = normalised(x, w, lo_, hi_, drop)
            for b in bits:
                c = fit_nuq(xn, wn, b, seed=seed)
                out[f"{which}_nuq{b}{tag}"] = c
                out[f"{which}_deq{b}{tag}"] = q_norm(xn, c) if b in qnorm_bits else c
    blocks = []
    if value_fisher_rot is not None and v.shape[1] % VBLOCK == 0:
        blocks += [("v", "_b", v, vf), ("v", "_r", rotate_blocks(v), value_fisher_rot.double())]
    if keys_rot is not None and keys_rot.shape[1] % VBLOCK == 0:
        blocks += [("k", "_r", keys_rot.float(), key_fisher_rot.double())]
    if key_order is not None and k.shape[1] % VBLOCK == 0:
        order = torch.as_tensor(np.asarray(key_order), dtype=torch.long)
        for tag, (lo_, hi_) in (("_h", (lo0, hi0)), ("_ho", (lo, hi))):
            mid, half = (hi_ + lo_) / 2, ((hi_ - lo_) / 2).clamp_min(1e-8)
            blocks += [("k", tag, ((k - mid) / half)[:, order], kf[:, order])]
    if blocks:
        for which, tag, x, w in blocks:
            for slot in ((tag == "_ho",) if tag in ("_h", "_ho") else (False, True)):
                xn, keep = block_normalised(x, slot)
                xn, wn = xn[keep], w.reshape(-1, VBLOCK)[keep]
                idx = _subsample(xn.numel(), max_points, seed)
                xn, wn = xn.numpy(), wn.numpy()
                if idx is not None:
                    xn, wn = xn[idx], wn[idx]
                for b in bits:
                    c = fit_nuq(xn, wn, b, seed=seed)
                    name = tag if tag in ("_h", "_ho") else tag + ("o" if slot else "")
                    out[f"{which}_nuq{b}{name}"] = c
                    out[f"{which}_deq{b}{name}"] = q_norm(xn, c) if b in qnorm_bits else c
    del torch
    return out


def calibrate(model_dir: str | os.PathLike, text: str | None = None, n_samples: int = DEFAULT_SAMPLES,
              seq_len: int = DEFAULT_SEQ_LEN, bits=DEFAULT_BITS, outliers: float = DEFAULT_OUTLIERS,
              qnorm_bits=DEFAULT_QNORM_BITS, device: str = "cpu", dtype: str = "float32", progress: bool = True,
              max_points: int = MAX_POINTS, seed: int = 0) -> KVCalibration:
    """KVQuant calibration of the Hugging Face model in ``model_dir`` (see the module's text)."""
    from tqdm.auto import tqdm

    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.fisher import fisher_streamed
    from ggml_ext.converters.source import open_checkpoint

    bits = tuple(sorted({int(b) for b in bits}))
    if not bits or any(b < 1 or b > 8 for b in bits):
        raise KVCalibrationError(f"bits must be in 1..8 (got {bits})")
    if not 0 <= outliers < 0.5:
        raise KVCalibrationError(f"outlier fraction must be in [0, 0.5) (got {outliers})")
    arch, n_layers, kvh, hd = _model_shape(model_dir)
    tokens = tokenize(model_dir, text, n_samples, seq_len)
    digest = open_checkpoint(model_dir).source_hash()
    buf: dict[str, list] = {}
    torch = _torch()
    theta = rope_default(model_dir)
    permuted = arch in ("llama", "mistral")  # the converter's permute_qk (the glue's keys_permuted)
    # the cache's channel c of a head is the calibration's (k_proj's) channel key_order[c]
    key_order = np.arange(kvh * hd)
    if permuted:
        j = np.arange(hd)
        key_order = (np.arange(kvh)[:, None] * hd + np.where(j % 2, j // 2 + hd // 2, j // 2)[None, :]).reshape(-1)

    def on_kv(name, act, grad):
        g = grad.double().reshape(-1, grad.shape[-1]).cpu()
        # values: also the Fisher of the Hadamard-rotated values (the gradient rotates with them)
        a = act.reshape(-1, act.shape[-1]).cpu()
        gr = rotate_blocks(g).pow(2) if name.endswith("v_proj") and g.shape[-1] % VBLOCK == 0 else None
        if name.endswith("k_proj") and theta is not None and g.shape[-1] % VBLOCK == 0:
            # keys as a KROT cache holds them: each sample's tokens at positions 0.. (one sequence per row)
            seq = act.shape[-2] if act.dim() >= 2 else a.shape[0]
            kr = torch.cat([keys_as_cached_rotated(c, hd, theta, permuted) for c in a.split(seq)])
            gk = torch.cat([keys_as_cached_rotated(c, hd, theta, permuted) for c in g.split(seq)]).pow(2)
            buf.setdefault(name + ".rot", []).append((kr, gk, None))
        buf.setdefault(name, []).append((a, g.pow(2), gr))

    layers: list[dict | None] = [None] * n_layers
    bar = tqdm(total=n_layers, desc="kv datatypes (k-means)", unit="layer", disable=not progress)

    def on_layer(i, _res):
        names = sorted(n for n in buf if not n.endswith(".rot"))
        ks = [n for n in names if n.endswith("k_proj")]
        vs = [n for n in names if n.endswith("v_proj")]
        if len(ks) != 1 or len(vs) != 1:
            raise KVCalibrationError(f"layer {i}: expected one k_proj and one v_proj output (or a fused qkv_proj), "
                                     f"got {names or 'none'}")
        torch = _torch()
        k = torch.cat([a for a, _, _ in buf[ks[0]]])
        kf = torch.cat([g for _, g, _ in buf[ks[0]]])
        v = torch.cat([a for a, _, _ in buf[vs[0]]])
        vf = torch.cat([g for _, g, _ in buf[vs[0]]])
        vfr = None if buf[vs[0]][0][2] is None else torch.cat([g for _, _, g in buf[vs[0]]])
        kr = buf.get(ks[0] + ".rot")
        kr, kfr = (None, None) if kr is None else (torch.cat([a for a, _, _ in kr]), torch.cat([g for _, g, _ in kr]))
        if k.shape[1] != kvh * hd or v.shape[1] != kvh * hd:
            raise KVCalibrationError(f"layer {i}: K/V outputs of {k.shape[1]}/{v.shape[1]} channels, "
                                     f"expected {kvh} KV heads x {hd}")
        buf.clear()
        layers[i] = fit_layer(k, kf, v, vf, bits, outliers, qnorm_bits, max_points, seed, value_fisher_rot=vfr,
                              keys_rot=kr, key_fisher_rot=kfr, key_order=key_order)
        bar.update(1)

    try:
        fisher_streamed(model_dir, tokens.ids, device=device, dtype=dtype, progress=progress,
                        on_layer=on_layer, on_kv=on_kv)
    finally:
        bar.close()
    missing = [i for i, L in enumerate(layers) if L is None]
    if missing:
        raise KVCalibrationError(f"{model_dir}: no K/V projection outputs (k_proj / v_proj or a fused qkv_proj) in "
                                 f"layers {missing}")
    meta = {"model_id": Path(model_dir).resolve().name, "model_sha256": digest, "architecture": arch,
            "n_layers": n_layers, "n_kv_heads": kvh, "head_dim": hd, "bits": list(bits),
            "outlier_fraction": float(outliers), "qnorm_bits": [int(b) for b in qnorm_bits if b in bits],
            "key_point": "k_proj output (pre-RoPE, per channel)", "value_point": "v_proj output (per token)",
            "calibration.text": Path(tokens.text_path).name, "calibration.text_sha256": tokens.text_sha256,
            "calibration.n_samples": tokens.n_samples, "calibration.seq_len": tokens.seq_len,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return KVCalibration(meta, layers)  # type: ignore[arg-type]


# ---------------------------------------------------------------- CLI (a verb of `ggml-ext calibrate`)
def add_arguments(p: argparse.ArgumentParser) -> None:
    from .._args import int_list
    p.add_argument("model", help="Hugging Face model folder")
    p.add_argument("-o", "--output", required=True, help="the side file to write (GGUF)")
    p.add_argument("--text", default=None, help="calibration text: a file or an asset name (default wiki-train)")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help=f"samples (default {DEFAULT_SAMPLES})")
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"tokens per sample (default {DEFAULT_SEQ_LEN})")
    p.add_argument("--bits", type=int_list(1, 8), default=DEFAULT_BITS, help="nuq bit widths (default 2,3,4)")
    p.add_argument("--outliers", type=float, default=DEFAULT_OUTLIERS,
                   help=f"dense-and-sparse outlier fraction (default {DEFAULT_OUTLIERS})")
    p.add_argument("--qnorm-bits", type=int_list(1, 8, empty=True), default=DEFAULT_QNORM_BITS,
                   help="bit widths whose levels get Q-Norm (default 2; empty for none)")
    p.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    try:
        out = Path(args.output)
        if out.exists() and not args.force:
            raise FileExistsError(f"{out} exists; pass --force to replace it")
        cal = calibrate(args.model, args.text, args.samples, args.seq_len, tuple(args.bits), args.outliers,
                        tuple(args.qnorm_bits), args.device, args.dtype, progress=not args.quiet)
        cal.save(out, force=args.force)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"calibrate kv: {e}", file=sys.stderr)
        return 1
    m = cal.meta
    print(f"kv calibration: {out} ({m['n_layers']} layers x {m['n_kv_heads']} KV heads x {m['head_dim']}, "
          f"nuq{'/'.join(map(str, m['bits']))}, {m['calibration.n_samples']}x{m['calibration.seq_len']} tokens "
          f"of {m['calibration.text']})")
    return 0
