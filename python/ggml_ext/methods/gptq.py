"""``gptq``: GPTQ (Frantar et al. 2022) with the target ggml type's quantizer as the rounding function.

GPTQ quantizes a weight matrix W (rows x columns) one column at a time and spreads each column's
rounding error over the columns not yet quantized, weighted by the inverse Hessian of the layer's
squared output error, H = XᵀX of the layer's calibration inputs. The paper's Algorithm 1, as here:

    H  <- H + percdamp * mean(diag H) * I           (damping; dead columns, H_ii = 0: W_:i = 0, H_ii = 1)
    perm <- columns by descending diag(H)           (act-order; undone on output)
    U  <- Cholesky(H^-1), upper                     (row j: how column j's error moves later columns)
    for each lazy block of B columns (default 128):
        for each column j of the block:
            if j is the first column reached of its ggml block:   (32 weights of the ORIGINAL order;
                                                                    a K-quant's super-block: 256)
                choose that block's scale(s) per row from the current, error-updated weights,
                with the type's own scale rule (ggml's quantizer; importances 1 / U_kk^2)
            Q_:j <- nearest grid value of W_:j under the block's scales
            E_:j <- (W_:j - Q_:j) / U_jj
            W_:j.. (in the block) <- W_:j.. - E_:j U_j,j..
        W_:rest <- W_:rest - E_block U_block,rest              (the lazy update)

**Blocks and act-order.** ggml's blocks are 32 consecutive columns of the original order, whatever
order GPTQ visits columns in. A block's scales are chosen when the sweep reaches the first of its
columns in permuted order, from the current values of all its columns (none is quantized yet; those
outside the lazy block get the pending lazy update computed for the purpose). We chose this over
GPTQ's "static groups" (scales from the unmodified weights before the sweep) because the scales then
fit the weights actually rounded -- which already carry the error of every earlier column --, it
needs no extra pass, and without act-order it is exactly GPTQ's group-wise rule.

**K-quants** (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): the "block" is the 256-weight super-block and its
"scales" are the whole header ggml's K-quantizer writes for it (fp16 super-scale(s), 4-/6-/8-bit
sub-block scales and mins): chosen once per super-block as above, after which each column is
rounded to the grid of its 16- or 32-weight sub-block (``KGrid``).

**Scale rule.** ggml's own quantizer picks each block's scales (``Grid.scales``), so the scales
are those of the type (Q4_0's max/-8, ...; ggml-ext's exact search for IQ4_NL). By default
(``scale_importance="hessian"``) each column's importance for that choice is 1 / U_jj^2: the cost
GPTQ's objective assigns to a rounding error in column j once later columns compensate it
(ggml's importance-weighted scale search, as with an imatrix). ``"none"``: ggml's plain rule.

Two implementations of the same algorithm: :func:`gptq_reference` (numpy, float64, one column at a
time, every later column updated at once -- no lazy blocks) and :func:`gptq` (torch, float64 by
default, lazy block updates, on ``device``). They share the preparation (damping, dead columns,
permutation, Cholesky) and the grid; they differ only in the order the column updates are summed,
so the bytes agree unless a weight lands within ~1e-13 of a rounding boundary (tests/methods/
test_gptq.py checks they are identical on real layers).

The method needs each matrix's Hessian: the converter pipeline streams the model's decoder layers
through :mod:`ggml_ext.calibrate` (``calibration_needs``), quantizes each layer's matrices when its
Hessians are complete and feeds the quantized layer's output to the next layer. Matrices outside the
decoder layers (embeddings, output) have no Hessian there and get the type's RTN; so do matrices the
type policy gives a type without a grid here (none of the converter's own policies does: every type they
give a layer matrix has a grid; a --keep type such as Q4_0_4_4 would), with a warning.

Options (``methods.create("gptq", ...)``, ``convert(..., method_options=...)``; the method's defaults are the
best measured settings, docs/GPTQ.md "Defaults"; the functions below keep GPTQ's own, percdamp 0.01 and dynamic
scales): ``percdamp`` (0.1), ``act_order`` (True), ``v_hessian`` ("attention", the default: per kv head the
Hessian of the attention output, collect.py's ``attn_hessian``, docs/GPTQ.md says why; where a model has no
separate v_proj, the input Hessian | "input": H = XᵀX for v_proj as for every matrix),
``k_hessian`` ("input" | "attention": per kv head collect.py's key-weighted ``key_hessian`` for k_proj),
``shrink`` (0: the Hessian's off-diagonal scaled by 1 - shrink, see :func:`prepare`), ``block_size`` (128, the lazy block), ``scale_importance`` ("hessian"|"none"), ``scale_rule``
("static", the default: GPTQ's static groups, every block's scales fixed before the sweep by llama.cpp's
imatrix quantizer on the unmodified weights with diag(H) as the imatrix -- the scales ``llama-quantize
--imatrix`` would write | "dynamic": scales chosen when the sweep reaches a block, as above),
``implementation`` ("batched"|"reference"), ``device`` ("cpu", "cuda", ...), ``dtype`` ("float64"|
"float32"), ``iq4_nl_weighting`` (ggml-ext's IQ4_NL scale search, as for rtn).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import MethodError, register
from .grids import GRIDS, Grid, grid as _grid

__all__ = ["Clear", "GPTQ", "GPTQResult", "clear_grid", "round_clear", "GPTQError", "prepare", "sweep", "gptq",
           "gptq_reference"]

log = logging.getLogger("ggml_ext.methods.gptq")


class GPTQError(MethodError):
    """A Hessian GPTQ cannot use (wrong shape, non-finite, not positive definite after damping)."""


@dataclass
class Prepared:
    """What both implementations start from."""
    W: np.ndarray         # float64 rows x cols, dead columns zeroed, columns permuted
    U: np.ndarray         # upper Cholesky factor of the damped inverse Hessian (permuted order)
    perm: np.ndarray      # perm[j]: original column at position j
    pos: np.ndarray       # pos[c]: position of original column c
    importance: np.ndarray  # per ORIGINAL column: 1 / U_jj^2
    dead: np.ndarray      # original columns with H_ii == 0
    hdiag: np.ndarray     # per ORIGINAL column: H_ii as given (llama.cpp's imatrix entry for the column)


@dataclass(frozen=True)
class Clear:
    """Columns quantized at higher precision (K-OOC's clear columns): ``cols`` (original column indices)
    get ``bits``-bit rounding on their own grid, one scale and one minimum per row over these columns (the
    paper's f_GPTQ(h) for the clear part of the odd group: its second {scale, zero-point} set, see
    :func:`clear_grid`), chosen when the sweep reaches the first of them, from their error-updated values;
    their rounding error is compensated like any other column's. In the ggml blocks these columns count as
    zero: the block scales are chosen with them set to 0 and (with the Hessian importances) weighing almost
    nothing (:data:`CLEAR_IN_BLOCK`: the side-car corrects their entries, so they should not bind the block's
    grid), and their entries hold the grid value nearest 0 (exactly 0 for Q4_0/Q5_0/Q8_0/IQ4_NL's nearest)."""
    cols: np.ndarray
    bits: int


#: the clear grid's search, starting points: each end of a row's [min, max] range moved inwards by these
#: fractions of it (all pairs), and the scale range / (levels + delta) from the minimum, delta in CLEAR_DELTA
#: (ggml's make_qkx search); each refitted CLEAR_REFITS times by weighted least squares
CLEAR_SHRINK = tuple(i / 20 for i in range(7))   # 0 .. 0.3
CLEAR_DELTA = tuple(i / 10 for i in range(-10, 11))
CLEAR_REFITS = 2
#: a clear column's importance in its ggml block's scale choice, relative to its own: almost none, the
#: side-car corrects whatever W_l holds there (not 0: ggml's weighted searches divide by the weights' sum)
CLEAR_IN_BLOCK = 1e-6


def round_clear(x, bits: int, d, m):
    """``bits``-bit asymmetric rounding (torch): ``m + d * clamp(round((x - m) / d), 0, 2^bits - 1)``, the
    clear columns' grid; ``d`` and ``m`` broadcast against ``x`` (per row). Where d = 0 every value is m."""
    import torch
    safe = torch.where(d == 0, torch.full_like(d, float("inf")), d)
    return ((x - m) / safe).round_().clamp_(0, 2 ** bits - 1) * d + m


def clear_grid(x, bits: int, importance=None):
    """The clear columns' per-row grid: scale ``d`` and minimum ``m`` (torch, each shape x.shape[1:], exact
    fp16 values in x's dtype) for the current values ``x`` (k x n: k clear columns, n rows) at ``bits`` bits,
    so that :func:`round_clear` has the least importance-weighted squared error Σ_i w_i (x_i - q_i)² per row.

    GPTQ's quantizer is asymmetric (a half-float scale and a b-bit zero point per row and group; the paper's
    flags f): so is this, with a search that makes it at least as fine as a ggml K-quant's sub-block grid on
    the same values (Q2_K: a 4-bit scale and min per 16 weights). Starting points (:data:`CLEAR_SHRINK`,
    :data:`CLEAR_DELTA`): the row's range with its ends moved inwards (clipping an outlier can pay at 2
    bits) and the min-anchored scales ggml's make_qkx tries; each refitted :data:`CLEAR_REFITS` times by
    weighted least squares of (m, d) for the indices it gives (never worse than the indices it came from).
    Every start and refit is rounded to fp16 and scored under the values it would be stored with; the best
    is kept. ``importance`` (k, or k x n; None: uniform): the weight of each column's error -- the sweep
    passes 1 / U_jj², the cost GPTQ's objective gives an error left in column j, as for the block scales."""
    import torch
    levels = 2 ** bits - 1
    w = torch.ones_like(x) if importance is None else \
        torch.as_tensor(importance, dtype=x.dtype, device=x.device).reshape(x.shape[0], -1).expand_as(x)
    lo, hi = x.amin(dim=0), x.amax(dim=0)                     # n
    f = torch.tensor(CLEAR_SHRINK, dtype=x.dtype, device=x.device)
    fa, fb = (t.reshape(-1) for t in torch.meshgrid(f, f, indexing="ij"))
    delta = torch.tensor(CLEAR_DELTA, dtype=x.dtype, device=x.device)
    # start c: (d, m) = ((hi - lo) * span_c, lo + (hi - lo) * at_c)
    span = torch.cat([(1 - fa - fb).clamp(min=0) / levels, 1 / (levels + delta)])[:, None]
    at = torch.cat([fa, torch.zeros_like(delta)])[:, None]
    sw, sx = w.sum(0), (w * x).sum(0)
    best = (torch.full_like(lo, float("inf")), torch.zeros_like(lo), lo.clone())   # error, d, m

    def keep(best, d, m):
        d, m = d.to(torch.float16).to(x.dtype), m.to(torch.float16).to(x.dtype)   # as stored
        e = (w * (round_clear(x, bits, d[:, None], m[:, None]) - x) ** 2).sum(1)
        e, c = e.min(dim=0)
        better = e < best[0]
        pick = lambda t: t.gather(0, c[None])[0]  # noqa: E731
        return (torch.where(better, e, best[0]), torch.where(better, pick(d), best[1]),
                torch.where(better, pick(m), best[2]))

    for sp, a in zip(span.split(16), at.split(16)):          # starts in chunks (memory: 16 x k x n)
        d, m = (hi - lo) * sp, lo + (hi - lo) * a
        best = keep(best, d, m)
        for _ in range(CLEAR_REFITS):   # weighted least squares of x ~ m + d q for the indices q of (d, m)
            q = ((x - m[:, None]) / torch.where(d == 0, torch.inf, d)[:, None]).round_().clamp_(0, levels)
            sq, sqq, sqx = (w * q).sum(1), (w * q * q).sum(1), (w * q * x).sum(1)
            det = sw * sqq - sq * sq
            ok = det > 1e-12 * sw * sqq
            det = torch.where(ok, det, torch.ones_like(det))
            d1, m1 = (sw * sqx - sq * sx) / det, (sqq * sx - sq * sqx) / det
            ok &= d1 > 0
            d, m = torch.where(ok, d1, d), torch.where(ok, m1, m)
            best = keep(best, d, m)
    return best[1], best[2]


@dataclass
class GPTQResult:
    indices: np.ndarray   # rows x cols grid indices, original column order
    scales: np.ndarray    # rows x n_blocks x grid.nparams float32 (fp16 d/m; K-quants: the super-block header)
    Q: np.ndarray         # rows x cols float32: the quantized matrix (what ggml dequantizes the bytes to)
    #: with ``clear`` (OOC's clear columns): rows x k float32, the h-bit values of those columns (the
    #: matrix the sweep compensated is Q with these columns replaced by them)
    clear_values: np.ndarray | None = None

    def pack(self, g: Grid) -> np.ndarray:
        return g.pack(self.indices, self.scales)


def prepare(W: np.ndarray, H: np.ndarray, *, percdamp: float = 0.01, act_order: bool = True, shrink: float = 0.0,
            name: str = "matrix", device: str = "cpu") -> Prepared:
    """Damping, dead columns, act-order permutation and the Cholesky factor of H^-1 (float64, torch's
    LAPACK on ``device``; the arrays come back as numpy).

    ``shrink`` (alpha, 0..1): the off-diagonal of H is scaled by 1 - alpha before damping,
    H <- (1 - alpha) H + alpha diag(H) -- shrinkage of the sample Hessian towards its diagonal, which
    is llama.cpp's importance matrix. alpha = 0 is GPTQ; alpha = 1 leaves no error to propagate (H^-1
    diagonal), so with static scales every weight is rounded to the nearest grid value under the
    imatrix quantizer's scales: the imatrix quantizer up to ggml's own index choice (it rounds under
    its unrounded float scale; IQ4_NL's bytes are identical, Q4_0/Q4_1 agree on ~97-98% of weights).
    In between, GPTQ compensates errors only
    along the correlations the calibration sample supports strongly (the estimate of the off-diagonal
    from a few thousand tokens is the noisy part)."""
    import torch
    W = np.array(W, dtype=np.float64)
    H = np.array(H, dtype=np.float64)
    cols = W.shape[1]
    if H.shape != (cols, cols):
        raise GPTQError(f"{name}: Hessian of shape {H.shape} for a matrix of {cols} columns")
    if not np.isfinite(H).all():
        raise GPTQError(f"{name}: the Hessian holds NaN or infinite values (the calibration activations overflow)")
    if not np.isfinite(W).all():
        raise GPTQError(f"{name}: the weights hold NaN or infinite values")
    if not (0.0 <= shrink <= 1.0):
        raise GPTQError(f"{name}: shrink {shrink}: use a fraction 0 <= shrink <= 1")
    diag = np.diag(H).copy()
    hdiag = diag.copy()
    if shrink:
        H *= 1.0 - shrink
        H[np.diag_indices(cols)] = diag
    dead = np.flatnonzero(diag == 0)
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = np.argsort(-np.diag(H), kind="stable") if act_order else np.arange(cols)
    W = W[:, perm]
    H = H[np.ix_(perm, perm)]
    H[np.diag_indices(cols)] += percdamp * np.mean(np.diag(H))
    Ht = torch.from_numpy(H).to(device)
    L, info = torch.linalg.cholesky_ex(Ht)
    if int(info) == 0:
        U, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(L), upper=True)  # Hinv = U^T U
    if int(info) != 0:
        raise GPTQError(f"{name}: the damped Hessian is not positive definite; use a larger percdamp "
                        f"(now {percdamp}) or more calibration samples")
    U = U.cpu().numpy()
    pos = np.empty(cols, dtype=np.int64)
    pos[perm] = np.arange(cols)
    importance = 1.0 / np.diag(U)[pos] ** 2
    return Prepared(W, U, perm, pos, importance, dead, hdiag)


def _block_scales(g: Grid, values: np.ndarray, importance: np.ndarray | None, quantizer: dict) -> np.ndarray:
    return g.scales(values.astype(np.float32), None if importance is None else importance.astype(np.float32),
                    **quantizer)


def static_scales(g: Grid, p: Prepared, quantizer: dict) -> np.ndarray:
    """Every block's scales fixed before the sweep (GPTQ's "static groups"): the scales llama.cpp's
    imatrix quantizer picks for the unmodified weights with the Hessian's diagonal as importance matrix
    (its importance-weighted scale search), rows x n_blocks x nparams float32 (a K-quant's whole
    super-block header: fp16 super-scales and the quantized sub-block scales and mins)."""
    from ggml_ext import quants
    rows, cols = p.W.shape
    W = np.ascontiguousarray(p.W[:, p.pos], dtype=np.float32)   # original column order
    b = quants.quantize(W, g.name, imatrix=p.hdiag.astype(np.float32), **quantizer)
    return g.decode(b.reshape(rows, cols // g.block, g.nbytes))


def gptq_reference(W: np.ndarray, H: np.ndarray, type_name: str, *, percdamp: float = 0.01, act_order: bool = True,
                   shrink: float = 0.0, scale_importance: str = "hessian", scale_rule: str = "dynamic", quantizer: dict | None = None,
                   name: str = "matrix") -> GPTQResult:
    """GPTQ as the paper states it, one column at a time, every later column updated immediately
    (numpy, float64). The reference :func:`gptq` is tested against."""
    import torch
    g = _grid(type_name)
    p = prepare(W, H, percdamp=percdamp, act_order=act_order, shrink=shrink, name=name)
    rows, cols = p.W.shape
    nb = cols // g.block
    Wc = p.W.copy()
    scales = np.zeros((rows, nb, g.nparams), dtype=np.float32)
    fixed = static_scales(g, p, quantizer or {}) if scale_rule == "static" else None
    states: dict = {}
    idx = np.zeros((rows, cols), dtype=np.int64)
    Q = np.zeros((rows, cols), dtype=np.float32)
    for j in range(cols):
        c = p.perm[j]
        b = c // g.block
        if b not in states:
            if fixed is not None:
                scales[:, b] = fixed[:, b]
            else:
                block = p.pos[b * g.block:(b + 1) * g.block]           # positions of the block's columns
                imp = p.importance[b * g.block:(b + 1) * g.block] if scale_importance == "hessian" else None
                scales[:, b] = _block_scales(g, Wc[:, block], imp, quantizer or {})
            states[b] = g.state(torch.from_numpy(scales[:, b]), torch.float64)
        k, q = g.round(torch.from_numpy(Wc[:, j].copy()), states[b], c % g.block)
        idx[:, c], Q[:, c] = k.numpy(), q.numpy()
        err = (Wc[:, j] - Q[:, c].astype(np.float64)) / p.U[j, j]
        Wc[:, j:] -= np.outer(err, p.U[j, j:])
    return GPTQResult(idx, scales, Q)


def gptq(W: np.ndarray, H: np.ndarray, type_name: str, *, percdamp: float = 0.01, act_order: bool = True,
         shrink: float = 0.0, block_size: int = 128, scale_importance: str = "hessian", scale_rule: str = "dynamic",
         quantizer: dict | None = None, clear: Clear | None = None,
         device: str = "cpu", dtype: str = "float64", name: str = "matrix") -> GPTQResult:
    """GPTQ with lazy block updates, all rows at once, in torch on ``device``; same result as
    :func:`gptq_reference` (up to the summation order of the updates). ``clear``: K-OOC's clear columns
    (:class:`Clear`; dynamic scales only), whose h-bit values come back as ``clear_values``."""
    g = _grid(type_name)
    p = prepare(W, H, percdamp=percdamp, act_order=act_order, shrink=shrink, name=name, device=device)
    if clear is not None and scale_rule != "dynamic":
        raise GPTQError(f"{name}: clear columns need the dynamic scale rule")
    fixed = static_scales(g, p, quantizer or {}) if scale_rule == "static" else None
    return sweep(p, g, [clear], block_size=block_size, scale_importance=scale_importance, quantizer=quantizer,
                 fixed=fixed, device=device, dtype=dtype)[0]


def sweep(p: Prepared, g: Grid, clears: list[Clear | None], *, block_size: int = 128,
          scale_importance: str = "hessian", quantizer: dict | None = None, fixed: np.ndarray | None = None,
          device: str = "cpu", dtype: str = "float64", device_scales: bool = False) -> list[GPTQResult]:
    """The lazy-block GPTQ sweep of the prepared matrix ``p`` on grid ``g``, over one stacked copy of its
    rows per entry of ``clears``; the results, in order.

    A copy's entry is its clear columns (:class:`Clear`) or None (plain GPTQ). The copies share everything
    the sweep derives from the Hessian (permutation, U, importances) and GPTQ treats rows independently, so
    B copies are one sweep over B * rows rows: K-OOC's candidate groups (:func:`ggml_ext.methods.ooc.
    gptq_candidates`) batch this way, and one copy is :func:`gptq`. Every per-row operation is the one a
    single copy's sweep performs on that row, in the same order, so each copy's bytes are those of its own
    sweep. At a column that is clear in some copies, those rows take the h-bit value on their own per-row
    grid (:func:`clear_grid`, chosen when the copy reaches its first clear column) and the grid index of 0;
    in a block's scale choice their clear columns count as 0 and weigh :data:`CLEAR_IN_BLOCK`.

    ``fixed``: every block's scales chosen before the sweep (:func:`static_scales`; rows x n_blocks x
    nparams), else each block's are chosen when the sweep reaches it. ``device_scales``: Q4_0's block scales
    chosen on ``device`` by :func:`.scales_torch.q4_0_scales` (ggml's rule, bit for bit) instead of ggml's
    quantizer on the host, which saves a host round trip per block on a GPU."""
    import torch
    R, cols = p.W.shape
    B = len(clears)
    N = B * R
    nb = cols // g.block
    dev, dt = torch.device(device), getattr(torch, dtype)
    Wt = torch.from_numpy(p.W.T.copy()).to(dev, dt).repeat(1, B)   # cols x N: copy c in columns c*R..(c+1)*R
    U = torch.from_numpy(p.U).to(dev, dt)
    scales = torch.zeros((N, nb, g.nparams), dtype=torch.float32, device=dev)
    on_device = device_scales and g.name == "Q4_0"
    if on_device:
        from .scales_torch import q4_0_scales
    states: dict = {}
    K = torch.empty((cols, N), dtype=dt, device=dev)    # grid indices, by position
    Qt = torch.empty((cols, N), dtype=dt, device=dev)   # ggml's values (0's grid value at clear columns)
    perm = p.perm

    # the clear columns: M (B x cols, by ORIGINAL column), each copy's positions, slots and first position
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
    mclear = torch.zeros(N, dtype=dt, device=dev)    # copy reaches its first clear column
    hbits = torch.from_numpy(np.repeat(bits, R)).to(dev)

    def current(at, i1, i2, j, W1, E1, sl=slice(None)):
        """The current values (len(at) x rows ``sl``) of the columns at positions ``at``: inside the lazy
        block from W1, beyond it with the pending lazy update."""
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
            if b not in states and fixed is not None:
                scales[:, b] = torch.from_numpy(np.tile(fixed[:, b], (B, 1))).to(dev)
                states[b] = g.state(scales[:, b], dt)
            elif b not in states:
                lo, hi = b * g.block, (b + 1) * g.block
                cur = current(p.pos[lo:hi], i1, i2, j, W1, E1)
                if any_clear[lo:hi].any():   # each copy's clear columns count as 0 in its blocks
                    zero = Mdev[:, lo:hi].T.repeat_interleave(R, dim=1)
                    cur = torch.where(zero, torch.zeros_like(cur), cur)
                imp = p.importance[lo:hi] if scale_importance == "hessian" else None
                # rows sharing one importance vector: all copies, or each copy with clear columns in this
                # block on its own, its clear columns' importance scaled by CLEAR_IN_BLOCK (the side-car
                # holds them: they should not bind the block's scales)
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
            for cand in first.get(j, ()):   # copies reaching their first clear column: their h-bit grid
                sl = slice(cand * R, (cand + 1) * R)
                cimp = p.importance[clears[cand].cols] if scale_importance == "hessian" else None
                dclear[sl], mclear[sl] = clear_grid(current(clear_pos[cand], i1, i2, j, W1, E1, sl), int(bits[cand]),
                                                    cimp)
            w = W1[i]
            k, q = g.round(w, states[b], c % g.block)
            if any_clear[c]:
                m = Mdev[:, c].repeat_interleave(R)   # every row of the copies where column c is clear
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


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch's intra-op threads set to ``n`` for a while. The column sweep is thousands of small
    operations: split over threads they wait on each other (5x slower on a busy 2-core machine)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@register("gptq", "GPTQ error compensation with the type's own scales (needs calibration: --calib)")
class GPTQ:
    """The ``gptq`` method: per decoder-layer matrix, GPTQ with its Hessian; other matrices RTN."""

    #: what the converter pipeline must collect per layer (ggml_ext.calibrate.collect) for this method
    calibration_needs = ("hessian",)

    def __init__(self, percdamp: float = 0.1, act_order: bool = True, shrink: float = 0.0, v_hessian: str = "attention",
                 k_hessian: str = "input", block_size: int = 128,
                 scale_importance: str = "hessian", scale_rule: str = "static", implementation: str = "batched",
                 device: str = "cpu",
                 dtype: str = "float64", iq4_nl_weighting: str = "default"):
        from ggml_ext import quants
        from .rtn import RTN
        if not (0 <= percdamp < 1):
            raise MethodError(f"percdamp {percdamp}: use a fraction of the mean diagonal, 0 <= percdamp < 1")
        if not (0.0 <= shrink <= 1.0):
            raise MethodError(f"shrink {shrink}: use a fraction 0 <= shrink <= 1 (0: GPTQ, 1: the imatrix quantizer)")
        if v_hessian not in ("input", "attention"):
            raise MethodError(f"unknown v_hessian {v_hessian!r}; choose 'input' or 'attention'")
        if k_hessian not in ("input", "attention"):
            raise MethodError(f"unknown k_hessian {k_hessian!r}; choose 'input' or 'attention'")
        if block_size < 1:
            raise MethodError(f"block_size {block_size}: must be positive")
        if scale_importance not in ("hessian", "none"):
            raise MethodError(f"unknown scale_importance {scale_importance!r}; choose 'hessian' or 'none'")
        if scale_rule not in ("dynamic", "static"):
            raise MethodError(f"unknown scale_rule {scale_rule!r}; choose 'dynamic' or 'static'")
        if implementation not in ("batched", "reference"):
            raise MethodError(f"unknown implementation {implementation!r}; choose 'batched' or 'reference'")
        if dtype not in ("float64", "float32"):
            raise MethodError(f"dtype {dtype!r}: choose 'float64' or 'float32'")
        if iq4_nl_weighting not in quants.IQ4_NL_WEIGHTINGS:
            raise MethodError(f"unknown IQ4_NL weighting {iq4_nl_weighting!r}")
        self.options = dict(percdamp=percdamp, act_order=act_order, shrink=shrink, scale_importance=scale_importance,
                            scale_rule=scale_rule)
        self.implementation, self.block_size, self.device, self.dtype = implementation, block_size, device, dtype
        self.weighting = iq4_nl_weighting
        self.rtn = RTN(iq4_nl_weighting=iq4_nl_weighting)
        self.v_hessian, self.k_hessian = v_hessian, k_hessian
        # per instance: the pipeline reads it to collect what is needed
        self.calibration_needs = ("hessian",) + (("attn_hessian",) if v_hessian == "attention" else ()) \
            + (("key_hessian",) if k_hessian == "attention" else ())
        self.rtn_fallback: list[str] = []   # layer matrices whose type has no grid here (quantized RTN)

    #: the ggml types GPTQ rounds to (those with a :mod:`.grids` grid)
    types = tuple(t.lower() for t in GRIDS)

    @staticmethod
    def supports(type_name: str) -> bool:
        """Whether GPTQ can round to ggml type ``type_name`` (else the converter refuses the --type)."""
        return type_name.upper() in GRIDS

    def quantize(self, tensor_name: str, type_name: str, rows: np.ndarray, out: np.ndarray, *,
                 imatrix: np.ndarray | None = None, threads: int | None = None,
                 calibration: Any | None = None) -> int:
        """``calibration``: ``{"hessian": H}`` (n_per_row x n_per_row, XᵀX of the matrix's inputs) for the
        decoder layers' matrices; None for the others (embeddings, output), which get the type's RTN."""
        from ggml_ext import quants
        if calibration is None:
            if tensor_name.startswith("blk."):
                raise MethodError(f"gptq needs the Hessian of {tensor_name}: convert with a calibration text "
                                  "(--calib; the pipeline streams the layers)")
            return self.rtn.quantize(tensor_name, type_name, rows, out, imatrix=imatrix, threads=threads)
        if not self.supports(type_name):
            self.rtn_fallback.append(f"{tensor_name} ({type_name})")
            return self.rtn.quantize(tensor_name, type_name, rows, out, imatrix=imatrix, threads=threads)
        H = calibration["hessian"]
        qopt = {"weighting": self.weighting} if type_name.upper() == "IQ4_NL" else {}
        # v_proj with v_hessian="attention": each kv head's rows get the attention-output Hessian of that head
        # and k_proj with k_hessian="attention": each kv head's rows get that head's key-weighted Hessian
        Hs = calibration.get("attn_hessian") if self.v_hessian == "attention" else None
        if Hs is None and self.k_hessian == "attention":
            Hs = calibration.get("key_hessian")
        groups = [(rows, H)] if Hs is None else \
            [(g, Hg) for g, Hg in zip(np.split(rows, len(Hs)), Hs)]
        parts = []
        with _torch_threads(1) if self.device == "cpu" else contextlib.nullcontext():
            for R, Hg in groups:
                if self.implementation == "reference":
                    parts.append(gptq_reference(R, Hg, type_name, quantizer=qopt, name=tensor_name, **self.options))
                else:
                    parts.append(gptq(R, Hg, type_name, block_size=self.block_size, quantizer=qopt,
                                      device=self.device, dtype=self.dtype, name=tensor_name, **self.options))
        b = np.concatenate([r.pack(_grid(type_name)).reshape(r.indices.shape[0], -1) for r in parts])
        n = b.nbytes
        if n != rows.shape[0] * quants.row_size(type_name, rows.shape[1]) or out.nbytes < n:
            raise MethodError(f"{tensor_name}: GPTQ packed {n} bytes, the tensor needs "
                              f"{rows.shape[0] * quants.row_size(type_name, rows.shape[1])}")
        out.reshape(-1)[:n] = b.reshape(-1)
        return n
