"""Layer streaming: run a Hugging Face causal LM over calibration tokens one decoder layer at a time.

The model is built by transformers itself (no fork, any architecture it knows) with its parameters on
PyTorch's ``meta`` device: nothing is allocated. Only the modules outside the decoder layers that the
forward pass needs before layer 0 (embeddings; buffers such as rotary frequencies are real from the
start) are loaded. One pass of the real forward with every decoder layer replaced by a recorder
captures, per layer, the exact keyword arguments the model gives it (attention mask, position
embeddings, sliding-window masks of the layers that have them, ...) and the hidden states entering
layer 0. Then, layer by layer: its weights are read from the checkpoint (:class:`ggml_ext.converters.
source.Checkpoint`, the converter's reader), every sample runs through it with the collectors' hooks
attached, an optional ``on_layer`` callback may change the layer (a method that quantizes as it goes:
the next layer then sees the quantized layer's output), the outputs become the next inputs, and the
layer's weights go back to ``meta``. Peak memory: one layer's weights plus the hidden states of the
samples (two copies), not the model.

    stream = LayerStream(hf_dir, device="cpu")
    for index, layer, prefix in stream.run(tokens, hooks=collector.attach, on_layer=None):
        ...   # after the layer's samples ran: its stats are complete
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

__all__ = ["LayerStream", "StreamError"]


class StreamError(RuntimeError):
    """A model this driver cannot stream (no decoder layer list, weights missing from the checkpoint)."""


class _Stop(Exception):
    """Raised by the last recorder: the capture pass ends there, before the final norm and head."""


def _torch():
    import torch
    return torch


@dataclass
class _Captured:
    args: tuple          # positional arguments after the hidden states
    kwargs: dict[str, Any]


def _find_layers(model) -> tuple[str, Any]:
    """The decoder layers: the one ModuleList whose length is the config's layer count (``model.layers``
    for Llama-style models, ``model.decoder.layers``, ``transformer.h``, ... alike)."""
    torch = _torch()
    n = getattr(model.config.get_text_config(), "num_hidden_layers", None)
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and n is not None and len(m) == n]
    if len(found) != 1:
        names = ", ".join(name for name, _ in found) or "none"
        raise StreamError(f"cannot find the decoder layers of {type(model).__name__}: "
                          f"ModuleLists of {n} modules: {names}")
    return found[0]


class LayerStream:
    """A causal LM of ``model_dir`` (a Hugging Face folder) streamed one decoder layer at a time.

    ``device``: where layers run ("cpu", "cuda", "cuda:1"); ``dtype``: the compute dtype of the
    weights and hidden states (float32 default; bfloat16 on CUDA for large models — collectors
    accumulate in float64 regardless).
    """

    def __init__(self, model_dir: str | os.PathLike, device: str = "cpu", dtype: str = "float32",
                 attention_weights: bool = False):
        torch = _torch()
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM

        from ggml_ext.converters.source import open_checkpoint

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.checkpoint = open_checkpoint(self.model_dir)
        try:   # transformers checks a config with asserts and raises anything on a malformed one
            config = AutoConfig.from_pretrained(self.model_dir, local_files_only=True)
            config.use_cache = False
            with init_empty_weights(include_buffers=False):
                self.model = AutoModelForCausalLM.from_config(config, dtype=self.dtype)
        except Exception as e:  # noqa: BLE001
            raise StreamError(f"{self.model_dir}: transformers cannot build the model from config.json "
                              f"({type(e).__name__}: {str(e)[:200] or 'no message'})") from None
        self.model.eval()
        if attention_weights:   # the attention modules return their weights (collect.py's attn_hessian)
            self.model.set_attn_implementation("eager")
        self.config = config
        self.layers_name, self.layers = _find_layers(self.model)
        self.n_layers = len(self.layers)

    # ------------------------------------------------------------------ weights
    def _checkpoint_name(self, name: str) -> str:
        t = self.checkpoint.tensors
        if name in t:
            return name
        if name.startswith("lm_head.") and getattr(self.config, "tie_word_embeddings", False):
            emb = self.model.get_input_embeddings()
            for n, m in self.model.named_modules():
                if m is emb:
                    return self._checkpoint_name(f"{n}.weight")
        raise StreamError(f"{self.model_dir}: the checkpoint has no tensor {name!r}")

    def _load(self, name: str, handles: dict):
        """One checkpoint tensor as a torch tensor. safetensors files (the index from the converter's
        reader, which checked their headers) are read by safetensors itself straight onto the device in
        their stored dtype, through ``handles`` (file -> open handle, dropped by the caller so no file
        stays mapped); other formats through the converter's reader (float32 on the host)."""
        torch = _torch()
        if self.checkpoint.format == "safetensors":
            from safetensors import safe_open
            f = self.checkpoint.tensors[name].file
            try:
                if f not in handles:
                    handles[f] = safe_open(str(f), framework="pt", device=str(self.device))
                return handles[f].get_tensor(name)
            except Exception:  # noqa: BLE001 - safetensors refuses headers the converter's reader takes
                handles.pop(f, None)  # (e.g. data not covering the whole file): read it as the converter does
        return torch.from_numpy(self.checkpoint.load(name))

    def materialize(self, module_name: str) -> None:
        """Read the parameters of ``module_name`` (and its children) from the checkpoint onto the device."""
        from accelerate.utils import set_module_tensor_to_device
        torch = _torch()
        module = self.model.get_submodule(module_name)
        handles: dict = {}
        for pname, _ in list(module.named_parameters()):
            full = f"{module_name}.{pname}" if module_name else pname
            value = self._load(self._checkpoint_name(full), handles)
            set_module_tensor_to_device(self.model, full, self.device, value=value, dtype=self.dtype)
        handles.clear()
        for bname, buf in list(module.named_buffers()):
            if buf.device != self.device:
                full = f"{module_name}.{bname}" if module_name else bname
                set_module_tensor_to_device(self.model, full, self.device, value=buf)

    def release(self, module_name: str) -> None:
        """Put the parameters of ``module_name`` back on ``meta`` (frees their memory)."""
        from accelerate.utils import set_module_tensor_to_device
        module = self.model.get_submodule(module_name)
        for pname, _ in list(module.named_parameters()):
            full = f"{module_name}.{pname}" if module_name else pname
            set_module_tensor_to_device(self.model, full, "meta")

    def layer_name(self, i: int) -> str:
        return f"{self.layers_name}.{i}"

    # ------------------------------------------------------------------ capture
    def _capture(self, tokens) -> tuple[list[_Captured], Any]:
        """One forward of the real model up to the last decoder layer, each layer replaced by a recorder:
        the arguments every layer gets, and layer 0's input hidden states for ``tokens`` (n, L)."""
        torch = _torch()
        outer = [n for n, m in self.model.named_children()]
        # everything before the layers that holds parameters: embeddings (and whatever else the
        # architecture runs first); the head and final norm stay on meta, the capture stops before them
        emb = self.model.get_input_embeddings()
        emb_name = next(n for n, m in self.model.named_modules() if m is emb)
        self.materialize(emb_name)
        captured: list[_Captured | None] = [None] * self.n_layers
        first_inputs = []

        class Recorder(torch.nn.Module):
            def __init__(self, index):
                super().__init__()
                self.index = index

            def forward(self, hidden_states, *args, **kwargs):
                if self.index == 0:
                    first_inputs.append(hidden_states.detach())
                captured[self.index] = _Captured(args, kwargs)
                if self.index == len(captured) - 1:
                    raise _Stop
                return hidden_states

        originals = list(self.layers)
        for i in range(self.n_layers):
            rec = Recorder(i)
            for attr in ("attention_type", "is_sliding", "layer_idx"):  # read by some models' forward
                if hasattr(originals[i], attr):
                    setattr(rec, attr, getattr(originals[i], attr))
            self.layers[i] = rec
        try:
            with torch.no_grad():
                for row in tokens:
                    with contextlib.suppress(_Stop):
                        self.model(input_ids=row[None].to(self.device), use_cache=False)
        finally:
            for i, m in enumerate(originals):
                self.layers[i] = m
            self.release(emb_name)
        del outer
        return captured, torch.cat(first_inputs)

    # ------------------------------------------------------------------ run
    def run(self, tokens, hooks: Callable[[int, Any, str], Callable[[], None]] | None = None,
            on_layer: Callable[..., bool] | None = None,
            progress: bool = True, flows: int = 1, held_out=None) -> Iterator[tuple[int, Any, str]]:
        """Stream ``tokens`` (LongTensor n x L) through every layer.

        ``hooks(index, layer, prefix)`` is called with the loaded layer before its samples run and returns
        a function that removes what it attached (collectors attach forward hooks here). After the
        samples ran, ``on_layer(index, layer, prefix)`` may change the layer in place and return True:
        the samples are then run again through the changed layer and those outputs feed the next layer
        (GPTQ-style methods). The generator yields ``(index, layer, prefix)`` after each layer, with the
        layer still loaded; its weights are released when the caller asks for the next one.

        ``flows`` > 1 (the K-OOC paper's "double workflow"): that many models are streamed side by side,
        each with its own hidden states, all starting from the same embeddings. Each layer is read from
        the checkpoint once; for every flow f its original weights are restored, the flow's samples run
        with the hooks, ``on_layer(index, layer, prefix, flow=f)`` may change it (the flow's quantized
        layer) and the re-run outputs feed flow f's next layer. ``held_out`` (LongTensor m x L'): samples
        that follow every flow through its changed layers without reaching the hooks (validation text);
        their final hidden states are ``self.final_held[f]``, for :meth:`head_loss`. With ``flows`` = 1
        and no ``held_out`` this is the single stream above, unchanged.
        """
        torch = _torch()
        from tqdm.auto import tqdm
        captured, hidden = self._capture(tokens)
        hiddens = [hidden] * flows
        held_cap, held = (self._capture(held_out) if held_out is not None else (None, None))
        helds = [held] * flows
        bar = tqdm(total=self.n_layers, desc="calibration layers", unit="layer", disable=not progress)
        for i in range(self.n_layers):
            prefix = self.layer_name(i)
            self.materialize(prefix)
            layer = self.layers[i]
            original = ({k: v.detach().clone() for k, v in layer.state_dict().items()} if flows > 1 else None)
            for f in range(flows):
                if f > 0:
                    layer.load_state_dict(original)
                remove = hooks(i, layer, prefix) if hooks else None
                try:
                    out = self._forward_layer(layer, captured[i], hiddens[f])
                finally:
                    if remove:
                        remove()
                changed = on_layer and (on_layer(i, layer, prefix) if flows == 1 else
                                        on_layer(i, layer, prefix, flow=f))
                if changed:
                    out = self._forward_layer(layer, captured[i], hiddens[f])
                hiddens[f] = out
                if held_cap is not None:
                    helds[f] = self._forward_layer(layer, held_cap[i], helds[f])
            del original
            yield i, layer, prefix
            self.release(prefix)
            bar.update(1)
        bar.close()
        self.final_hidden = hiddens[0] if flows == 1 else hiddens
        self.final_held = helds if held_cap is not None else None

    def head_loss(self, hidden, tokens) -> float:
        """Mean next-token cross-entropy (nats) of ``tokens`` (n x L) from their last decoder layer's hidden
        states ``hidden`` (n x L x d): the model's final norm and output head, read from the checkpoint for
        this and released again (the stream's validation of a flow: :meth:`run`'s ``held_out``)."""
        torch = _torch()
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        norm = getattr(base, "norm", None)
        if norm is None:
            raise StreamError(f"{type(self.model).__name__}: no final norm found (model.get_decoder().norm)")
        norm_name = next(n for n, m in self.model.named_modules() if m is norm)
        head = self.model.get_output_embeddings()
        head_name = next(n for n, m in self.model.named_modules() if m is head)
        self.materialize(norm_name)
        self.materialize(head_name)
        try:
            total, count = 0.0, 0
            with torch.no_grad():
                for s in range(hidden.shape[0]):
                    logits = head(norm(hidden[s:s + 1])).float()
                    soft_cap = getattr(self.config.get_text_config(), "final_logit_softcapping", None)
                    if soft_cap:
                        logits = torch.tanh(logits / soft_cap) * soft_cap
                    t = tokens[s:s + 1].to(logits.device)
                    nll = torch.nn.functional.cross_entropy(logits[0, :-1], t[0, 1:], reduction="sum")
                    total += float(nll)
                    count += t.shape[1] - 1
        finally:
            self.release(head_name)
            self.release(norm_name)
        return total / count

    def _forward_layer(self, layer, cap: _Captured, hidden):
        torch = _torch()
        outs = []
        with torch.no_grad():
            for s in range(hidden.shape[0]):
                y = layer(hidden[s:s + 1], *cap.args, **cap.kwargs)
                outs.append(y[0] if isinstance(y, tuple) else y)
        return torch.cat(outs)
