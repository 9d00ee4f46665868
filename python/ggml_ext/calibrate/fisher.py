"""Fisher information: the diagonal of the empirical Fisher, Σ_s (∂ loss_s / ∂w)², for every weight, and
for the outputs of the K and V projections (pre-RoPE keys: the k_proj output is the key before RoPE).

``loss_s`` is the model's own causal-LM loss (mean cross-entropy of next-token prediction) on sample s,
and each sample's gradient is squared before summing (SqueezeLLM's and any-precision LLM's sensitivity;
KVQuant's activation Fisher for the K/V outputs, summed over tokens per channel).

Two ways, same numbers:

* :func:`fisher_full`: the whole model in memory, one backward per sample (where the model fits);
* :func:`fisher_streamed`: a forward pass layer by layer that keeps every layer's input hidden states
  (in memory, or in safetensors files under ``spill_dir``), the loss computed by the model's own head
  (its final norm, LM head, logit soft-capping, ... run by the model's forward with the decoder layers
  bypassed), then a reverse pass: for the last layer down to the first, the layer is loaded, its
  forward recomputed from the kept input with gradients, and the output gradient pushed through it —
  gradient checkpointing at layer granularity, so memory is one layer plus the kept activations.

Results: {parameter or module name: float64 array}; parameters by their full name
(``model.layers.3.mlp.down_proj.weight``), K/V outputs as ``<module>.out_fisher`` (one value per
output channel, summed over tokens and samples). Squares are summed in float64 whatever the compute
dtype (``dtype="bfloat16"`` on a GPU for 7B-sized models). :func:`fisher_streamed` hands each decoder
layer's results to ``on_layer`` as soon as its reverse step ends (the stats folder writes them to the
layer's file), so neither the device nor the host ever holds more than one layer's float64 sums.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["KV_PROJECTIONS", "FUSED_QKV", "fisher_full", "fisher_streamed", "fused_qkv_widths", "kv_parts"]

# Linear layers whose outputs are the attention's keys and values (pre-RoPE), by module name suffix.
KV_PROJECTIONS = ("k_proj", "v_proj")
# A fused projection whose output is q | k | v (Phi-3's qkv_proj): its K and V parts count as the attention
# module's k_proj / v_proj outputs (named so: "<attention>.k_proj", "<attention>.v_proj").
FUSED_QKV = "qkv_proj"


def fused_qkv_widths(attn) -> tuple[int, int]:
    """(q, kv): the widths of the q part and of each of the k and v parts of ``attn.qkv_proj``'s output, from the
    attention module's config and head dim (transformers' Phi3Attention splits its output the same way)."""
    cfg = attn.config
    hd = getattr(attn, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, kvh * hd
    if attn.qkv_proj.out_features != q + 2 * kv:
        raise ValueError(f"{type(attn).__name__}: qkv_proj has {attn.qkv_proj.out_features} outputs, expected "
                         f"{q} + 2 x {kv} (q | k | v)")
    return q, kv


def kv_parts(root):
    """(path, linear module, [(name suffix, start, width) ...]) of every K / V projection output under ``root``:
    k_proj and v_proj whole, or the k and v parts of a fused qkv_proj (named as k_proj / v_proj of its module)."""
    torch = _torch()
    out = []
    for path, m in root.named_modules():
        last = path.rsplit(".", 1)[-1]
        if isinstance(m, torch.nn.Linear) and last in KV_PROJECTIONS:
            out.append((path, m, [("", 0, m.out_features)]))
        fused = getattr(m, FUSED_QKV, None)
        if isinstance(fused, torch.nn.Linear) and hasattr(m, "config"):
            q, kv = fused_qkv_widths(m)
            base = f"{path}." if path else ""
            out.append((f"{base}{FUSED_QKV}", fused, [(f"{base}k_proj", q, kv), (f"{base}v_proj", q + kv, kv)]))
    return out


def _torch():
    import torch
    return torch


class _KVGrad:
    """Tensor hooks on the outputs of the K and V projections: Σ g² per output channel.

    ``on_kv(name, activation, grad)``, when given, also receives every sample's projection output and its
    gradient (both 1 x L x channels, detached): KVQuant's per-element Fisher weights for its k-means."""

    def __init__(self, on_kv=None):
        self.sums: dict[str, Any] = {}
        self.on_kv = on_kv

    def attach(self, root, prefix: str):
        torch = _torch()
        handles = []
        for path, m, parts in kv_parts(root):
            # parts: (name, start, width) of the output: the whole k_proj / v_proj, or a fused qkv_proj's k and v
            parts = [((f"{prefix}.{p or path}" if prefix else p or path), a, w) for p, a, w in parts]

            def fwd(module, args, out, parts=parts):
                if out.requires_grad:
                    act = out.detach()

                    def acc(g, act=act):
                        g = g.detach()
                        for name, a, w in parts:
                            gp = g[..., a:a + w]
                            s = gp.to(torch.float64).pow(2).reshape(-1, w).sum(0)
                            self.sums[name] = self.sums[name] + s if name in self.sums else s
                            if self.on_kv is not None:
                                self.on_kv(name, act[..., a:a + w], gp)
                    out.register_hook(acc)
            handles.append(m.register_forward_hook(fwd))
        return handles


