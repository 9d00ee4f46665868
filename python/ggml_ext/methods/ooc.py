"""``ooc``: K-Odd One Clear, OOC(h, l, p, s) -- GPTQ at l bits with one clear group per matrix.

The K-OOC paper (shared/papers/003, section 3.2; FORMATS.md "OOC and bit families"), as here:

    GPTQ(h, l, p, s) for one matrix W (rows x d) with Hessian H and probe Hessian H_probe:
        groups      <- the d columns cut into groups of g (default 128, the paper's g)
        S(group)    <- Σ_{i in group} H_ii Σ_j W_ji²                  (salient score)
        candidates  <- the top ceil(s * n_groups) groups by S
        for each candidate group G:
            C       <- the round(p * |G|) columns of G with the largest H_ii Σ_j W_ji²  (at least 1)
            W_q(G)  <- GPTQ at l bits (the target ggml type's grid, gptq.py), except the columns C,
                       which get h-bit rounding on their own grid: a scale and a min per row over C (the
                       second {scale, zero-point} set, gptq.clear_grid), searched with the Hessian
                       importances; C weighs ~nothing in its ggml blocks' scale choice; every column's
                       error, C's included, is compensated by the later columns
            L(G)    <- ||(W - W_q(G)) X_probe^T||² = tr(ΔW H_probe ΔWᵀ)  (the probe: the last calibration sample)
        return the W_q(G) of least L(G)

    OOC(h, l, p, s): two workflows run side by side through the decoder layers (the calibration engine's
    LayerStream with flows=2): "gptq", plain GPTQ(l), and "ooc", GPTQ(h, l, p, s); each flow's layers see
    that flow's quantized outputs. The model with the lower loss on validation text (held-out windows of
    the calibration text) is the one written.

**Storage: the column side-car.** ggml's block types cannot hold h-bit columns inside an l-bit matrix, so
the clear columns live beside it: ``y = W_l·x + S·x[idx]`` (GGML_OP_COL_SIDECAR). W_l is the matrix's
ordinary ggml bytes in the target type, in which the clear columns count as zero (the block scales are
chosen with them set to 0, and their entries hold the grid value nearest 0 -- exactly 0 for Q4_0, Q5_0,
Q8_0); ``idx`` (I32, k) are the clear columns and ``S`` (F32, ggml shape [k, rows]: row r holds output r's k
values; F32 because GGML_OP_COL_SIDECAR multiplies F32) is the h-bit value minus what W_l holds there, so
W_l + S at those columns is the h-bit value (up to one float32 rounding of the difference; none where W_l
holds 0). S is stored as floats,
not as h-bit codes: the h-bit rounding decides the values, the file keeps them at side-car precision.

The tensors are ``<weight>.ooc_idx`` and ``<weight>.ooc_s`` next to the weight; the key
``ggml_ext.ooc.version`` marks the file. Stock llama.cpp refuses it (its loader finds more tensors than
the architecture asks for: "wrong number of tensors"); ggml-ext's patched llama.cpp loads the side-cars
with the weight and adds the col side-car to the weight's matmul.

h per matrix is :func:`clear_bits` (h, never below the matrix type's own bits: a type policy that keeps a
wider type for some matrices, as ``--type q2_k`` keeps Q4_0 on rows not a multiple of 256, gets h = l there).

Options (``methods.create("ooc", ...)``, CLI ``--ooc-h/--ooc-p/--ooc-s``): ``h`` (8), ``p`` (0.1), ``s``
(0.1), ``group`` (128), ``sidecar_type`` ("F32"), ``validation_samples`` (4: held-out windows for
the flow choice), ``flow`` ("both": the double workflow | "ooc": only GPTQ(h,l,p,s) -- for measurements),
``implementation`` ("batched": all candidate groups in one GPTQ sweep, :func:`gptq_hlps_batched` |
"reference": :func:`gptq_hlps`, one sweep per candidate; same bytes, same choice), and GPTQ's own
(percdamp, act_order, block_size, device, dtype).

**Batched candidates** (the paper's row-flow-selection parallelism). All candidate sweeps share the Hessian,
so they share everything GPTQ derives from it -- damping, act-order permutation, the Cholesky factor of
H^-1, the scale importances -- and differ only in which columns are clear. GPTQ treats the rows of W
independently, so B candidates are one sweep over B stacked copies of W (:func:`ggml_ext.methods.gptq.sweep`,
the sweep :func:`~ggml_ext.methods.gptq.gptq` runs with one copy): one sweep's thousands of small per-column
kernels and host round trips instead of one per candidate. A copy without clear columns is the plain GPTQ(l)
flow of the same matrix (``with_plain``); in the converter pipeline the two flows see different layer inputs
after the first layer, so there they are separate calls and only the candidates batch.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import MethodError, register
from .gptq import GPTQ, Clear, GPTQError, GPTQResult, _torch_threads, gptq, prepare, sweep
from .grids import GRIDS, grid as _grid

__all__ = ["OOC", "OOCResult", "SidecarError", "clear_bits", "salient_scores", "clear_columns", "probe_loss",
           "gptq_hlps", "gptq_candidates", "gptq_hlps_batched", "FORMAT_VERSION"]

log = logging.getLogger("ggml_ext.methods.ooc")

FORMAT_VERSION = 1
SIDECAR_TYPES = ("F32",)   # GGML_OP_COL_SIDECAR multiplies F32 values (an F16 side-car would need a cast node)


class SidecarError(MethodError):
    """A column side-car that does not fit its weight (index out of range, shape mismatch)."""


@dataclass
class OOCResult:
    base: GPTQResult          # the l-bit matrix (indices, scales, Q = what ggml dequantizes W_l to)
    group: int                # the clear group chosen
    idx: np.ndarray           # int32, k: the clear columns
    S: np.ndarray             # float32 rows x k: the side-car values (h-bit value - W_l's entry)
    loss: float               # probe loss of the chosen candidate
    candidates: list = field(default_factory=list)   # [(group, probe loss)] in scan order

    def effective(self) -> np.ndarray:
        """The matrix the side-car file computes with: W_l plus S at the clear columns."""
        return apply_sidecar(self.base.Q, self.idx, self.S)


def clear_bits(h: int, type_name: str) -> int:
    """The clear columns' bits in a matrix of ggml type ``type_name``: h, but never fewer than the type's own
    quant bits (bits.QUANT_BITS). A type policy gives some matrices a wider type than the file's (--type q2_k
    keeps Q4_0 where the rows are not a multiple of 256): 2-bit clear columns there would be coarser than
    the columns around them, so OOC(2, 2, p, s) clears them at 4 bits -- h = l for that matrix."""
    from ggml_ext.bits import QUANT_BITS
    return max(int(h), int(QUANT_BITS.get(type_name.upper(), 0)))


def salient_scores(W: np.ndarray, H: np.ndarray, group: int) -> np.ndarray:
    """Per group of ``group`` consecutive columns: Σ_{i in group} H_ii Σ_j W_ji² (the paper's S_Σ)."""
    col = np.diag(H).astype(np.float64) * (np.asarray(W, np.float64) ** 2).sum(axis=0)
    n = math.ceil(W.shape[1] / group)
    return np.array([col[g * group:(g + 1) * group].sum() for g in range(n)])


def clear_columns(W: np.ndarray, H: np.ndarray, g: int, group: int, p: float) -> np.ndarray:
    """The clear columns of group ``g``: its round(p * width) (at least one) most salient columns, sorted."""
    lo, hi = g * group, min((g + 1) * group, W.shape[1])
    col = np.diag(H)[lo:hi].astype(np.float64) * (np.asarray(W[:, lo:hi], np.float64) ** 2).sum(axis=0)
    k = max(1, int(round(p * (hi - lo))))
    top = np.argsort(-col, kind="stable")[:k]
    return np.sort(top + lo).astype(np.int32)


def probe_loss(W: np.ndarray, Wq: np.ndarray, H_probe: np.ndarray) -> float:
    """||(W - Wq) X_probeᵀ||² = tr(ΔW H_probe ΔWᵀ), the output error on the probe input."""
    D = np.asarray(W, np.float64) - np.asarray(Wq, np.float64)
    return float(np.einsum("ij,jk,ik->", D, H_probe, D, optimize=True))


def apply_sidecar(Q: np.ndarray, idx: np.ndarray, S: np.ndarray) -> np.ndarray:
    """Q (rows x cols) with S (rows x k) added at the columns ``idx``: the matrix y = Q·x + S·x[idx] applies."""
    out = np.array(Q, dtype=np.float32, copy=True)
    out[:, idx] += S
    return out


def check_sidecar(name: str, rows: int, cols: int, idx: np.ndarray, S: np.ndarray) -> None:
    """:class:`SidecarError` naming ``name`` unless idx (k ints) and S (rows x k) fit a rows x cols weight."""
    idx = np.asarray(idx)
    if idx.ndim != 1 or idx.size == 0:
        raise SidecarError(f"{name}: the side-car index must be a non-empty 1-D list of columns, got shape {idx.shape}")
    if idx.min() < 0 or idx.max() >= cols:
        raise SidecarError(f"{name}: side-car column index {int(idx.max() if idx.max() >= cols else idx.min())} "
                           f"out of range for a weight of {cols} columns")
    if len(np.unique(idx)) != idx.size:
        raise SidecarError(f"{name}: the side-car index lists a column twice")
    if S.shape != (rows, idx.size):
        raise SidecarError(f"{name}: side-car values of shape {tuple(S.shape)} (rows x k), the weight needs "
                           f"({rows}, {idx.size})")
    if not np.isfinite(S).all():
        raise SidecarError(f"{name}: the side-car values hold NaN or infinite values")


def _stored(S: np.ndarray, sidecar_type: str) -> np.ndarray:
    """S as the file stores it (F16 rounds), back in float32."""
    return S.astype(np.float16).astype(np.float32) if sidecar_type == "F16" else S.astype(np.float32)


def gptq_hlps(W: np.ndarray, H: np.ndarray, H_probe: np.ndarray, type_name: str, *, h: int = 8, p: float = 0.1,
              s: float = 0.1, group: int = 128, sidecar_type: str = "F32", name: str = "matrix",
              **gptq_options) -> OOCResult:
    """GPTQ(h, l, p, s) of one matrix (the module docstring's pseudocode); l = ``type_name``'s grid."""
    scores = salient_scores(W, H, group)
    n_scan = max(1, math.ceil(s * len(scores)))
    scan = np.argsort(-scores, kind="stable")[:n_scan]
    best: OOCResult | None = None
    tried = []
    for g in scan:
        cols = clear_columns(W, H, int(g), group, p)
        r = gptq(W, H, type_name, clear=Clear(cols, h), name=name, **gptq_options)
        S = _stored(r.clear_values - r.Q[:, cols], sidecar_type)
        cand = OOCResult(r, int(g), cols, S, 0.0)
        cand.loss = probe_loss(W, cand.effective(), H_probe)
        tried.append((int(g), cand.loss))
        if best is None or cand.loss < best.loss:
            best = cand
    best.candidates = tried
    return best


def gptq_candidates(W: np.ndarray, H: np.ndarray, type_name: str, clears: list[Clear | None], *,
                    percdamp: float = 0.01, act_order: bool = True, shrink: float = 0.0, block_size: int = 128,
                    scale_importance: str = "hessian", quantizer: dict | None = None, device: str = "cpu",
                    dtype: str = "float64", device_scales: bool | None = None, name: str = "matrix") -> list[GPTQResult]:
    """One GPTQ sweep (dynamic scales) for every entry of ``clears`` (a :class:`Clear` or None: no clear
    column) over B stacked copies of ``W`` (:func:`ggml_ext.methods.gptq.sweep`); the results, in order, are
    those of ``gptq(W, H, type_name, clear=clears[c], ...)``. ``device_scales``: Q4_0's block scales chosen on
    ``device`` by :func:`.scales_torch.q4_0_scales` (ggml's rule, bit for bit) instead of ggml's quantizer
    on the host (None: on any device but the CPU, where the host quantizer is faster: 2.9 s vs 3.8 s for
    three 576x576 candidates on one thread); the other types always use the host quantizer."""
    import torch
    if not clears:
        raise GPTQError(f"{name}: no candidate to quantize")
    g = _grid(type_name)
    p = prepare(W, H, percdamp=percdamp, act_order=act_order, shrink=shrink, name=name, device=device)
    if device_scales is None:
        device_scales = torch.device(device).type != "cpu"
    return sweep(p, g, clears, block_size=block_size, scale_importance=scale_importance, quantizer=quantizer,
                 device=device, dtype=dtype, device_scales=device_scales)


def probe_losses(W: np.ndarray, effective: list[np.ndarray], H_probe: np.ndarray, device: str = "cpu") -> list[float]:
    """tr(ΔW H_probe ΔWᵀ) of each candidate's effective matrix (float64 torch on ``device``; :func:`probe_loss`
    up to summation order)."""
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
    """GPTQ(h, l, p, s) of one matrix with all candidate groups in one sweep: the result of :func:`gptq_hlps`
    (same candidates, same bytes, same choice; the probe losses equal the reference's to rounding, so the
    chosen group is the same unless two candidates tie to ~1e-12). ``with_plain``: the plain GPTQ(l) result
    of the same matrix from the same sweep as well (the paper's flow parallelism), returned as
    ``(ooc_result, plain_result)``."""
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


@register("ooc", "K-OOC: GPTQ(l) and GPTQ(h,l,p,s) with one clear group per matrix as a column side-car, "
                 "the better on validation text kept (needs calibration; runs in ggml-ext's llama.cpp only)")
class OOC:
    """The ``ooc`` method. The pipeline streams two workflows (:attr:`workflows`) through the layers, calls
    :meth:`quantize` with ``calibration["flow"]``, asks :meth:`effective_weight` for the matrix each flow's
    next layer runs on, and :meth:`choose` with each flow's validation loss; the winner's side-cars are
    written as :meth:`companions` of their weights."""

    calibration_needs = ("hessian", "probe_hessian")

    def __init__(self, h: int = 8, p: float = 0.1, s: float = 0.1, group: int = 128, sidecar_type: str = "F32",
                 validation_samples: int = 4, flow: str = "both", percdamp: float = 0.01, act_order: bool = True,
                 block_size: int = 128, device: str = "cpu", dtype: str = "float64", implementation: str = "batched"):
        if not (2 <= int(h) <= 16):
            raise MethodError(f"ooc h={h}: the clear columns' bits must be 2..16")
        if not (0 < p <= 1):
            raise MethodError(f"ooc p={p}: the clear fraction of a group must be in (0, 1]")
        if not (0 < s <= 1):
            raise MethodError(f"ooc s={s}: the scanned fraction of groups must be in (0, 1]")
        if group < 1:
            raise MethodError(f"ooc group={group}: must be positive")
        if sidecar_type.upper() not in SIDECAR_TYPES:
            raise MethodError(f"ooc sidecar_type {sidecar_type!r}: only F32 (the col side-car op multiplies F32 values)")
        if validation_samples < 1:
            raise MethodError(f"ooc validation_samples={validation_samples}: need at least one")
        if flow not in ("both", "ooc", "gptq"):
            raise MethodError(f"ooc flow {flow!r}: choose 'both', 'ooc' or 'gptq'")
        if implementation not in ("batched", "reference"):
            raise MethodError(f"ooc implementation {implementation!r}: choose 'batched' or 'reference'")
        self.implementation = implementation
        self.h, self.p, self.s, self.group = int(h), float(p), float(s), int(group)
        self.sidecar_type = sidecar_type.upper()
        self.validation_samples = validation_samples
        self.workflows = {"both": ("gptq", "ooc"), "ooc": ("ooc",), "gptq": ("gptq",)}[flow]
        self.gptq_options = dict(percdamp=percdamp, act_order=act_order, block_size=block_size, device=device,
                                 dtype=dtype)
        self.plain = GPTQ(percdamp=percdamp, act_order=act_order, block_size=block_size, device=device, dtype=dtype,
                          scale_rule="dynamic", v_hessian="input")
        self.device = device
        self.sidecars: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {f: {} for f in self.workflows}
        self.results: dict[str, OOCResult] = {}     # the ooc flow's per matrix (for reports and tests)
        self.losses: dict[str, float] = {}
        self.winner: str | None = None
        self.rtn_fallback = self.plain.rtn_fallback

    types = GPTQ.types
    supports = staticmethod(GPTQ.supports)

    def quantize(self, tensor_name: str, type_name: str, rows: np.ndarray, out: np.ndarray, *,
                 imatrix: np.ndarray | None = None, threads: int | None = None,
                 calibration: Any | None = None) -> int:
        """The weight's l-bit bytes into ``out``; in the ooc flow the side-car is kept for :meth:`companions`."""
        flow = (calibration or {}).get("flow", self.workflows[0])
        if calibration is None or flow == "gptq" or not self.supports(type_name):
            return self.plain.quantize(tensor_name, type_name, rows, out, imatrix=imatrix, threads=threads,
                                       calibration=calibration)
        H, Hp = calibration["hessian"], calibration.get("probe_hessian")
        if Hp is None:
            raise MethodError(f"ooc needs the probe input of {tensor_name} (collector 'probe_hessian')")
        with _torch_threads(1) if self.device == "cpu" else contextlib.nullcontext():
            hlps = gptq_hlps if self.implementation == "reference" else gptq_hlps_batched
            r = hlps(rows, H, Hp, type_name, h=clear_bits(self.h, type_name), p=self.p, s=self.s, group=self.group,
                     sidecar_type=self.sidecar_type, name=tensor_name, **self.gptq_options)
        check_sidecar(tensor_name, rows.shape[0], rows.shape[1], r.idx, r.S)
        b = r.base.pack(_grid(type_name)).reshape(-1)
        if out.nbytes < b.nbytes:
            raise MethodError(f"{tensor_name}: OOC packed {b.nbytes} bytes, the buffer holds {out.nbytes}")
        out.reshape(-1)[:b.nbytes] = b
        self.sidecars[flow][tensor_name] = (r.idx, r.S)
        self.results[tensor_name] = r
        return b.nbytes

    def effective_weight(self, tensor_name: str, deq: np.ndarray, flow: str) -> np.ndarray:
        """What the model computes with for ``tensor_name`` in ``flow``: ggml's dequantization of the
        bytes plus the side-car's columns."""
        sc = self.sidecars.get(flow, {}).get(tensor_name)
        return deq if sc is None else apply_sidecar(deq, *sc)

    def choose(self, losses: dict[str, float]) -> str:
        """The flow whose model has the lower validation loss (ties: plain GPTQ, the stock-compatible file)."""
        self.losses = dict(losses)
        self.winner = min(self.workflows, key=lambda f: (losses[f], f != "gptq"))
        log.info("ooc: validation loss %s -> %s", ", ".join(f"{f} {v:.5f}" for f, v in losses.items()), self.winner)
        return self.winner

    def companions(self, tensor_name: str) -> list[tuple[str, str, np.ndarray, bool]]:
        """Tensors written after ``tensor_name``: [(name, ggml type, array, per_row)] -- the winner's side-car
        (``.ooc_idx`` I32 [k], ``.ooc_s`` [k, rows]); ``per_row``: the array's first axis is the weight's rows."""
        sc = self.sidecars.get(self.winner or "", {}).get(tensor_name)
        if sc is None:
            return []
        idx, S = sc
        dt = np.float16 if self.sidecar_type == "F16" else np.float32
        return [(f"{tensor_name}.ooc_idx", "I32", idx.astype(np.int32), False),
                (f"{tensor_name}.ooc_s", self.sidecar_type, np.ascontiguousarray(S.astype(dt)), True)]

    def metadata(self) -> list[tuple[str, str, Any]]:
        """The file's OOC keys; present only when the ooc flow won (the file then needs ggml-ext's llama.cpp)."""
        if self.winner != "ooc":
            return []
        return [("ggml_ext.ooc.version", "u32", FORMAT_VERSION), ("ggml_ext.ooc.h", "u32", self.h),
                ("ggml_ext.ooc.p", "f32", self.p), ("ggml_ext.ooc.s", "f32", self.s),
                ("ggml_ext.ooc.group", "u32", self.group), ("ggml_ext.requires", "str", "ggml-ext")]
