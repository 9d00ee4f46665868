"""OOC's candidate groups (and the plain GPTQ flow) in one batched GPTQ sweep: the K-OOC paper's
row-flow-selection parallelism, in torch on any device.

The sequential OOC (:func:`ggml_ext.methods.ooc.gptq_hlps`, ``implementation="reference"``) runs one
full GPTQ sweep per candidate group. All those sweeps share the Hessian, so they share everything the
sweep derives from it -- damping, act-order permutation, the Cholesky factor U of H^-1, the scale
importances -- and differ only in which columns are clear. GPTQ treats the rows of W independently
(each row's error moves along the same U), so B candidates are one sweep over B stacked copies of W:

    Wb      <- [W; W; ...; W]                     (B * rows x cols; copy c belongs to candidate c)
    M[c, j] <- column j is clear in candidate c   (the per-candidate clear columns as a row mask)
    GPTQ sweep of Wb with the shared U, where at column j
        rows of candidates with M[c, j]:   h-bit value (their own clear scale), grid index of 0
        other rows:                        nearest grid value under the block's scales
    block scales: chosen per row, as always, from the current values with each row's clear columns at 0

A candidate list may hold ``None``: a copy with no clear column, i.e. the plain GPTQ(l) flow run in
the same sweep (the paper's flow parallelism; in the converter pipeline the two flows see different
layer inputs after the first layer, so there they are separate calls and only the candidates batch).

Every per-row operation is the one :func:`ggml_ext.methods.gptq.gptq` performs on that row, in the same
order (the lazy update is one matrix product over all copies' rows), so each candidate's bytes, scales,
clear values and side-car are those of its own sequential sweep (tests/methods/test_ooc_batched.py
checks they are identical). The probe losses are computed on the device for all candidates at once
(float64 ``sum((ΔW H_probe) ∘ ΔW)``); they equal the reference's numpy losses to rounding, so the chosen
group is the same unless two candidates tie to ~1e-12.

Block scales: on a GPU, Q4_0's are chosen on the device (:mod:`.scales_torch`, ggml's rule bit for bit, no host
round trip); the other types' go through ggml's quantizer on the host, one call for all candidates' rows
per block.

What it saves: one sweep's thousands of small per-column kernels and host round trips instead of one
per candidate; the work per column grows with B but stays far from filling a GPU.
"""
from __future__ import annotations

import math

import numpy as np

from .gptq import CLEAR_IN_BLOCK, Clear, GPTQError, GPTQResult, _block_scales, clear_grid, prepare, round_clear
from .grids import grid as _grid
from .scales_torch import q4_0_scales

__all__ = ["gptq_candidates", "gptq_hlps_batched"]