def _accumulate_param_grads(module, prefix: str, into: dict, acc=None) -> None:
    torch = _torch()
    for pname, p in module.named_parameters():
        if p.grad is None:
            continue
        name = f"{prefix}.{pname}" if prefix else pname
        g = p.grad.detach().to(acc or torch.float64)
        if name in into:
            into[name].addcmul_(g, g)       # in place: no second model-sized temporary per sample
        else:
            into[name] = g * g
        p.grad = None


def _numpy(d: dict) -> dict[str, np.ndarray]:
    return {k: v.cpu().numpy() for k, v in d.items()}


def fisher_full(model_dir: str | os.PathLike, tokens, device: str = "cpu", dtype: str = "float32",
                accumulate: str = "float64", on_kv=None) -> dict[str, np.ndarray]:
    """Per-sample squared gradients summed over ``tokens`` (n x L), the whole model in memory (weights,
    gradients and one ``accumulate``-typed sum per weight: 20 bytes a weight in float32/float64).
    ``on_kv``: see :class:`_KVGrad`."""
    torch = _torch()
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                 local_files_only=True).to(device)
    model.eval()
    out: dict = {}
    kv = _KVGrad(on_kv)
    handles = kv.attach(model, "")
    try:
        for row in tokens:
            ids = row[None].to(device)
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            _accumulate_param_grads(model, "", out, getattr(torch, accumulate))
    finally:
        for h in handles:
            h.remove()
    res = _numpy(out)
    res.update({f"{k}.out_fisher": v for k, v in _numpy(kv.sums).items()})
    return res


class _Spill:
    """Each layer's input hidden states: in memory, or one safetensors file per layer under ``folder``."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self.mem: dict[int, Any] = {}
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def put(self, i: int, t) -> None:
        if self.folder is None:
            self.mem[i] = t
        else:
            from safetensors.torch import save_file
            save_file({"h": t.contiguous().cpu()}, str(self.folder / f"h-{i:03d}.safetensors"))

    def get(self, i: int, device):
        if self.folder is None:
            return self.mem.pop(i)
        from safetensors.torch import load_file
        p = self.folder / f"h-{i:03d}.safetensors"
        t = load_file(str(p))["h"].to(device)
        p.unlink()
        return t


def _outer_modules(stream) -> list[str]:
    """The modules holding the parameters outside the decoder layers (embeddings, final norm, head)."""
    names = [n for n, _ in stream.model.named_parameters(remove_duplicate=False)
             if not n.startswith(stream.layers_name + ".")]
    return sorted({n.rsplit(".", 1)[0] for n in names})


def _param_name(model, param) -> str:
    return next(n for n, p in model.named_parameters() if p is param)


def _first_layer_input(stream, ids_row):
    """The hidden states entering decoder layer 0 for one sample, with gradients to the parameters before it."""
    torch = _torch()
    from .stream import _Stop
    got = []

    class Catch(torch.nn.Module):
        def forward(self, hidden_states, *args, **kwargs):
            got.append(hidden_states)
            raise _Stop

    first = stream.layers[0]
    catch = Catch()
    for attr in ("attention_type", "is_sliding", "layer_idx"):
        if hasattr(first, attr):
            setattr(catch, attr, getattr(first, attr))
    stream.layers[0] = catch
    try:
        with contextlib.suppress(_Stop):
            stream.model(input_ids=ids_row[None].to(stream.device), use_cache=False)
    finally:
        stream.layers[0] = first
    return got[0]


def _head_loss(stream, hidden_row, ids_row):
    """The model's own loss on one sample whose last decoder layer output is ``hidden_row`` (1 x L x d):
    the model's forward with every decoder layer bypassed and this hidden state injected after them."""
    torch = _torch()

    class Inject(torch.nn.Module):
        def __init__(self, index, last):
            super().__init__()
            self.index, self.last = index, last

        def forward(self, hidden_states, *args, **kwargs):
            return hidden_row if self.index == self.last else hidden_states

    originals = list(stream.layers)
    n = len(originals)
    for i in range(n):
        inj = Inject(i, n - 1)
        for attr in ("attention_type", "is_sliding", "layer_idx"):
            if hasattr(originals[i], attr):
                setattr(inj, attr, getattr(originals[i], attr))
        stream.layers[i] = inj
    try:
        ids = ids_row[None].to(stream.device)
        return stream.model(input_ids=ids, labels=ids, use_cache=False).loss
    finally:
        for i, m in enumerate(originals):
            stream.layers[i] = m


