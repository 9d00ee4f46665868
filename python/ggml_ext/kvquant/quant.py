"""KVQuant's quantizer, as in the paper (Hooper et al., 2024, sections 3.3-3.5), in torch.

A *vector* is what shares one scale: a key **channel** (all tokens of one channel, keys quantized per
channel) or a value **token** (all channels of one token). Each vector is

1. split dense-and-sparse (3.4): values beyond a lower / upper threshold are outliers, kept in fp16;
   thresholds are per vector -- per channel calibrated offline for keys, per token computed online
   (the k-th largest / smallest of the token) for values;
2. normalised to [-1, 1] by those thresholds: ``(x - (hi + lo) / 2) / ((hi - lo) / 2)``;
3. rounded to the nearest level of a datatype: ``int`` (2^b uniform levels), ``nf`` (NormalFloat:
   quantiles of a normal distribution) or ``nuq`` (3.3: per-layer levels from Fisher-weighted k-means on
   the normalised calibration activations, ``argmin_Q Σ F_ii (A - Q(A))²``);
4. mapped back: ``level * (hi - lo) / 2 + (hi + lo) / 2``, outliers restored.

Q-Norm (3.5): the k-means centroids are shifted and scaled so the dequantized calibration
distribution keeps the mean and standard deviation of the normalised one,
``Ĉ = (C - μ2) σ1 / σ2 + μ1``: values are still rounded to the nearest centroid C (the signposts), and
the index is dequantized to Ĉ (a second table of the same size).

Everything here is *simulated* quantization: it returns the dequantized float tensor. The bytes of a
real cache (4-bit indices, sparse outliers) are the kernels' business (:mod:`.kernels`, the C cache types).
"""
from __future__ import annotations

from statistics import NormalDist

import numpy as np

__all__ = ["int_levels", "nf_levels", "fit_nuq", "q_norm", "token_thresholds", "quantile_thresholds",
           "fake_quant", "weighted_error"]


def _torch():
    import torch
    return torch


def int_levels(bits: int):
    """Uniform integer levels on [-1, 1] (asymmetric int-b: min and max of the vector are levels)."""
    torch = _torch()
    return torch.linspace(-1.0, 1.0, 2 ** bits, dtype=torch.float32)


