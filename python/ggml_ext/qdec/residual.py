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
    r = np.ascontiguousarray(R, dtype=np.float32)
    amax = np.abs(r).max(1)
    best_err = np.full(amax.shape, np.inf, np.float32)
    best_scale = np.zeros_like(amax)
    for a in alphas:
        s = np.maximum(amax * np.float32(a) / QMAX, np.float32(1e-30))
        q = np.clip(np.rint(r / s[:, None]), -QMAX, QMAX)
        q *= s[:, None]
        q -= r
        err = np.einsum("ij,ij->i", q, q)
        better = err < best_err
        best_err[better] = err[better]
        best_scale[better] = s[better]
    best_scale[amax == 0] = 0
    q = np.clip(np.rint(r / np.maximum(best_scale, np.float32(1e-30))[:, None]), -QMAX, QMAX).astype(np.int8)
    return q, best_scale.astype(np.float32)


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