def fisher_streamed(model_dir: str | os.PathLike, tokens, device: str = "cpu",
                    spill_dir: str | os.PathLike | None = None, progress: bool = True, dtype: str = "float32",
                    on_layer=None, on_kv=None) -> dict[str, np.ndarray]:
    """:func:`fisher_full`'s numbers with one decoder layer in memory at a time (see the module's text).

    ``on_layer(i, results)``: called with decoder layer i's results (its parameters and K/V outputs) when
    its reverse step ends, last layer first; those then stay out of the returned dict, which keeps the
    parameters outside the decoder layers (and every layer's when ``on_layer`` is None).
    ``on_kv(name, activation, grad)``: every sample's K/V projection output and its gradient, during the
    layer's reverse step (before its ``on_layer``); see :class:`_KVGrad`."""
    torch = _torch()
    from tqdm.auto import tqdm

    from .stream import LayerStream
    stream = LayerStream(model_dir, device=device, dtype=dtype)
    spill = _Spill(Path(spill_dir) if spill_dir is not None else None)
    captured, hidden = stream._capture(tokens)
    # forward: keep every layer's input
    for i in tqdm(range(stream.n_layers), desc="fisher forward", disable=not progress):
        prefix = stream.layer_name(i)
        stream.materialize(prefix)
        spill.put(i, hidden)
        hidden = stream._forward_layer(stream.layers[i], captured[i], hidden)
        stream.release(prefix)
    # the head: everything outside the decoder layers, with gradients
    mods = _outer_modules(stream)
    for m in mods:
        stream.materialize(m)
    stream.model.tie_weights()
    emb = stream.model.get_input_embeddings().weight
    emb_name = _param_name(stream.model, emb)
    out: dict = {}
    grads, head_rows = [], []
    for s in range(hidden.shape[0]):
        h = hidden[s:s + 1].detach().requires_grad_(True)
        loss = _head_loss(stream, h, tokens[s])
        loss.backward()
        grads.append(h.grad.detach())
        # a tied embedding's per-sample gradient also has the lookup's part (added after the reverse
        # pass): keep the head's gradient on the rows this sample looks up
        rows = torch.unique(tokens[s]).to(stream.device)
        head_rows.append((rows, emb.grad[rows].detach().clone() if emb.grad is not None else None))
        _accumulate_param_grads(stream.model, "", out)  # head parameters (norm, lm_head / tied embedding)
    for m in mods:
        stream.release(m)
    grad = torch.cat(grads)
    # reverse: recompute each layer's forward from its kept input, push the gradient through it
    kv = _KVGrad(on_kv)
    for i in tqdm(reversed(range(stream.n_layers)), total=stream.n_layers, desc="fisher backward",
                  disable=not progress):
        prefix = stream.layer_name(i)
        stream.materialize(prefix)
        layer = stream.layers[i]
        x_all = spill.get(i, stream.device)
        handles = kv.attach(layer, prefix)
        cap = captured[i]
        grad_in = []
        try:
            for s in range(x_all.shape[0]):
                x = x_all[s:s + 1].detach().requires_grad_(True)
                with torch.enable_grad():
                    y = layer(x, *cap.args, **cap.kwargs)
                    y = y[0] if isinstance(y, tuple) else y
                    y.backward(grad[s:s + 1])
                grad_in.append(x.grad.detach())
                _accumulate_param_grads(layer, prefix, out)
        finally:
            for hd in handles:
                hd.remove()
        grad = torch.cat(grad_in)
        stream.release(prefix)
        if on_layer is not None:  # this layer's sums to the caller, off the device
            mine = [k for k in out if k.startswith(prefix + ".")]
            res_i = {k: out.pop(k).cpu().numpy() for k in mine}
            res_i.update({f"{k}.out_fisher": kv.sums.pop(k).cpu().numpy() for k in list(kv.sums)})
            on_layer(i, res_i)
    # the layers before the first decoder layer (the embedding lookup, and whatever the architecture
    # runs there): the gradient reaching layer 0, pushed through them sample by sample
    for m in mods:
        stream.materialize(m)
    stream.model.tie_weights()
    emb = stream.model.get_input_embeddings().weight
    for s in range(grad.shape[0]):
        h0 = _first_layer_input(stream, tokens[s])
        h0.backward(grad[s:s + 1])
        g = emb.grad.detach().to(torch.float64)
        emb.grad = None
        rows, g_head = head_rows[s]
        if g_head is not None:  # tied: (head + lookup)² - head², on the looked-up rows (the rest is in already)
            gh = g_head.to(torch.float64)
            out[emb_name][rows] += (g[rows] + gh).pow(2) - gh.pow(2)
        else:
            out[emb_name] = out[emb_name] + g.pow(2) if emb_name in out else g.pow(2)
        _accumulate_param_grads(stream.model, "", out)  # anything else before layer 0
    for m in mods:
        stream.release(m)
    res = _numpy(out)
    res.update({f"{k}.out_fisher": v for k, v in _numpy(kv.sums).items()})
    return res
