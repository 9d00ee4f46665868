"""Simulated KV-cache quantization of a transformers model, and perplexity the way llama-perplexity does it.

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with simulate(model, scheme("nuq3-1%"), calibration):
        ppl = perplexity(model, ids, n_ctx=2048)

A :class:`Scheme` says what a cache would hold; :func:`simulate` quantizes-and-dequantizes the keys and
values where the cache would store them, for every decoder layer of any transformers architecture whose
attention has ``k_proj``/``v_proj`` (Llama, Mistral, Qwen2/3, Gemma-2/3, ...; grouped-query attention is
just fewer KV channels) or a fused ``qkv_proj`` whose output is q | k | v (Phi-3: the hooks below act on its k
and v parts, :func:`ggml_ext.calibrate.fisher.fused_qkv_widths`):

* values: a forward hook on ``v_proj`` (per token: online thresholds);
* pre-RoPE keys: a forward hook on ``k_proj`` (the key before RoPE -- and before the K norm where the
  architecture has one);
* post-RoPE keys: the attention module's rotary step. transformers' attention modules call their modeling
  module's ``apply_rotary_pos_emb(q, k, cos, sin)``; while simulating, that name is wrapped so its rotated
  keys are quantized, and a pre-hook on each attention module says which layer is calling. Nothing
  architecture-specific: any modeling module that rotates through ``apply_rotary_pos_emb`` works, and one
  that does not is refused with :class:`SimulationError`.

Scheme names (the paper's Table 2 ladder): ``fp16`` (nothing quantized); ``intX`` (uniform, per-token keys
after RoPE and per-token values: the paper's baseline); ``intX-pc`` / ``intX-pc-post`` (per-channel keys
before / after RoPE, scales from the sequence itself); ``nfX`` and ``nuqX`` (KVQuant: per-channel keys
before RoPE with offline-calibrated thresholds, per-token values; NormalFloat or the calibrated nuq
levels); suffix ``-1%`` (any percentage: dense-and-sparse outliers kept in float) and ``+sink`` (the first
token kept in float).
"""
from __future__ import annotations

import contextlib
import math
import re
import sys
from dataclasses import dataclass, replace

from ggml_ext.calibrate.fisher import FUSED_QKV, fused_qkv_widths

from .quant import fake_quant, int_levels, nf_levels, quantile_thresholds, token_thresholds

__all__ = ["Scheme", "SimulationError", "scheme", "simulate", "perplexity", "LADDER"]

# the paper's Table 2 ladder, plus the pre- vs post-RoPE per-channel comparison
LADDER = ("fp16", "int4", "int3", "int2", "int3-pc", "int3-pc-post", "nf4", "nf3", "nuq4", "nuq3", "nuq2",
          "nuq4-1%", "nuq3-1%", "nuq2-1%")


class SimulationError(ValueError):
    """A model or scheme the simulation cannot handle (no k_proj/v_proj, no rotary function, no calibration)."""


def _torch():
    import torch
    return torch


@dataclass(frozen=True)
class Scheme:
    name: str
    dtype: str = "none"            # none | int | nf | nuq
    bits: int = 16
    keys: str = "channel"          # channel | token
    rope: str = "pre"              # pre | post
    key_scales: str = "calibrated" # calibrated (offline) | sequence (the window's own per-channel min/max)
    outliers: float = 0.0          # dense-and-sparse fraction kept in float
    sink: bool = False             # first token kept in float

    @property
    def needs_calibration(self) -> bool:
        return self.dtype == "nuq" or (self.dtype != "none" and self.keys == "channel" and self.key_scales == "calibrated")


_NAME = re.compile(r"^(int|nf|nuq)([1-8])(-pc(?:-post)?)?(?:-(\d+(?:\.\d+)?)%)?(\+sink)?$")


def scheme(name: str) -> Scheme:
    """The :class:`Scheme` of a ladder name (see the module's text)."""
    if name in ("fp16", "float"):
        return Scheme(name)
    m = _NAME.match(name)
    if not m:
        raise SimulationError(f"unknown KV scheme {name!r}; e.g. fp16, int3, int3-pc, int3-pc-post, nf4, nuq3, nuq3-1%, nuq2-1%+sink")
    dtype, bits, pc, pct, sink = m.groups()
    s = Scheme(name, dtype, int(bits), outliers=float(pct) / 100 if pct else 0.0, sink=bool(sink))
    if dtype == "int" and not pc:
        return replace(s, keys="token", rope="post")
    if pc:
        if dtype != "int":
            raise SimulationError(f"{name}: -pc variants are for the int baselines")
        return replace(s, rope="post" if pc.endswith("post") else "pre", key_scales="sequence")
    return s