def gptq_candidates(W: np.ndarray, H: np.ndarray, type_name: str, clears: list[Clear | None], *,
                    percdamp: float = 0.01, act_order: bool = True, shrink: float = 0.0, block_size: int = 128,
                    scale_importance: str = "hessian", quantizer: dict | None = None, device: str = "cpu",
                    dtype: str = "float64", device_scales: bool | None = None, name: str = "matrix") -> list[GPTQResult]:
    """One GPTQ sweep (dynamic scales) for every entry of ``clears`` (a :class:`Clear` or None: no clear
    column) over B stacked copies of ``W``; the results, in order, are those of
    ``gptq(W, H, type_name, clear=clears[c], ...)``. ``device_scales``: Q4_0's block scales chosen on
    ``device`` by :func:`.scales_torch.q4_0_scales` (ggml's rule, bit for bit) instead of ggml's quantizer
    on the host (None: on any device but the CPU, where the host quantizer is faster: 2.9 s vs 3.8 s for
three 576x576 candidates on one thread); the other types always use the host quantizer."""
    import torch
    if not clears:
        raise GPTQError(f"{name}: no candidate to quantize")
    g = _grid(type_name)
    p = prepare(W, H, percdamp=percdamp, act_order=act_order, shrink=shrink, name=name, device=device)
    R, cols = p.W.shape
    B = len(clears)
    N = B * R
    nb = cols // g.block
    dev, dt = torch.device(device), getattr(torch, dtype)
    Wt = torch.from_numpy(p.W.T.copy()).to(dev, dt).repeat(1, B)   # cols x N: copy c in columns c*R..(c+1)*R
    U = torch.from_numpy(p.U).to(dev, dt)
    scales = torch.zeros((N, nb, g.nparams), dtype=torch.float32, device=dev)
    if device_scales is None:
        device_scales = torch.device(device).type != "cpu"
    on_device = device_scales and g.name == "Q4_0"
    states: dict = {}
    K = torch.empty((cols, N), dtype=dt, device=dev)    # grid indices, by position
    Qt = torch.empty((cols, N), dtype=dt, device=dev)   # ggml's values (0's grid value at clear columns)
    perm = p.perm

    # the clear columns: M (B x cols, by ORIGINAL column), each candidate's positions, slots and first position
    M = np.zeros((B, cols), dtype=bool)
    bits = np.zeros(B, dtype=np.int64)
    clear_pos, first, slot = {}, {}, {}
    for c, cl in enumerate(clears):
        if cl is None:
            continue
        M[c, cl.cols] = True
        bits[c] = cl.bits
        clear_pos[c] = p.pos[cl.cols]
        first.setdefault(int(clear_pos[c].min()), []).append(c)
        slot[c] = {int(j): n for n, j in enumerate(clear_pos[c])}
    CV = {c: torch.empty((len(clear_pos[c]), R), dtype=dt, device=dev) for c in clear_pos}
    Mdev = torch.from_numpy(M).to(dev)
    any_clear = M.any(axis=0)                        # by ORIGINAL column
    dclear = torch.zeros(N, dtype=dt, device=dev)    # each row's clear grid (scale, minimum), set when its
    mclear = torch.zeros(N, dtype=dt, device=dev)    # candidate reaches its first clear column
    hbits = torch.from_numpy(np.repeat(bits, R)).to(dev)

    def rows_of(mask_b):   # B bools (torch) -> N bools: every row of those candidates
        return mask_b.repeat_interleave(R)

    def current(at, i1, i2, j, W1, E1, sl=slice(None)):
        """The current values (len(at) x rows ``sl``) of the columns at positions ``at`` (as gptq's)."""
        inside = torch.from_numpy(at < i2).to(dev)
        bt = torch.from_numpy(at).to(dev)
        return torch.where(inside[:, None], W1[(bt - i1).clamp(0, i2 - i1 - 1), sl],
                           Wt[bt, sl] - U[i1:j, bt].T @ E1[:j - i1, sl])

    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1 = Wt[i1:i2].clone()
        U1 = U[i1:i2, i1:i2]
        E1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            j = i1 + i
            c = int(perm[j])
            b = c // g.block
            if b not in states:
                lo, hi = b * g.block, (b + 1) * g.block
                cur = current(p.pos[lo:hi], i1, i2, j, W1, E1)
                if any_clear[lo:hi].any():   # each copy's clear columns count as 0 in its blocks
                    zero = Mdev[:, lo:hi].T.repeat_interleave(R, dim=1)
                    cur = torch.where(zero, torch.zeros_like(cur), cur)
                imp = p.importance[lo:hi] if scale_importance == "hessian" else None
                # rows sharing one importance vector: all copies, or (as gptq() does) each copy with clear columns
                # in this block on its own, its clear columns' importance scaled by CLEAR_IN_BLOCK
                groups = [(slice(None), imp)]
                if imp is not None and M[:, lo:hi].any():
                    groups = [(slice(c * R, (c + 1) * R), np.where(M[c, lo:hi], imp * CLEAR_IN_BLOCK, imp))
                              for c in range(B)]
                for sl, im in groups:
                    if on_device:
                        scales[sl, b, 0] = q4_0_scales(cur[:, sl].T.to(torch.float32),
                                                       None if im is None else torch.from_numpy(im.astype(np.float32)))
                    else:
                        scales[sl, b] = torch.from_numpy(_block_scales(g, cur[:, sl].T.cpu().numpy(), im,
                                                                       quantizer or {}))
                states[b] = g.state(scales[:, b], dt)
            for cand in first.get(j, ()):   # candidates reaching their first clear column: their h-bit grid
                sl = slice(cand * R, (cand + 1) * R)
                cimp = p.importance[clears[cand].cols] if scale_importance == "hessian" else None
                dclear[sl], mclear[sl] = clear_grid(current(clear_pos[cand], i1, i2, j, W1, E1, sl), int(bits[cand]),
                                                    cimp)
            w = W1[i]
            k, q = g.round(w, states[b], c % g.block)
            if any_clear[c]:
                m = rows_of(Mdev[:, c])
                k0, q0 = g.round(torch.zeros_like(w), states[b], c % g.block)
                qc = torch.zeros_like(w)
                for hb in np.unique(bits[M[:, c]]):   # one rounding per clear bit width present
                    sel = m & (hbits == int(hb))
                    qc = torch.where(sel, round_clear(w, int(hb), dclear, mclear), qc)
                K[j] = torch.where(m, k0, k)
                Qt[j] = torch.where(m, q0, q)
                for cand in np.flatnonzero(M[:, c]):
                    CV[int(cand)][slot[int(cand)][j]] = qc[int(cand) * R:(int(cand) + 1) * R]
                q = torch.where(m, qc, q)
            else:
                K[j], Qt[j] = k, q
            err = (w - q) / U1[i, i]
            W1[i:].sub_(torch.outer(U1[i, i:], err))
            E1[i] = err
        Wt[i2:] -= U[i1:i2, i2:].T @ E1
    inv = torch.from_numpy(p.pos).to(dev)
    idx = K[inv].T.to(torch.int64).cpu().numpy()
    Q = Qt[inv].T.to(torch.float32).cpu().numpy()
    scales = scales.cpu().numpy()
    out = []
    for c in range(B):
        sl = slice(c * R, (c + 1) * R)
        cv = None if c not in CV else np.ascontiguousarray(CV[c].T.to(torch.float32).cpu().numpy())
        out.append(GPTQResult(np.ascontiguousarray(idx[sl]), np.ascontiguousarray(scales[sl]),
                              np.ascontiguousarray(Q[sl]), cv))
    return out


