"""``anyprec``: Any-Precision LLM (Park et al., 2024): one bitplane file serving every precision S..P.

The paper's two stages, per output row of every decoder-layer matrix (its Section 4, on SqueezeLLM's
sensitivity-weighted non-uniform quantization):

1. **seed**: the S-bit model (default 3) by Fisher-weighted k-means of the row's values to 2^S
   centroids, the weight of w_j its Fisher diagonal F_j = Σ_s (∂loss_s/∂w_j)²;
2. **incremental upscaling**: for b = S .. P-1, every b-bit cluster is split in two by weighted
   2-means of its own values; the new bit is appended to each weight's code (0: the lower half), so the
   b-bit code of a weight is the top b bits of its P-bit code and the b-bit model is the prefix.

Both run in C (:func:`ggml_ext.anyprec.quantize`: exact 1-D optima on the sorted row). The file holds
the P-bit codes as P bitplanes and per row one fp16 centroid table per precision
(docs/formats/anyprec.md). Matrices outside the decoder layers (token embedding, output) and rows whose
length is not a multiple of 32 get the conversion's type (default Q8_0) from its own quantizer.

Options (``methods.create("anyprec", ...)``; ``ggml-ext convert --bits``):

* ``bits``: ``"S-P"`` (default ``"3-8"``), the seed and parent precisions;
* ``fisher``: True (default) weights the k-means by the Fisher diagonal (needs ``--calib``, computed by
  :mod:`ggml_ext.calibrate`, cached); False weighs every weight equally (no calibration);
* ``refine``: how many precisions above the seed are refined jointly with it (default
  :data:`ggml_ext.anyprec.REFINE`, 2; 0: the paper's greedy upscaling). Beyond the paper: the greedy 2-means
  split of the optimal seed is far from the optimum one bit up (docs/ANYPREC.md); coordinate descent on the
  sum of the weighted errors of precisions S..S+R moves the nested boundaries, keeping the one-file property;
* ``starts``: also start that refinement from the optimal partitions at S+1 .. S+starts bits and keep the
  best (default :data:`ggml_ext.anyprec.STARTS`); ``gain``: precision S+i weighs gain**i in the joint
  objective (default :data:`ggml_ext.anyprec.GAIN`).

With the parent precision of the ``APQ`` type (8, the default) the planes are written as an ``APQ``
tensor of the matrix's own shape, which our llama.cpp runs at any precision S..8 (``--apq-bits B``,
``GGML_EXT_APQ_BITS``: the ``APQ_MUL_MAT`` op, docs/formats/anyprec.md); with another parent as I8
``(n_per_row / 8, n_rows, P)`` (the same bytes), which only ``ggml-ext anyprec extract`` reads.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import anyprec as ap
from ..anyprec import planes_type
from . import MethodError, register

__all__ = ["AnyPrec", "FORMAT_VERSION", "PLANES_SUFFIX", "TABLES_SUFFIX", "FISHER_FLOOR"]

#: the planes keep the matrix's name; the tables are "<name>.apq_tables" (docs/formats/anyprec.md)
PLANES_SUFFIX = ""
TABLES_SUFFIX = ".apq_tables"
#: every weight's sensitivity is at least this fraction of its row's mean Fisher: weights the calibration
#: never moved (zero gradient) still pull their cluster a little, so no centroid is decided by nothing
FISHER_FLOOR = 1e-6
#: ``ggml_ext.anyprec.version`` of the files written here
FORMAT_VERSION = 1


def seed_and_upscale(W: np.ndarray, F: np.ndarray | None, seed: int, parent: int, threads: int | None,
                     name: str, refine: int = ap.REFINE, starts: int = ap.STARTS,
                     gain: float = ap.GAIN) -> tuple[np.ndarray, np.ndarray]:
    """The paper's pipeline on one matrix: the seed model at ``seed`` bits, upscaled to ``parent``
    (both in :func:`ggml_ext.anyprec.quantize`). Returns the parent codes and every precision's tables."""
    if F is not None:
        F = np.asarray(F, dtype=np.float64)
        F = F + FISHER_FLOOR * F.mean(axis=1, keepdims=True) + np.finfo(np.float32).tiny
        F = (F / F.mean(axis=1, keepdims=True)).astype(np.float32)  # per-row scale is irrelevant to k-means
    return ap.quantize(W, F, seed, parent, threads=threads, name=name, refine=refine, starts=starts, gain=gain)


