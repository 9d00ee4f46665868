"""What calibration collects from the inputs of every linear layer, each opt-in by name.

``hessian``    H = XᵀX of the layer's input rows (tokens), accumulated in float64, with the row count:
               GPTQ and OOC read it (their H is 2/n · XᵀX).
``attn_hessian`` for each attention's v_proj only: per kv head g, H_g = Σ_(query heads h of g) Z_hᵀ Z_h
               with Z_h = A_h X (v_proj's inputs mixed by head h's attention weights), n_kv x d x d:
               the Hessian of the attention OUTPUT's error in v_proj's weights (v reaches the model only
               through o_q = Σ_t A_qt v_t). Needs the attention weights: the layer stream must run eager
               attention (``LayerStream(..., attention_weights=True)``).
``key_hessian`` for each attention's k_proj only, k_proj's counterpart (docs/GPTQ.md): a key k_t reaches the
               model only through the scores s_hqt = q_hq·k_t, and a score error moves the output by
               do_hq = Σ_t A_hqt ds_hqt (v_t - o_hq). Keeping the t = t' terms of ||do_hq||² and replacing
               each row's (q_hq)_r² by the row mean ||q_hq||²/d (RoPE is a rotation: it keeps norms) gives,
               per kv head g, a key-weighted input Hessian shared by the head's rows,
               H_g = Σ_t c_gt x_t x_tᵀ,  c_gt = Σ_(query heads h of g) Σ_q A_hqt² ||v_t - o_hq||² ||q_hq||²
               (n_kv x d x d; constant factors dropped: GPTQ does not see H's scale). q is the query the
               attention uses (after q_norm where the model has one), v the value projection's output.
               Needs eager attention, as attn_hessian does.
``probe_hessian`` XᵀX of the latest call's input rows only (float64): with the layer stream, which runs
               the samples one at a time, that is the LAST calibration sample -- the K-OOC paper's "probe
               input" (X_train[-1]): a candidate quantization Q of W is judged by the probe's output
               error ||(W - Q) X_probeᵀ||² = tr(ΔW H_probe ΔWᵀ) (methods/ooc.py).
``act_stats``  per input channel: Σ|x|, Σx², max |x|, the row count, and a histogram of |x| over
               fixed log2 bins (quantiles without keeping the activations): DEC thresholds, codebook
               importance, and llama.cpp's importance matrix (Σx² / count per column).

A :class:`Collector` attaches forward pre-hooks to the ``torch.nn.Linear`` modules of one decoder layer
(:meth:`attach`, the ``hooks`` argument of :meth:`ggml_ext.calibrate.stream.LayerStream.run`); the
results are keyed by the module's full name (``model.layers.3.self_attn.q_proj``). Linear layers that
read the same input (q/k/v, gate/up) share one computation.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["ATTENTION", "BACKWARD", "PROBE", "COLLECTORS", "Collector", "CalibrationError", "HIST_UPPER", "quantiles"]

COLLECTORS = ("hessian", "act_stats")
# collected on request only (not a default, not cached by stats.py): the OOC method's probe input
PROBE = ("probe_hessian",)
# collected on request only (not a default): needs the attention weights, i.e. eager attention in the stream
ATTENTION = ("attn_hessian", "key_hessian")
# collected by a backward pass of their own (.fisher), not by forward hooks
BACKWARD = ("fisher",)

# |x| histogram: bin 0 holds |x| < 2^-24 (zeros included), bin k (1 .. HIST_BINS-2) holds
# 2^(k-25) <= |x| < 2^(k-24), the last bin everything from 2^40 up. HIST_UPPER[k]: bin k's upper edge.
HIST_BINS = 66
HIST_UPPER = np.concatenate([2.0 ** np.arange(-24, HIST_BINS - 25), [np.inf]])


class CalibrationError(ValueError):
    """Calibration that cannot give meaningful numbers (non-finite activations, bad settings)."""


def _torch():
    import torch
    return torch


class Collector:
    """Accumulates the statistics named in ``what`` (a subset of :data:`COLLECTORS`) over every call."""

    def __init__(self, what: tuple[str, ...] | list[str] = COLLECTORS):
        unknown = set(what) - set(COLLECTORS) - set(BACKWARD) - set(ATTENTION) - set(PROBE)
        if unknown:
            raise ValueError(f"unknown statistics {sorted(unknown)}; "
                             f"choose from {', '.join(COLLECTORS + ATTENTION + PROBE + BACKWARD)}")
        self.what = tuple(w for w in what if w in COLLECTORS + ATTENTION + PROBE)
        self.results: dict[str, dict[str, np.ndarray]] = {}

    def _accumulate(self, name: str, x2d) -> None:
        torch = _torch()
        if not bool(torch.isfinite(x2d).all()):
            raise CalibrationError(f"non-finite activations at the input of {name}: the model overflows "
                                   f"in this dtype or its weights are broken")
        r = self.results.setdefault(name, {})
        n = x2d.shape[0]
        if "hessian" in self.what:
            x = x2d.to(torch.float64)
            h = x.T @ x
            if "hessian" in r:
                r["hessian"] += h
            else:
                r["hessian"] = h
            r["hessian_rows"] = r.get("hessian_rows", 0) + n
        if "probe_hessian" in self.what:   # replaced on every call: the last sample's
            x = x2d.to(torch.float64)
            r["probe_hessian"] = x.T @ x
        if "act_stats" in self.what:
            a = x2d.abs().to(torch.float64)
            sums = {"sum_abs": a.sum(0), "sum_sq": (a * a).sum(0)}
            amax = a.max(0).values
            # bin of each |x|: 0 below 2^-24, else floor(log2|x|) + 25, clamped to the last bin
            e = torch.floor(torch.log2(a.clamp_min(2.0 ** -24))).to(torch.int64) + 25
            e = torch.where(a < 2.0 ** -24, torch.zeros_like(e), e.clamp(1, HIST_BINS - 1))
            d = a.shape[1]
            idx = e + torch.arange(d, device=e.device)[None, :] * HIST_BINS
            hist = torch.bincount(idx.reshape(-1), minlength=d * HIST_BINS).reshape(d, HIST_BINS)
            for k, v in sums.items():
                r[k] = r[k] + v if k in r else v
            r["max_abs"] = torch.maximum(r["max_abs"], amax) if "max_abs" in r else amax
            r["hist"] = r["hist"] + hist if "hist" in r else hist
            r["rows"] = r.get("rows", 0) + n

    def attach(self, index: int, layer, prefix: str) -> Callable[[], None]:
        """Forward pre-hooks on every Linear of ``layer`` (named ``prefix.<path>``); returns their remover."""
        torch = _torch()
        handles = []

        def make(name):
            def hook(module, args):
                x = args[0]
                self._accumulate(name, x.detach().reshape(-1, x.shape[-1]))
            return hook

        for path, m in layer.named_modules():
            if isinstance(m, torch.nn.Linear):
                handles.append(m.register_forward_pre_hook(make(f"{prefix}.{path}")))
            if "attn_hessian" in self.what and isinstance(getattr(m, "v_proj", None), torch.nn.Linear):
                handles += self._attach_attention(m, f"{prefix}.{path}.v_proj" if path else f"{prefix}.v_proj")
            if "key_hessian" in self.what and isinstance(getattr(m, "k_proj", None), torch.nn.Linear):
                handles += self._attach_keys(m, f"{prefix}.{path}.k_proj" if path else f"{prefix}.k_proj")

        def remove():
            for h in handles:
                h.remove()
        return remove

    def _attach_attention(self, attn, v_name: str) -> list:
        """Hooks for ``attn_hessian``: v_proj's input, then the attention's weights (its forward's second
        output) mix it per query head; accumulated per kv head under ``v_name``."""
        torch = _torch()
        pending: list = []

        def pre(module, args):
            pending.append(args[0].detach())

        def post(module, args, out):
            A = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            x = pending.pop()
            if A is None:
                raise CalibrationError(f"{v_name}: the attention returned no weights; the layer stream must run "
                                       "eager attention for attn_hessian")
            X = x.reshape(A.shape[0], -1, x.shape[-1]).to(torch.float64)
            n_head, n_kv = A.shape[1], attn.v_proj.out_features // attn.head_dim
            Z = A.to(torch.float64) @ X[:, None]                 # batch x heads x T x d
            H = torch.einsum("bhtd,bhte->hde", Z, Z)               # per query head
            H = H.reshape(n_kv, n_head // n_kv, *H.shape[1:]).sum(1)
            r = self.results.setdefault(v_name, {})
            r["attn_hessian"] = r["attn_hessian"] + H if "attn_hessian" in r else H
        return [attn.v_proj.register_forward_pre_hook(pre), attn.register_forward_hook(post)]

    def _attach_keys(self, attn, k_name: str) -> list:
        """Hooks for ``key_hessian``: k_proj's input X, the queries (q_norm's output if the attention has one,
        else q_proj's), v_proj's output, then the attention's weights; accumulated per kv head under ``k_name``."""
        torch = _torch()
        seen: dict = {}

        def keep(key):
            def hook(module, args, out=None):
                seen[key] = (args[0] if out is None else out).detach()
            return hook

        q_mod = attn.q_norm if isinstance(getattr(attn, "q_norm", None), torch.nn.Module) else attn.q_proj

        def post(module, args, out):
            A = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if A is None:
                raise CalibrationError(f"{k_name}: the attention returned no weights; the layer stream must run "
                                       "eager attention for key_hessian")
            f64 = torch.float64
            B, n_head, T = A.shape[0], A.shape[1], A.shape[-1]
            d = attn.head_dim
            n_kv = attn.k_proj.out_features // d
            X = seen.pop("x").reshape(B, T, -1).to(f64)
            q = seen.pop("q").reshape(B, T, n_head, d).to(f64)
            v = seen.pop("v").reshape(B, T, n_kv, d).transpose(1, 2).to(f64)     # B x n_kv x T x d
            v = v.repeat_interleave(n_head // n_kv, dim=1)                         # per query head
            A = A.to(f64)
            o = A @ v                                                              # B x heads x Q x d
            dist = ((v * v).sum(-1)[:, :, None, :] - 2 * o @ v.transpose(-1, -2)  # ||v_t - o_q||², B x h x Q x T
                    + (o * o).sum(-1)[..., None]).clamp_(min=0)
            qn = (q * q).sum(-1).transpose(1, 2)                                   # B x heads x Q
            c = torch.einsum("bhqt,bhq->bht", A * A * dist, qn)
            c = c.reshape(B, n_kv, n_head // n_kv, T).sum(2)                       # B x n_kv x T
            H = torch.einsum("bgt,btd,bte->gde", c, X, X)
            r = self.results.setdefault(k_name, {})
            r["key_hessian"] = r["key_hessian"] + H if "key_hessian" in r else H
        return [attn.k_proj.register_forward_pre_hook(keep("x")), q_mod.register_forward_hook(keep("q")),
                attn.v_proj.register_forward_hook(keep("v")), attn.register_forward_hook(post)]

    def take(self, prefix: str) -> dict[str, dict[str, np.ndarray]]:
        """The finished results of the modules under ``prefix`` as numpy arrays (removed from the collector)."""
        out = {}
        for name in [n for n in self.results if n.startswith(prefix + ".")]:
            r = self.results.pop(name)
            out[name] = {k: (v.cpu().numpy() if hasattr(v, "cpu") else np.asarray(v)) for k, v in r.items()}
        return out


def quantiles(hist: np.ndarray, qs: list[float] | np.ndarray) -> np.ndarray:
    """Per channel, the |x| quantiles ``qs`` (0..1) from an act_stats histogram (n_channels x HIST_BINS):
    the upper edge of the bin where the cumulative count reaches q (exact to a factor of 2)."""
    hist = np.asarray(hist, dtype=np.float64)
    cum = np.cumsum(hist, axis=1)
    total = cum[:, -1:]
    upper = HIST_UPPER
    out = np.empty((hist.shape[0], len(qs)))
    for j, q in enumerate(qs):
        k = (cum < q * total).sum(axis=1)
        out[:, j] = upper[np.minimum(k, hist.shape[1] - 1)]
    return out