def _levels(s: Scheme, cal, layer: int, which: str):
    """(rounding levels, dequantization values) of the scheme's datatype."""
    torch = _torch()
    if s.dtype == "int":
        return int_levels(s.bits), None
    if s.dtype == "nf":
        return nf_levels(s.bits), None
    lv, dq = cal.levels(layer, which, s.bits, s.outliers > 0)
    return torch.from_numpy(lv), torch.from_numpy(dq)


def _lv(s: Scheme, cal, layer: int, which: str, lo, hi):
    levels, values = _levels(s, cal, layer, which)
    return levels, lo, hi, s.outliers > 0, values


def _keep_sink(s: Scheme, x, y, token_dim: int):
    if s.sink:
        y = y.clone()
        y.select(token_dim, 0).copy_(x.select(token_dim, 0))
    return y


def quantize_values(s: Scheme, cal, layer: int, v):
    """Values (batch, tokens, channels): per token, online thresholds."""
    lo, hi = token_thresholds(v.float(), s.outliers)
    return _keep_sink(s, v, fake_quant(v, *_lv(s, cal, layer, "v", lo, hi)), 1)


def quantize_keys(s: Scheme, cal, layer: int, k):
    """Keys (batch, tokens, channels), before or after RoPE as the scheme says."""
    torch = _torch()
    kf = k.float()
    if s.keys == "token":
        lo, hi = token_thresholds(kf, s.outliers)
    elif s.key_scales == "sequence":
        lo, hi = quantile_thresholds(kf, s.outliers, dim=1)
        lo, hi = lo[:, None, :], hi[:, None, :]
    else:
        L = cal.layers[layer]
        lo, hi = (L["k_lo"], L["k_hi"]) if s.outliers > 0 else (L["k_lo0"], L["k_hi0"])
        lo, hi = torch.from_numpy(lo).to(k.device), torch.from_numpy(hi).to(k.device)
        if s.outliers > 0 and abs(float(cal.meta["outlier_fraction"]) - s.outliers) > 1e-9:
            raise SimulationError(f"{s.name}: the calibration's key thresholds are for "
                                  f"{100 * float(cal.meta['outlier_fraction']):g}% outliers")
    return _keep_sink(s, k, fake_quant(k, *_lv(s, cal, layer, "k", lo, hi)), 1)


def _attention_modules(model) -> list:
    torch = _torch()
    found = []
    for _name, m in model.named_modules():
        k, v = getattr(m, "k_proj", None), getattr(m, "v_proj", None)
        fused = getattr(m, FUSED_QKV, None)
        if (isinstance(k, torch.nn.Linear) and isinstance(v, torch.nn.Linear)) or \
                (isinstance(fused, torch.nn.Linear) and hasattr(m, "config")):
            found.append(m)
    if not found:
        raise SimulationError(f"{type(model).__name__}: no attention module with k_proj and v_proj or a fused "
                              f"{FUSED_QKV}")
    return found


def _kv_hooks(attn, on_k, on_v) -> list:
    """Forward hooks that replace the attention's keys by on_k(keys) (None: left as they are) and its values by
    on_v(values): on k_proj / v_proj, or on the k and v parts of a fused qkv_proj (q | k | v, Phi-3)."""
    torch = _torch()
    fused = getattr(attn, FUSED_QKV, None)
    if not isinstance(fused, torch.nn.Linear):
        hooks = [attn.v_proj.register_forward_hook(lambda mod, args, out: on_v(out))]
        if on_k is not None:
            hooks.append(attn.k_proj.register_forward_hook(lambda mod, args, out: on_k(out)))
        return hooks
    q, kv = fused_qkv_widths(attn)

    def hook(mod, args, out):
        k, v = out[..., q:q + kv], out[..., q + kv:]
        return torch.cat([out[..., :q], k if on_k is None else on_k(k), on_v(v)], dim=-1)
    return [fused.register_forward_hook(hook)]


