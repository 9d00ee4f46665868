"""GPTQ into ggml-ext's codebook types CB2 / CB3 (``methods/grids.py`` :class:`CBGrid`).

* The grid reads and writes the library's blocks: every value of a quantized row is found again by
  :meth:`CBGrid.round` under the header :meth:`CBGrid.decode` reads, and :meth:`CBGrid.pack` gives the
  library's bytes back bit for bit; the header is the library's quantizer's own.
* GPTQ into CB2 / CB3 on a real layer (layer 1's ffn_down of the default model): bytes that the library
  validates and dequantizes to exactly the values GPTQ computed with, and a Hessian-weighted output error
  below both round-to-nearest and the importance-weighted (imatrix) quantizer's.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_gptq import _default_layer1, _err  # noqa: E402
from test_gptq_kquants import regrid  # noqa: E402

from ggml_ext import quants  # noqa: E402
from ggml_ext.methods import gptq as G  # noqa: E402
from ggml_ext.methods.grids import GRIDS, CBGrid  # noqa: E402


@pytest.mark.parametrize("type_name", ["CB2", "CB3"])
def test_codebook_grid_reads_and_writes_the_library_blocks(type_name):
    g = GRIDS[type_name]
    assert isinstance(g, CBGrid) and quants.type_size(type_name) == g.nbytes and quants.blck_size(type_name) == 256
    rng = np.random.default_rng(7)
    W = (rng.standard_normal((12, 512)) * rng.uniform(0.01, 3, (12, 1))).astype(np.float32)
    W[2, 256:] = 0          # an all-zero block
    W[4, :16] = 5.0         # a constant sub-group
    for imatrix in (None, rng.uniform(0.1, 5, 512).astype(np.float32)):
        b = quants.quantize(W, type_name, imatrix=imatrix)
        deq = quants.dequantize(b, type_name, 512)
        s = g.decode(b.reshape(12, 2, g.nbytes))
        K, Q = regrid(g, s, deq)
        np.testing.assert_array_equal(Q, deq)
        packed = g.pack(K, s)
        np.testing.assert_array_equal(packed, b)
        np.testing.assert_array_equal(g.scales(W[:, 256:], None if imatrix is None else imatrix[256:]), s[:, 1])


@pytest.mark.parametrize("type_name", ["CB2", "CB3"])
def test_gptq_codebooks_is_exact_and_beats_rtn_and_imatrix_on_a_real_layer(type_name):
    W, H = _default_layer1()["model.layers.1.mlp.down_proj"]
    W, H = W[:96, :768], H[:768, :768]
    r = G.gptq(W, H, type_name)
    b = r.pack(GRIDS[type_name])
    assert quants.validate(type_name, b)
    np.testing.assert_array_equal(quants.dequantize(b, type_name, W.shape[1]), r.Q)
    rtn = quants.dequantize(quants.quantize(W, type_name), type_name, W.shape[1])
    imat = quants.dequantize(quants.quantize(W, type_name, imatrix=np.diag(H).astype(np.float32)), type_name,
                             W.shape[1])
    e, e_rtn, e_im = _err(W, r.Q, H), _err(W, rtn, H), _err(W, imat, H)
    assert e < 0.95 * e_rtn and e < 0.95 * e_im, (e, e_rtn, e_im)


def test_cli_convert_gptq_cb2_end_to_end(tmp_path):
    """``ggml-ext convert --method gptq --type cb2``: every matrix CB2, layer 0's bytes GPTQ of its Hessians
    (it sees the float model's inputs), and the file runs in our llama.cpp."""
    from test_gptq_kquants import _layer0_hessians, _untied_256
    from test_gptq import _tiny_text

    import convert_support as cs
    from ggml_ext import cli
    model = _untied_256()
    text = _tiny_text(tmp_path)
    out = tmp_path / "g-cb2.gguf"
    assert cli.main(["convert", str(model), "-o", str(out), "--type", "cb2", "--method", "gptq", "--calib", str(text),
                     "--calib-samples", "4", "--calib-seq-len", "32", "--gptq-scales", "dynamic", "--percdamp", "0.01",
                     "--gptq-v-hessian", "input"]) == 0
    got = cs.read_tensor_bytes(out)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        assert got[f"blk.0.{name}.weight"][0] == "CB2", name
    layer, prefix, stats = _layer0_hessians(model, text)
    for hf, gguf in (("mlp.down_proj", "ffn_down"), ("mlp.up_proj", "ffn_up")):
        w = layer.get_submodule(hf).weight.detach().numpy()
        assert got[f"blk.0.{gguf}.weight"][2] == G.gptq(w, stats[f"{prefix}.{hf}"]["hessian"], "CB2").pack(
            GRIDS["CB2"]).tobytes(), gguf
    ids = cs.hf_tokenize(model, "word12 and some more text, number 84.")
    assert np.isfinite(cs.gguf_logits(out, ids)).all()
