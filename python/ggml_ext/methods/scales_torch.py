"""ggml's Q4_0 scale choice in torch, on any device, bit for bit: the batched sweeps' block scales
without a round trip to the host quantizer.

ggml's ``quantize_q4_0`` for one 32-weight block ``x`` (ggml-quants.c, the pinned llama.cpp):

* no importances (``quantize_row_q4_0_ref``): ``d = max / -8`` where ``max`` is the first entry of
  largest magnitude;
* importances ``qw`` (``quantize_row_q4_0_impl`` with the block as the row): ``w_i = qw_i *
  sqrt(sigma2 + x_i²)`` (sigma2: the block's mean square) and ``make_qx_quants(32, 8, x, L, 1, w)``: for
  the inverse scales ``-(8 + 0.1 is) / max``, is = 0, -9..9, the integer levels ``l_i = clamp(round(
  iscale x_i), -8, 7)`` and the weighted least-squares scale ``Σ w x l / Σ w l²``; the first candidate
  (is = 0) sets ``best = scale * Σwxl``, a later one replaces it when ``(Σwxl)² > best * Σwl²``.

Every sum here is accumulated in float32 in ggml's order (index 0 first), each product rounded as the C
expression rounds it (ggml-base is built without FMA contraction: -std=gnu11 for the x86-64 baseline,
no ``vfmadd`` in the library), ``round`` is half-to-even like ggml's ``nearest_int`` and sqrt and
division are correctly rounded (:func:`_exact`), so the fp16 scale equals ggml's (tests/methods/test_ooc_batched.py compares it
with the library on random and adversarial blocks; the device run repeats the check on the GPU).
"""
from __future__ import annotations

__all__ = ["q4_0_scales"]

GROUP_MAX_EPS = 1e-15


def _exact(op, *args):
    """``op`` (sqrt, division) of float32 tensors, correctly rounded to float32: computed in float64 and
    rounded once more (double rounding is harmless for + - * / sqrt when 53 >= 2 * 24 + 2 bits), so the
    result is IEEE's whatever approximation a vectorized float32 kernel uses (torch's CPU sqrt is off
    by an ulp at times)."""
    import torch
    return op(*(a.to(torch.float64) for a in args)).to(torch.float32)


def q4_0_scales(x, importance=None):
    """fp16 Q4_0 scale ``d`` (float32 tensor, n) of each row of ``x`` (torch float32, n x 32, one block
    per row) with ``importance`` (32 floats, the imatrix entries of the block's columns) or none."""
    import torch
    x = x.to(torch.float32)
    n = x.shape[0]
    ax = x.abs()
    first = ax.argmax(dim=1, keepdim=True)              # the first entry of largest magnitude
    amax = ax.gather(1, first)[:, 0]
    mx = x.gather(1, first)                              # n x 1, signed
    if importance is None:
        return (mx[:, 0] / -8.0).to(torch.float16).to(torch.float32)
    qw = torch.as_tensor(importance, dtype=torch.float32, device=x.device)
    s = torch.zeros(n, dtype=torch.float32, device=x.device)
    for j in range(32):                                 # sum_x2, in order
        s = s + x[:, j] * x[:, j]
    sigma2 = s / 32.0                                   # exact: a power of two
    w = qw[None, :] * _exact(torch.sqrt, sigma2[:, None] + x * x)
    steps = torch.tensor([0] + [i for i in range(-9, 10) if i], dtype=torch.float32, device=x.device)
    # -(nmax + 0.1f * is) / max for every candidate is (is = 0 gives ggml's first iscale, -nmax / max)
    inv = -(8.0 + torch.tensor(0.1, dtype=torch.float32) * steps)[None, :]   # 1 x 19, float32 like C
    safe = torch.where(mx == 0, torch.ones_like(mx), mx)
    iscale = _exact(torch.div, inv, safe)                # n x 19
    sumlx = torch.zeros((n, 19), dtype=torch.float32, device=x.device)
    suml2 = torch.zeros_like(sumlx)
    for j in range(32):
        xj = x[:, j:j + 1]
        lj = (iscale * xj).round().clamp(-8, 7)
        wj = w[:, j:j + 1]
        sumlx = sumlx + (wj * xj) * lj
        suml2 = suml2 + (wj * lj) * lj
    ratio = torch.where(suml2 > 0, _exact(torch.div, sumlx, torch.where(suml2 > 0, suml2, torch.ones_like(suml2))),
                        torch.zeros_like(suml2))
    scale = ratio[:, 0]
    best = scale * sumlx[:, 0]
    for c in range(1, 19):
        take = (suml2[:, c] > 0) & (sumlx[:, c] * sumlx[:, c] > best * suml2[:, c])
        scale = torch.where(take, ratio[:, c], scale)
        best = torch.where(take, ratio[:, c] * sumlx[:, c], best)
    scale = torch.where(amax < GROUP_MAX_EPS, torch.zeros_like(scale), scale)
    return scale.to(torch.float16).to(torch.float32)
