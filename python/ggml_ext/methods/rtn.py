"""``rtn``: each type's own quantizer, row by row (round to nearest, with the type's scale search).

The bytes are those of :func:`ggml_ext.quants.quantize_rows_into`: ggml's
``ggml_quantize_chunk`` for the stock types and the interleaved Q4_0 types, ggml-ext's
exact importance-weighted scale search for IQ4_NL and its interleaved forms -- what
``llama-quantize`` of our build writes for the same float32 rows and imatrix.

Options (keywords of ``methods.create("rtn", ...)``; the converter passes its
``iq4_nl_weighting``):

* ``iq4_nl_weighting``: what each weight's IQ4_NL error is multiplied by besides the
  imatrix, a key of :data:`ggml_ext.quants.IQ4_NL_WEIGHTINGS` (default ``"default"``);
* ``quantizer``: ``None`` (ggml-ext's for the IQ4_NL types, ggml's otherwise), ``"ggml"``
  or ``"ggml-ext"`` (IQ4_NL types only), as in :func:`~ggml_ext.quants.quantize_rows_into`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import MethodError, register

__all__ = ["RTN"]


@register("rtn", "the type's own quantizer per row (ggml's; ggml-ext's exact scale search for IQ4_NL)")
class RTN:
    def __init__(self, iq4_nl_weighting: str = "default", quantizer: str | None = None):
        from ggml_ext import quants  # needs our compiled libggml-base
        if iq4_nl_weighting not in quants.IQ4_NL_WEIGHTINGS:
            raise MethodError(f"unknown IQ4_NL weighting {iq4_nl_weighting!r}; choose from "
                              f"{', '.join(quants.IQ4_NL_WEIGHTINGS)}")
        if quantizer not in (None, "ggml", "ggml-ext"):
            raise MethodError(f"unknown quantizer {quantizer!r}; choose 'ggml' or 'ggml-ext'")
        self.weighting = iq4_nl_weighting
        self.quantizer = quantizer

    def quantize(self, tensor_name: str, type_name: str, rows: np.ndarray, out: np.ndarray, *,
                 imatrix: np.ndarray | None = None, threads: int | None = None,
                 calibration: Any | None = None) -> int:
        from ggml_ext import quants
        return quants.quantize_rows_into(type_name, rows, out, imatrix=imatrix, threads=threads,
                                         quantizer=self.quantizer, weighting=self.weighting)
