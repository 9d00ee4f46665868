"""The 4-bit residual of one linear: R = W − Ŵ, per output channel symmetric codes −7..7 and one scale.

The scale of output channel m is ``alpha · max|R[m]| / 7`` with alpha from a grid (``ALPHAS``) chosen to
minimise that channel's squared error (the paper's grid search). Stored input-channel-major: byte
``[j, m // 2]`` holds ``q[m, j] + 8`` in its low (even m) or high (odd m) nibble, so input channel j's
residual column is one contiguous row of ceil(M/2) bytes -- what one fetch reads."""
from __future__ import annotations

import numpy as np

from . import QMAX

ALPHAS = np.linspace(0.30, 1.00, 36)


def quantize(R: np.ndarray, alphas: np.ndarray = ALPHAS) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 [M, K] in −QMAX..QMAX, scales float32 [M]) of the residual ``R`` [M, K]."""
    import torch
    r = torch.from_numpy(np.ascontiguousarray(R, dtype=np.float32))
    amax = r.abs().amax(1)
    best_err = torch.full_like(amax, float("inf"))
    best_scale = torch.zeros_like(amax)
    for a in alphas:
        s = (amax * float(a) / QMAX).clamp_min(1e-30)
        q = torch.clamp(torch.round(r / s[:, None]), -QMAX, QMAX)
        err = ((q * s[:, None] - r) ** 2).sum(1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, s, best_scale)
    best_scale = torch.where(amax > 0, best_scale, torch.zeros_like(best_scale))
    q = torch.clamp(torch.round(r / best_scale.clamp_min(1e-30)[:, None]), -QMAX, QMAX)
    return q.to(torch.int8).numpy(), best_scale.numpy().astype(np.float32)


def pack(q: np.ndarray) -> np.ndarray:
    """Codes [M, K] → uint8 [K, ceil(M/2)], input-channel-major nibbles (code + 8)."""
    M, K = q.shape
    u = (q.astype(np.int16) + 8).astype(np.uint8).T          # [K, M]
    if M % 2:
        u = np.concatenate([u, np.full((K, 1), 8, np.uint8)], 1)
    return np.ascontiguousarray(u[:, 0::2] | (u[:, 1::2] << 4))


def unpack(packed: np.ndarray, M: int) -> np.ndarray:
    """uint8 [K, ceil(M/2)] → codes int8 [M, K] (the inverse of :func:`pack`)."""
    lo = (packed & 15).astype(np.int8) - 8
    hi = (packed >> 4).astype(np.int8) - 8
    u = np.empty((packed.shape[0], packed.shape[1] * 2), np.int8)
    u[:, 0::2], u[:, 1::2] = lo, hi
    return np.ascontiguousarray(u[:, :M].T)


def dequantize(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """R̂ = scales[m] · q[m, j], float32 [M, K]."""
    return q.astype(np.float32) * scales[:, None]
