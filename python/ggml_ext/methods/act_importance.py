"""``act-importance``: each type's own quantizer, weighted by the calibration activations.

The codebook types' quantizer (``ggml_ext_codebooks_quantize``, docs/formats/codebooks.md) chooses per
sub-group the codebook and scale that minimise the importance-weighted squared error
``sum_j imp_j (x_j - w_j)^2``, the paper's objective; the importance of input column j is the mean
squared activation ``E[x_j^2]`` at the matrix's input, which is what llama.cpp's imatrix holds too.
This method computes it on the fly instead of reading an imatrix file: the converter streams the
decoder layers over the calibration text (:class:`ggml_ext.calibrate.stream.LayerStream`, collector
``act_stats``), and each layer matrix is quantized with ``sum_sq / rows`` of its own inputs -- the
inputs of the already-quantized earlier layers, so later layers see the error of earlier ones.
Matrices outside the layers (embeddings, output) get the type's quantizer without importance, as
llama-quantize does for tensors an imatrix has no entry for.

Any ggml type works (the fallback IQ4_NL / Q4_K / Q6_K tensors of a codebook recipe get the same
importance through ``ggml_quantize_chunk``'s imatrix argument); ``ggml-ext convert --type cb2``
uses this method when no ``--method`` and no ``--imatrix`` are given.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import MethodError, register

__all__ = ["ActImportance"]


@register("act-importance", "the type's own quantizer weighted by E[x^2] of the calibration activations "
                            "(--calib; the default for the codebook types)")
class ActImportance:
    #: what the converter pipeline collects per layer (ggml_ext.calibrate.collect)
    calibration_needs = ("act_stats",)

    def __init__(self, iq4_nl_weighting: str = "default"):
        from .rtn import RTN
        self.rtn = RTN(iq4_nl_weighting=iq4_nl_weighting)

    @staticmethod
    def importance(calibration: dict) -> np.ndarray:
        """Mean squared activation per input column (float32), from an ``act_stats`` result."""
        rows = float(calibration.get("rows", 0))
        if rows <= 0:
            raise MethodError(f"no calibration rows reached {calibration.get('module', 'this matrix')}")
        return np.ascontiguousarray(np.asarray(calibration["sum_sq"], dtype=np.float64) / rows, dtype=np.float32)

    def quantize(self, tensor_name: str, type_name: str, rows: np.ndarray, out: np.ndarray, *,
                 imatrix: np.ndarray | None = None, threads: int | None = None,
                 calibration: Any | None = None) -> int:
        if calibration is not None:
            imp = self.importance(calibration)
            if imp.shape != (rows.shape[1],):
                raise MethodError(f"{tensor_name}: {imp.shape[0]} importances for rows of {rows.shape[1]} weights")
            imatrix = imp
        return self.rtn.quantize(tensor_name, type_name, rows, out, imatrix=imatrix, threads=threads)
