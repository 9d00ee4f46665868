"""The grids of ggml's 32-weight block types, as a rounding function for error-compensating methods.

GPTQ-style methods quantize one column at a time and feed the rounding error forward, so they need
the target type's quantizer split in two: *choose a block's scale(s)* (done once per block, with the
type's own rule) and *round one weight to the nearest grid value under those fixed scales*. Here:

* :meth:`Grid.scales` -- the scales ggml itself picks for a block: the block's rows go through
  :func:`ggml_ext.quants.quantize` (ggml's quantizer; ggml-ext's exact search for IQ4_NL), optionally
  with per-column importances as the imatrix, and the fp16 scale fields are read back from the bytes;
* :meth:`Grid.state` / :meth:`Grid.round` -- nearest grid index and value of a column of weights
  under a block's fixed scales (torch, any device);
  values are computed in float32 the way ggml's ``to_float`` computes them, so they are exactly what
  llama.cpp will use;
* :meth:`Grid.pack` -- chosen indices and scales -> the type's block bytes (ggml's layout).

Supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (all 32-weight blocks). K-quants (256-weight
super-blocks with 6-bit sub-scales) are not here yet.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Grid", "GRIDS", "grid"]

#: IQ4_NL's non-linear grid (ggml's kvalues_iq4nl)
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)

QK = 32


@dataclass(frozen=True)
class Grid:
    """One 32-weight block type: ``levels`` indices, value ``d * (k - offset)`` (``d * kv[k]`` for
    IQ4_NL), plus ``m`` for the types with a minimum (Q4_1, Q5_1: ``d * k + m``)."""

    name: str
    levels: int
    offset: int          # k - offset is the signed quant (0 for the types with a minimum)
    has_min: bool
    nbytes: int          # bytes per block
    block: int = QK

    # ------------------------------------------------------------------ scales
    def scales(self, w: np.ndarray, importance: np.ndarray | None = None, **quantizer) -> np.ndarray:
        """The scale fields ggml writes for the blocks ``w`` (n_rows x 32 float32, one block per row):
        float32 array n_rows x (1 or 2) holding ``d`` (and ``m``), each exactly an fp16 value."""
        from ggml_ext import quants
        b = quants.quantize(np.ascontiguousarray(w, dtype=np.float32), self.name,
                            imatrix=None if importance is None else np.asarray(importance, np.float32), **quantizer)
        n = 2 if self.has_min else 1
        return b[:, :2 * n].copy().view(np.float16).astype(np.float32)

    # ------------------------------------------------------------------ round
    def state(self, s, dtype):
        """What :meth:`round` needs of one block's row scales ``s`` (torch float32, n x 1|2), prepared
        once per block: the scale in ``dtype``, a zero scale made infinite (x / inf = 0: the index of
        value 0), and for the types with a minimum both in float32."""
        import torch
        d = s[:, 0]
        st = {"d": d.to(dtype), "dsafe": torch.where(d == 0, torch.full_like(d, float("inf")), d).to(dtype)}
        if self.has_min:
            st["d32"], st["m32"], st["m"] = d, s[:, 1], s[:, 1].to(dtype)
        if self.name == "IQ4_NL":
            kv = torch.as_tensor(IQ4_NL_VALUES, device=s.device)
            st["grid"] = (d[:, None] * kv[None, :]).to(dtype)  # exact: 8-bit ints times fp16 values
        return st

    def round(self, x, st):
        """Nearest grid index (as a float of ``x``'s dtype) and its value for each entry of ``x`` (torch,
        n) under a block's :meth:`state`. Values are what ggml's to_float gives: d * (k - offset) and
        d * kv[k] are exact products in any float type; d * k + m is rounded once in float32 as ggml does."""
        if self.name == "IQ4_NL":
            k = (x[:, None] - st["grid"]).abs_().argmin(dim=1, keepdim=True)
            return k[:, 0].to(x.dtype), st["grid"].gather(1, k)[:, 0]
        base = x - st["m"] if self.has_min else x
        k = (base / st["dsafe"]).round_().add_(self.offset).clamp_(0, self.levels - 1)
        if self.has_min:
            return k, (k.float() * st["d32"] + st["m32"]).to(x.dtype)
        return k, (k - self.offset) * st["d"]

    # ------------------------------------------------------------------ bytes
    def pack(self, k: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Indices ``k`` (n_rows x n_cols ints) and scales ``s`` (n_rows x n_blocks x 1|2 float32) ->
        the tensor's bytes, n_rows x row_size uint8, in ggml's block layout."""
        n_rows, n_cols = k.shape
        nb = n_cols // QK
        k = k.reshape(n_rows, nb, QK).astype(np.uint8)
        out = np.zeros((n_rows, nb, self.nbytes), dtype=np.uint8)
        n = 2 if self.has_min else 1
        out[:, :, :2 * n] = s.astype(np.float16).view(np.uint8).reshape(n_rows, nb, 2 * n)
        at = 2 * n
        if self.name == "Q8_0":
            out[:, :, at:] = (k.astype(np.int16) - self.offset).astype(np.int8).view(np.uint8)
            return out.reshape(n_rows, -1)
        if self.levels == 32:  # Q5_0 / Q5_1: bit 4 of each quant in a 32-bit mask, low nibbles as Q4
            hi = ((k >> 4) & 1).astype(np.uint32)
            qh = (hi << np.arange(QK, dtype=np.uint32)).sum(axis=2, dtype=np.uint32)
            out[:, :, at:at + 4] = qh.astype("<u4").view(np.uint8).reshape(n_rows, nb, 4)
            at += 4
        lo = k & 15
        out[:, :, at:at + 16] = lo[:, :, :16] | (lo[:, :, 16:] << 4)
        return out.reshape(n_rows, -1)


GRIDS = {
    "Q4_0": Grid("Q4_0", 16, 8, False, 18),
    "Q4_1": Grid("Q4_1", 16, 0, True, 20),
    "Q5_0": Grid("Q5_0", 32, 16, False, 22),
    "Q5_1": Grid("Q5_1", 32, 0, True, 24),
    "Q8_0": Grid("Q8_0", 256, 128, False, 34),
    "IQ4_NL": Grid("IQ4_NL", 16, 0, False, 18),
}


def grid(type_name: str) -> Grid:
    """The :class:`Grid` of ggml type ``type_name``; KeyError if it has none."""
    return GRIDS[type_name.upper()]