@register("anyprec", "Any-Precision LLM: Fisher-weighted k-means seed + incremental upscaling, one bitplane "
                     "file for every precision of --bits (needs --calib)")
class AnyPrec:
    default_type = "q8_0"  # the type of the matrices outside the decoder layers

    def __init__(self, bits: str | tuple[int, int] = "3-8", fisher: bool = True, refine: int = ap.REFINE,
                 starts: int = ap.STARTS, gain: float = ap.GAIN):
        try:
            self.seed, self.parent = ap.parse_bits(bits)
        except ap.AnyPrecError as e:
            raise MethodError(str(e)) from None
        self.fisher = bool(fisher)
        if int(refine) != refine or int(refine) < 0:
            raise MethodError(f"anyprec: refine must be a non-negative integer, got {refine!r}")
        self.refine = int(refine)
        if int(starts) != starts or int(starts) < 0:
            raise MethodError(f"anyprec: starts must be a non-negative integer, got {starts!r}")
        self.starts = int(starts)
        try:
            self.gain = float(gain)
        except (TypeError, ValueError):
            raise MethodError(f"anyprec: gain must be a positive number, got {gain!r}") from None
        if not (np.isfinite(self.gain) and self.gain > 0):
            raise MethodError(f"anyprec: gain must be a positive number, got {gain!r}")
        self.calibration_needs = ("fisher",) if self.fisher else ()

    def metadata(self) -> list[tuple[str, str, Any]]:
        """The file's any-precision keys (docs/formats/anyprec.md)."""
        return [("ggml_ext.anyprec.version", "u32", FORMAT_VERSION), ("ggml_ext.anyprec.seed_bits", "u32", self.seed),
                ("ggml_ext.anyprec.parent_bits", "u32", self.parent),
                ("ggml_ext.anyprec.fisher", "bool", self.fisher)]

    def _mine(self, gguf_name: str, ggml_shape: tuple[int, ...]) -> bool:
        return gguf_name.startswith("blk.") and len(ggml_shape) == 2 and ggml_shape[0] % ap.QK == 0

    def tensors(self, gguf_name: str, type_name: str, ggml_shape: tuple[int, ...]):
        """The matrix's bitplanes (APQ of the matrix's shape for P = 8, else I8 of ggml shape
        (n_per_row / 8, n_rows, P): the same bytes) and fp16 tables (F16, 1-D), or None for a matrix
        written in the conversion's type."""
        if not self._mine(gguf_name, ggml_shape):
            return None
        k, n = ggml_shape
        ptype = planes_type(self.parent)
        shape = (k, n) if ptype else (k // 8, n, self.parent)
        planes = (gguf_name + PLANES_SUFFIX, shape, ptype or "I8", ap.planes_bytes(n, k, self.parent))
        n_tab = n * ap.row_table_len(self.seed, self.parent)
        return [planes, (gguf_name + TABLES_SUFFIX, (n_tab,), "F16", 2 * n_tab)]

    def quantize(self, tensor_name: str, type_name: str, rows: np.ndarray, out: np.ndarray, *,
                 imatrix: np.ndarray | None = None, threads: int | None = None,
                 calibration: Any | None = None) -> int:
        from ggml_ext import quants
        if not self._mine(tensor_name, rows.shape[::-1]):
            return quants.quantize_rows_into(type_name, rows, out, imatrix=imatrix, threads=threads)
        F = None
        if self.fisher:
            if calibration is None or calibration.get("fisher") is None:
                raise MethodError(f"anyprec needs the Fisher information of {tensor_name}: convert with a "
                                  "calibration text (--calib) or with fisher=False")
            F = calibration["fisher"]
            if F.shape != rows.shape:
                raise MethodError(f"{tensor_name}: Fisher of shape {F.shape} for weights of shape {rows.shape}")
        try:
            codes, tables = seed_and_upscale(rows, F, self.seed, self.parent, threads, tensor_name, self.refine,
                                             self.starts, self.gain)
            planes = ap.pack(codes, self.parent, name=tensor_name)
        except ap.AnyPrecError as e:
            raise MethodError(str(e)) from None
        t16 = ap.pack_tables(tables, self.seed, self.parent)
        need = planes.nbytes + t16.nbytes
        if out.nbytes < need:
            raise MethodError(f"{tensor_name}: {out.nbytes} bytes of output for {need}")
        out[:planes.nbytes] = planes.reshape(-1)
        out[planes.nbytes:need] = t16.view(np.uint8)
        return need
