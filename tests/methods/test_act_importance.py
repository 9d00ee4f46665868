"""The ``act-importance`` method (python/ggml_ext/methods/act_importance.py): a layer matrix is
quantized with E[x^2] of its calibration inputs (``act_stats``: sum_sq / rows) as the importance --
the same bytes as the type's quantizer given that vector as its imatrix, and different bytes from
equal importances; matrices without calibration use the conversion's imatrix (or none); a
calibration that saw no rows is refused by name."""
from __future__ import annotations

import numpy as np
import pytest

from ggml_ext import methods, quants
from ggml_ext.methods import MethodError


@pytest.mark.parametrize("type_name", ["CB2", "CB3", "IQ4_NL"])
def test_layer_matrix_uses_mean_squared_activations(type_name):
    rng = np.random.default_rng(3)
    rows = (0.02 * rng.standard_normal((8, 512))).astype(np.float32)
    sum_sq = (rng.gamma(0.5, size=512) * 100).astype(np.float64)  # very uneven channels
    cal = {"sum_sq": sum_sq, "rows": 40, "module": "model.layers.0.mlp.down_proj"}
    m = methods.create("act-importance")
    assert m.calibration_needs == ("act_stats",)
    out = np.empty(8 * quants.row_size(type_name, 512), np.uint8)
    assert m.quantize("blk.0.ffn_down.weight", type_name, rows, out, calibration=cal) == out.nbytes
    want = np.empty_like(out)
    quants.quantize_rows_into(type_name, rows, want, imatrix=(sum_sq / 40).astype(np.float32))
    flat = np.empty_like(out)
    quants.quantize_rows_into(type_name, rows, flat, imatrix=np.ones(512, np.float32))
    assert np.array_equal(out, want) and not np.array_equal(out, flat)
    # outside the layers: the conversion's imatrix as given
    assert m.quantize("output.weight", type_name, rows, out, imatrix=None) == out.nbytes


def test_no_rows_is_refused():
    m = methods.create("act-importance")
    rows = np.zeros((1, 256), np.float32)
    out = np.empty(quants.row_size("CB2", 256), np.uint8)
    with pytest.raises(MethodError, match="down_proj"):
        m.quantize("blk.0.ffn_down.weight", "CB2", rows, out,
                   calibration={"sum_sq": np.zeros(256), "rows": 0, "module": "model.layers.0.mlp.down_proj"})
