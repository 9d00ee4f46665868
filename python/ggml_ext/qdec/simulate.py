"""The model in torch with a quantized base and QDEC's compensation, for perplexity.

:class:`DecModel` loads the Hugging Face model, puts the base GGUF's dequantized weights into every
decoder-layer linear the side file covers, and adds a forward hook that computes, per token,

    y += R̂[:, sel] · x[sel]      (R̂ the side file's 4-bit residual, sel chosen by ``mode``)

``mode``: ``dynamic`` (the paper's bucketed approximate top-k per 1024-chunk, :func:`.select.mask`),
``exact`` (exact top-k per chunk), ``static`` (the channels of largest calibration mean |x|, the same for
every token), ``random`` (k_chunk channels drawn per token and chunk), ``full`` (every channel: the
4-bit residual's ceiling), ``none``/k_chunk 0 (the base alone). Every decoder-layer linear gets the base
weights; those the side file covers (all, or the layers it was calibrated for) get the compensation.
Runs on any torch device.
"""
from __future__ import annotations

import math
import os

import numpy as np

from . import select
from .calibration import DecError, _unpermute_rows, base_weight, linear_map, load

MODES = ("dynamic", "exact", "static", "random", "full")


class DecModel:
    def __init__(self, base: str | os.PathLike, side: str | os.PathLike, model_dir: str | os.PathLike,
                 device: str = "cpu", seed: int = 0):
        import torch
        from transformers import AutoModelForCausalLM
        self.side = load(side, base)
        linears, arch, hp, ckpt = linear_map(base, model_dir)
        if ckpt.source_hash() != self.side.meta["model_sha256"]:
            raise DecError(f"{side} was made for another model than {model_dir}")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
        self.device = torch.device(device)
        self.gen = torch.Generator().manual_seed(seed)
        self.seed = seed
        self.mode, self.k_chunk = "none", 0
        self.hits = self.wanted = 0     # dynamic mode: channels of the exact top-k the selection found
        self.layers: dict[str, dict] = {}
        for module, hf_name, gname, t in linears:
            lin = self.model.get_submodule(module)
            w_hat = _unpermute_rows(arch, hp, hf_name, base_weight(base, t))
            lin.weight.data.copy_(torch.from_numpy(np.ascontiguousarray(w_hat)))
            d = self.side.linears.get(gname)
            if d is None:   # a side file of some layers: this linear runs on the base alone
                continue
            R = _unpermute_rows(arch, hp, hf_name, d.residual())
            self.layers[module] = {"R": torch.from_numpy(np.ascontiguousarray(R)).to(self.device), "dec": d,
                                   "act": torch.from_numpy(d.act)}
            lin.register_forward_hook(self._hook(module))

    def configure(self, mode: str, k_chunk: int) -> None:
        """Compensate with ``mode`` (one of :data:`MODES`, or "none") at ``k_chunk`` channels per chunk."""
        if mode not in MODES + ("none",):
            raise ValueError(f"mode {mode!r}: choose from {', '.join(MODES + ('none',))}")
        self.mode, self.k_chunk = mode, int(k_chunk)
        self.hits = self.wanted = 0
        self.gen.manual_seed(self.seed)
        for L in self.layers.values():
            L["static"] = select.static_mask(L["act"], self.k_chunk).to(self.device) if mode == "static" else None

    def _hook(self, module: str):
        def hook(lin, args, out):
            if self.mode == "none" or (self.k_chunk <= 0 and self.mode != "full"):
                return None
            L = self.layers[module]
            x = args[0].reshape(-1, args[0].shape[-1])
            m = self.mask(L, x)
            if self.mode == "dynamic":
                e = select.mask(x, self.k_chunk, exact=True)
                self.hits += int((m & e).sum())
                self.wanted += int(e.sum())
            xs = x * m if m is not None else x
            return out + (xs @ L["R"].T).reshape(out.shape)
        return hook

    def mask(self, L: dict, x):
        """The channels compensated for the rows of ``x`` (None: all of them)."""
        if self.mode == "full":
            return None
        if self.mode == "static":
            return L["static"][None, :]
        if self.mode == "random":
            return select.random_mask(x.shape[0], x.shape[1], self.k_chunk, self.gen, x.device)
        d = L["dec"]
        return select.mask(x, self.k_chunk, d.b0(), d.b15(self.side.k_chunks, self.k_chunk),
                           exact=self.mode == "exact")

    @property
    def recall(self) -> float:
        """Of the exact top-k channels of every token and linear since :meth:`configure`, the fraction the
        dynamic (approximate) selection picked."""
        return self.hits / self.wanted if self.wanted else float("nan")

    def perplexity(self, tokens, first: int = 0) -> float:
        """exp(mean next-token NLL) over the rows of ``tokens`` (n x L LongTensor), scoring the tokens
        predicted from positions ``first`` .. L-2 of each row (``first = L // 2``: llama-perplexity's
        scoring of a window)."""
        import torch
        if not 0 <= first < tokens.shape[1] - 1:
            raise ValueError(f"first {first}: need 0 <= first < {tokens.shape[1] - 1}")
        nll, n = 0.0, 0
        with torch.no_grad():
            for row in tokens:
                ids = row[None].to(self.device)
                # logits_to_keep: the head only for the positions scored (Gemma's 262k vocabulary)
                logits = self.model(input_ids=ids, use_cache=False,
                                    logits_to_keep=ids.shape[1] - first).logits[0, :-1].float()
                nll += float(torch.nn.functional.cross_entropy(logits, ids[0, first + 1:], reduction="sum"))
                n += ids.shape[1] - 1 - first
        return math.exp(nll / n)