def probe_losses(W: np.ndarray, effective: list[np.ndarray], H_probe: np.ndarray, device: str = "cpu") -> list[float]:
    """tr(ΔW H_probe ΔWᵀ) of each candidate's effective matrix (float64 torch on ``device``; the
    reference's :func:`ggml_ext.methods.ooc.probe_loss` up to summation order)."""
    import torch
    dev = torch.device(device)
    W64 = torch.from_numpy(np.asarray(W, np.float64)).to(dev)
    Hp = torch.from_numpy(np.asarray(H_probe, np.float64)).to(dev)
    out = []
    for E in effective:
        D = W64 - torch.from_numpy(np.asarray(E, np.float64)).to(dev)
        out.append(float(((D @ Hp) * D).sum()))
    return out


def gptq_hlps_batched(W: np.ndarray, H: np.ndarray, H_probe: np.ndarray, type_name: str, *, h: int = 8,
                      p: float = 0.1, s: float = 0.1, group: int = 128, sidecar_type: str = "F32",
                      name: str = "matrix", with_plain: bool = False, **gptq_options):
    """GPTQ(h, l, p, s) of one matrix with all candidate groups in one sweep: the result of
    :func:`ggml_ext.methods.ooc.gptq_hlps` (same candidates, same bytes, same choice). ``with_plain``:
    the plain GPTQ(l) result of the same matrix from the same sweep as well, returned as
    ``(ooc_result, plain_result)``."""
    from .ooc import OOCResult, _stored, clear_columns, salient_scores
    scores = salient_scores(W, H, group)
    n_scan = max(1, math.ceil(s * len(scores)))
    scan = [int(g) for g in np.argsort(-scores, kind="stable")[:n_scan]]
    cols = [clear_columns(W, H, g, group, p) for g in scan]
    clears: list[Clear | None] = [Clear(c, h) for c in cols] + ([None] if with_plain else [])
    results = gptq_candidates(W, H, type_name, clears, name=name, **gptq_options)
    cands = []
    for g, c, r in zip(scan, cols, results):
        S = _stored(r.clear_values - r.Q[:, c], sidecar_type)
        cands.append(OOCResult(r, g, c, S, 0.0))
    losses = probe_losses(W, [cand.effective() for cand in cands], H_probe, gptq_options.get("device", "cpu"))
    for cand, loss in zip(cands, losses):
        cand.loss = loss
    best = min(cands, key=lambda r: r.loss)   # the first of least loss, as the reference's scan keeps
    best.candidates = [(cand.group, cand.loss) for cand in cands]
    return (best, results[-1]) if with_plain else best
