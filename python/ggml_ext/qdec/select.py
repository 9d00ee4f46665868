"""Which input channels QDEC compensates for each token: per 1024-channel chunk, k_chunk channels of the
largest |x| (k = min(k_chunk, chunk length); the last chunk may be shorter).

``approximate`` (the paper's fast top-k, Fig. 8/9): |x| goes into 32 buckets -- 16 uniform over [b15, b0]
(values above b0 in the top one) and 16 uniform over [0, b15) -- buckets are taken whole from the top
while they fit, and the bucket that overflows gives its first channels in index order (the paper picks
at random inside it; the GPU takes whichever arrive first). b0 is the largest |x| seen in calibration,
b15 the largest k-th largest |x| of a chunk (per k_chunk). ``exact``: the k largest |x|.

The float32 arithmetic of :func:`bucket` is the C reference's (ggml_ext_qdec_bucket), so both pick the
same channels (tests/methods/test_dec.py checks it on real activations)."""
from __future__ import annotations

from . import CHUNK


def bucket(v, b0: float, b15: float):
    """Bucket (0 top … 31 bottom) of magnitudes ``v`` (a float32 tensor, NaN read as 0)."""
    import torch
    v = torch.nan_to_num(v.to(torch.float32), nan=0.0)
    f0 = torch.tensor(b0, dtype=torch.float32)
    f15 = torch.tensor(b15, dtype=torch.float32)
    if bool(f0 > f15):
        t = (v - f15) / (f0 - f15) * 16.0
        hi = 15 - torch.where(t >= 15.0, torch.full_like(t, 15.0), torch.floor(t)).to(torch.int64)
    else:
        hi = torch.zeros_like(v, dtype=torch.int64)
    t = v / f15 * 16.0
    lo = 31 - torch.where(t >= 15.0, torch.full_like(t, 15.0), torch.floor(t)).to(torch.int64)
    out = torch.where(v >= f15, hi, lo)
    return torch.where(v > 0, out, torch.full_like(out, 31))


def mask(x, k_chunk: int, b0: float | None = None, b15: float | None = None, exact: bool = False):
    """Bool mask [T, K] of the channels chosen in each row of ``x`` [T, K]."""
    import torch
    T, K = x.shape
    out = torch.zeros((T, K), dtype=torch.bool, device=x.device)
    if k_chunk <= 0:
        return out
    a = torch.nan_to_num(x.detach().abs().to(torch.float32), nan=0.0)
    for c in range(0, K, CHUNK):
        L = min(CHUNK, K - c)
        k = min(k_chunk, L)
        part = a[:, c:c + L]
        if exact:
            # largest |x| first, ties to the lower index: a stable descending sort
            order = torch.sort(part, dim=1, descending=True, stable=True).indices[:, :k]
        else:
            if b0 is None or b15 is None:
                raise ValueError("the approximate top-k needs the bucket boundaries b0 and b15")
            key = bucket(part, b0, b15) * (2 * CHUNK) + torch.arange(L, device=x.device)[None, :]
            order = torch.topk(key, k, dim=1, largest=False, sorted=False).indices
        out[:, c:c + L].scatter_(1, order, True)
    return out


def static_mask(score, k_chunk: int):
    """Bool mask [K] of the k_chunk channels per chunk with the largest ``score`` (calibration mean |x|)."""
    import torch
    K = score.shape[0]
    out = torch.zeros(K, dtype=torch.bool)
    for c in range(0, K, CHUNK):
        L = min(CHUNK, K - c)
        idx = torch.topk(score[c:c + L], min(k_chunk, L)).indices if k_chunk > 0 else torch.empty(0, dtype=torch.int64)
        out[c + idx] = True
    return out


def random_mask(T: int, K: int, k_chunk: int, generator, device="cpu"):
    """Bool mask [T, K]: k_chunk channels per chunk drawn uniformly per row."""
    import torch
    out = torch.zeros((T, K), dtype=torch.bool, device=device)
    for c in range(0, K, CHUNK):
        L = min(CHUNK, K - c)
        k = min(k_chunk, L)
        if k <= 0:
            continue
        r = torch.rand((T, L), generator=generator).to(device)
        out[:, c:c + L].scatter_(1, torch.topk(r, k, dim=1).indices, True)
    return out


def recall(approx, exact) -> float:
    """Fraction of the exact top-k channels the approximate selection found (masks of equal counts)."""
    n = int(exact.sum())
    return float((approx & exact).sum()) / n if n else 1.0