def nf_levels(bits: int):
    """NormalFloat-b (QLoRA): 2^(b-1) positive and 2^(b-1) - 1 negative quantiles of N(0, 1), and an exact
    zero, scaled to [-1, 1]. The outermost quantile is taken at ``offset`` (the mean of 1 - 1/(2(n-1)) and
    1 - 1/(2n)) so it stays finite."""
    torch = _torch()
    n = 2 ** bits
    offset = 1 - 0.5 * (1 / (2 * (n - 1)) + 1 / (2 * n))
    nd = NormalDist()
    pos = [nd.inv_cdf(p) for p in np.linspace(offset, 0.5, n // 2 + 1)[:-1]]
    neg = [-nd.inv_cdf(p) for p in np.linspace(offset, 0.5, n // 2)[:-1]]
    v = np.sort(np.array(pos + [0.0] + neg))
    return torch.tensor(v / np.abs(v).max(), dtype=torch.float32)


def fit_nuq(x: np.ndarray, weight: np.ndarray, bits: int, seed: int = 0, n_init: int = 1) -> np.ndarray:
    """nuqX levels: Fisher-weighted 1-D k-means (scikit-learn ``KMeans`` with ``sample_weight``) of the
    normalised activations ``x`` with per-element Fisher weights ``weight``; 2^bits sorted centroids."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits
    x = np.asarray(x, dtype=np.float64).reshape(-1, 1)
    w = np.asarray(weight, dtype=np.float64).reshape(-1)
    if x.shape[0] != w.shape[0]:
        raise ValueError(f"fit_nuq: {x.shape[0]} values but {w.shape[0]} weights")
    k = 2 ** bits
    if len(np.unique(x)) < k:
        raise ValueError(f"fit_nuq: fewer than {k} distinct values to fit nuq{bits}")
    w = w + 1e-12 * max(w.max(), 1e-30)  # a zero-Fisher element still counts a little (never all-zero weights)
    # one thread: a 1-D fit of 50k points takes ~0.1 s, and OpenMP threads only fight for a busy CPU (8x slower)
    with threadpool_limits(1):
        km = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(x, sample_weight=w)
    return np.sort(km.cluster_centers_.reshape(-1)).astype(np.float32)


def _nearest(xn, levels):
    """Index of the nearest level (levels sorted ascending)."""
    torch = _torch()
    mids = (levels[1:] + levels[:-1]) / 2
    return torch.bucketize(xn, mids)


def q_norm(x: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Q-Norm: the dequantization values of ``levels``, shifted and scaled so that ``x`` rounded to
    ``levels`` and dequantized to them keeps x's mean and std."""
    torch = _torch()
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    lv = torch.as_tensor(np.asarray(levels, dtype=np.float32))
    q = lv[_nearest(xt, lv)]
    mu1, s1 = float(xt.mean()), float(xt.std())
    mu2, s2 = float(q.mean()), float(q.std())
    if s2 <= 0:
        return np.asarray(levels, dtype=np.float32)
    return ((np.asarray(levels, dtype=np.float64) - mu2) * s1 / s2 + mu1).astype(np.float32)


def token_thresholds(x, frac: float):
    """Online per-vector thresholds along the last axis: with ``frac`` > 0 the values beyond the k-th
    smallest / largest (k = round(n·frac/2), at least 1) are outliers; with 0, the min and max."""
    torch = _torch()
    n = x.shape[-1]
    if frac <= 0:
        return x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    k = max(1, int(round(n * frac / 2)))
    if 2 * k >= n:
        raise ValueError(f"outlier fraction {frac} leaves nothing to quantize in vectors of {n}")
    lo = torch.kthvalue(x, k + 1, dim=-1, keepdim=True).values
    hi = torch.kthvalue(x, n - k, dim=-1, keepdim=True).values
    return lo, hi


def quantile_thresholds(x, frac: float, dim: int = 0):
    """Per-channel thresholds over ``dim`` (tokens): the frac/2 and 1 - frac/2 quantiles (min/max at 0)."""
    torch = _torch()
    if frac <= 0:
        return x.amin(dim), x.amax(dim)
    x = x.transpose(dim, -1)
    lo, hi = token_thresholds(x, frac)
    return lo.squeeze(-1), hi.squeeze(-1)


def fake_quant(x, levels, lo, hi, keep_outliers: bool, values=None):
    """Dense-and-sparse quantize-dequantize of ``x`` with thresholds ``lo``/``hi`` (broadcast to x):
    normalise to [-1, 1], round to the nearest level, map back through ``values`` (the dequantization
    table: Q-Normed levels; default the levels themselves); values outside [lo, hi] are outliers, kept as
    they are when ``keep_outliers`` (else they round to the outermost level)."""
    torch = _torch()
    levels = levels.to(device=x.device, dtype=torch.float32)
    values = levels if values is None else values.to(device=x.device, dtype=torch.float32)
    xf = x.float()
    mid = (hi + lo).float() / 2
    half = ((hi - lo).float() / 2).clamp_min(1e-8)
    y = values[_nearest((xf - mid) / half, levels)] * half + mid
    if keep_outliers:
        y = torch.where((xf > hi) | (xf < lo), xf, y)
    return y.to(x.dtype)


def weighted_error(x, weight, levels) -> float:
    """Σ F (x - Q(x))² of normalised values ``x`` rounded to ``levels`` (the k-means objective, eq. 2)."""
    torch = _torch()
    xt = torch.as_tensor(np.asarray(x, dtype=np.float64))
    lv = torch.as_tensor(np.asarray(levels, dtype=np.float64))
    w = torch.as_tensor(np.asarray(weight, dtype=np.float64))
    return float((w * (xt - lv[_nearest(xt, lv)]) ** 2).sum())