@contextlib.contextmanager
def simulate(model, s: Scheme, calibration=None):
    """Quantize-dequantize the K/V of every layer of ``model`` by scheme ``s`` while the block runs."""
    if isinstance(s, str):
        s = scheme(s)
    if s.dtype == "none":
        yield model
        return
    attns = _attention_modules(model)
    if s.needs_calibration:
        if calibration is None:
            raise SimulationError(f"{s.name} needs a KV calibration (`ggml-ext calibrate kv`)")
        calibration.check_config(model.config)
        if s.dtype == "nuq" and s.bits not in [int(b) for b in calibration.meta["bits"]]:
            raise SimulationError(f"{s.name}: the KV calibration has nuq{'/'.join(map(str, calibration.meta['bits']))}")
    handles, patched = [], []
    state = {"layer": None}
    try:
        for i, attn in enumerate(attns):
            on_k = (lambda k, i=i: quantize_keys(s, calibration, i, k)) if s.rope == "pre" else None
            handles += _kv_hooks(attn, on_k, lambda v, i=i: quantize_values(s, calibration, i, v))
            if s.rope != "pre":
                handles.append(attn.register_forward_pre_hook(lambda mod, args, i=i: state.__setitem__("layer", i)))
                handles.append(attn.register_forward_hook(lambda mod, args, out: state.__setitem__("layer", None)))
        if s.rope == "post":
            for mod_name in sorted({type(a).__module__ for a in attns}):
                mod = sys.modules[mod_name]
                rope = getattr(mod, "apply_rotary_pos_emb", None)
                if rope is None:
                    raise SimulationError(f"{mod_name}: no apply_rotary_pos_emb to quantize keys after RoPE")

                def wrapped(q, k, *args, _rope=rope, **kwargs):
                    q2, k2 = _rope(q, k, *args, **kwargs)
                    i = state["layer"]
                    if i is not None:  # (batch, kv heads, tokens, head dim) -> (batch, tokens, channels)
                        b, h, t, d = k2.shape
                        flat = k2.transpose(1, 2).reshape(b, t, h * d)
                        k2 = quantize_keys(s, calibration, i, flat).reshape(b, t, h, d).transpose(1, 2)
                    return q2, k2
                setattr(mod, "apply_rotary_pos_emb", wrapped)
                patched.append((mod, rope))
        yield model
    finally:
        for h in handles:
            h.remove()
        for mod, rope in patched:
            mod.apply_rotary_pos_emb = rope


def perplexity(model, ids, n_ctx: int, chunks: int | None = None, bos: int | None = None,
               progress: bool = False, desc: str = "perplexity") -> tuple[float, int]:
    """llama-perplexity's method on token ids (1-D): consecutive windows of ``n_ctx`` tokens (the first one
    replaced by ``bos`` when the model adds one), each scored on its second half (positions n_ctx/2 ..
    n_ctx-2 predicting the next token). Returns (perplexity, scored tokens)."""
    torch = _torch()
    from tqdm.auto import tqdm
    n = len(ids) // n_ctx if chunks is None else min(chunks, len(ids) // n_ctx)
    if n < 1:
        raise ValueError(f"{len(ids)} tokens: fewer than one window of {n_ctx}")
    first = n_ctx // 2
    device = next(model.parameters()).device
    nll, count = 0.0, 0
    for c in tqdm(range(n), desc=desc, disable=not progress, leave=False):
        w = torch.as_tensor(ids[c * n_ctx:(c + 1) * n_ctx]).clone()
        if bos is not None:
            w[0] = bos
        with torch.no_grad():
            # only the scored half's logits (a 262K vocabulary at 32K context would not fit otherwise),
            # in float64 a slice at a time
            logits = model(input_ids=w[None].to(device), use_cache=False,
                           logits_to_keep=n_ctx - first).logits[0, :-1]
            tgt = w[first + 1:n_ctx].to(device)
            for s in range(0, tgt.numel(), 1024):
                logp = torch.log_softmax(logits[s:s + 1024].double(), dim=-1)
                nll -= float(logp.gather(1, tgt[s:s + 1024, None]).sum())
        count += tgt.numel()
    return math.exp(nll / count), count
