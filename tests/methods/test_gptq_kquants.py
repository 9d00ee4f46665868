"""GPTQ with ggml's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) as the rounding function, and the
converter's "pure" K-quant files (--type q2_k .. q6_k).

* The K-quant grids read and write ggml's own super-block layouts: ggml's bytes for random weights
  are decoded (header: fp16 super-scales, quantized sub-block scales and mins), every weight is
  re-rounded to its sub-block's grid and packed again, giving ggml's bytes back bit for bit, and
  ggml's to_float of the packed bytes is exactly the values the grid computed.
* On a real layer of the default model (layer 1's ffn_down, 1536 columns: six super-blocks), GPTQ's
  bytes dequantize (ggml, our library) to exactly GPTQ's matrix, and its layer-output error under the
  layer's Hessian is below round-to-nearest's and, for Q2_K / Q3_K / Q6_K, below the imatrix
  quantizer's (Q4_K / Q5_K: SmolLM2's weights sit on a Q4_1 grid, ASSETS.md, which Q4_K's 32-weight
  sub-blocks with a minimum nearly recover; there only round-to-nearest is the bar).
* The numpy reference and the batched torch sweep write the same bytes (lazy blocks that straddle the
  256-column super-blocks, act-order, static and dynamic scales).
* ``ggml-ext convert --method gptq --type q3_k`` (and q2_k with the method's defaults, the best measured: static scales,
  percdamp 0.1, v_proj's attention-output Hessian) on a tiny Llama whose rows are 256 long: the layers'
  matrices are Q3_K / Q2_K, layer 0's bytes are GPTQ of its Hessian, the file runs in our llama.cpp.
* ``--type q3_k`` / ``q2_k`` with rtn writes what ``llama-quantize --pure`` writes with the same
  output / token-embedding types (the like-for-like baseline of bench/gptq/bench_gptq.py), also on the
  default model, whose 576-long rows fall back to Q4_0 as llama-quantize's do.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convert_support as cs  # noqa: E402
from test_gptq import _default_layer1, _err, _tiny_text  # noqa: E402

from ggml_ext import cli, quants, tools  # noqa: E402
from ggml_ext.converters import convert  # noqa: E402
from ggml_ext.converters.archs import permute_qk  # noqa: E402
from ggml_ext.methods import gptq as G  # noqa: E402
from ggml_ext.methods.grids import GRIDS, KGrid  # noqa: E402

K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def regrid(g, s, deq):
    """Every column of ``deq`` (ggml's values of n_blocks 256-blocks per row) rounded again by grid ``g`` under
    the headers ``s`` (n_rows x n_blocks x nparams) its bytes decode to: the indices and values found."""
    K = np.zeros(deq.shape, np.int64)
    Q = np.zeros(deq.shape, np.float32)
    for blk in range(deq.shape[1] // 256):
        st = g.state(torch.from_numpy(s[:, blk]), torch.float64)
        for at in range(256):
            c = blk * 256 + at
            k, q = g.round(torch.from_numpy(deq[:, c].astype(np.float64)), st, at)
            K[:, c], Q[:, c] = k.numpy(), q.numpy()
    return K, Q


@pytest.mark.parametrize("type_name", K_TYPES)
def test_kquant_grid_reads_and_writes_ggml_blocks(type_name):
    g = GRIDS[type_name]
    assert isinstance(g, KGrid) and quants.type_size(type_name) == g.nbytes and quants.blck_size(type_name) == 256
    rng = np.random.default_rng(5)
    W = (rng.standard_normal((16, 512)) * rng.uniform(0.01, 3, (16, 1))).astype(np.float32)
    W[3, 256:] = 0          # an all-zero super-block (zero scales)
    W[5, :16] = 7.0         # a sub-block far from the rest
    for imatrix in (None, rng.uniform(0.1, 5, 512).astype(np.float32)):
        b = quants.quantize(W, type_name, imatrix=imatrix)
        deq = quants.dequantize(b, type_name, 512)
        s = g.decode(b.reshape(16, 2, g.nbytes))
        assert s.shape == (16, 2, g.nparams)
        K, Q = regrid(g, s, deq)
        np.testing.assert_array_equal(Q, deq)            # each ggml value is a grid point, found again
        packed = g.pack(K, s)
        np.testing.assert_array_equal(packed, b)          # ggml's bytes, bit for bit
        np.testing.assert_array_equal(quants.dequantize(packed, type_name, 512), Q)
        # the block-wise scale choice is ggml's own quantizer on that super-block
        np.testing.assert_array_equal(g.scales(W[:, 256:], None if imatrix is None else imatrix[256:]), s[:, 1])


def _down_proj(rows: int, cols: int):
    """The first ``rows`` x ``cols`` of layer 1's ffn_down and the Hessian of those columns' output error
    (H's leading principal block): a real matrix with the cost of a small one (H^-1 of 1536 columns
    dominates a small sweep)."""
    W, H = _default_layer1()["model.layers.1.mlp.down_proj"]
    return W[:rows, :cols], H[:cols, :cols]


@pytest.mark.parametrize("type_name,cols,rule", [("Q2_K", 1536, "dynamic"), ("Q3_K", 1536, "static"),
                                                 ("Q4_K", 768, "dynamic"), ("Q6_K", 768, "static")])
def test_gptq_kquant_is_exact_and_beats_rtn_on_a_real_layer(type_name, cols, rule):
    W, H = _down_proj(128, cols)
    r = G.gptq(W, H, type_name, scale_rule=rule)
    b = r.pack(GRIDS[type_name])
    assert quants.validate(type_name, b)
    np.testing.assert_array_equal(quants.dequantize(b, type_name, W.shape[1]), r.Q)  # what ggml computes with
    rtn = quants.dequantize(quants.quantize(W, type_name), type_name, W.shape[1])
    imat = quants.dequantize(quants.quantize(W, type_name, imatrix=np.diag(H).astype(np.float32)),
                             type_name, W.shape[1])
    e, e_rtn, e_im = _err(W, r.Q, H), _err(W, rtn, H), _err(W, imat, H)
    assert e < 0.95 * e_rtn, (e, e_rtn)
    if type_name != "Q4_K":  # Q4_K: SmolLM2's Q4_1-grid weights (module docstring)
        assert e < 0.95 * e_im, (e, e_im)


@pytest.mark.parametrize("type_name,act_order,block_size,rule", [("Q3_K", True, 200, "dynamic"),
                                                                 ("Q2_K", True, 96, "static"),
                                                                 ("Q4_K", False, 176, "dynamic"),
                                                                 ("Q6_K", True, 128, "dynamic")])
def test_reference_and_batched_write_the_same_kquant_bytes(type_name, act_order, block_size, rule):
    W, H = _down_proj(32, 512)
    g = GRIDS[type_name]
    a = G.gptq(W, H, type_name, act_order=act_order, block_size=block_size, scale_rule=rule)
    b = G.gptq_reference(W, H, type_name, act_order=act_order, scale_rule=rule)
    np.testing.assert_array_equal(a.pack(g), b.pack(g))
    np.testing.assert_array_equal(a.Q, b.Q)
    if rule == "static":  # the scales llama-quantize --imatrix writes for the unmodified weights
        im = quants.quantize(W, type_name, imatrix=np.diag(H).astype(np.float32))
        np.testing.assert_array_equal(a.scales, g.decode(im.reshape(W.shape[0], -1, g.nbytes)))


def _untied_256():
    return cs.tiny("llama", tokenizer="llama-spm", hidden_size=256, intermediate_size=512, tie_word_embeddings=False)


def _layer0_hessians(model, text, **stream):
    from ggml_ext.calibrate.collect import Collector
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.stream import LayerStream
    tok = tokenize(model, str(text), n_samples=4, seq_len=32)
    needs = ("hessian", "attn_hessian") if stream else ("hessian",)
    st, col = LayerStream(model, **stream), Collector(needs)
    for i, layer, prefix in st.run(tok.ids, hooks=col.attach, progress=False):
        return layer, prefix, col.take(prefix)


def test_cli_convert_gptq_q3_k_and_q2_k_end_to_end(tmp_path):
    model = _untied_256()
    text = _tiny_text(tmp_path)
    cfg = json.loads((Path(model) / "config.json").read_text())
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    ids = cs.hf_tokenize(model, "word12 and some more text, number 84.")
    # q3_k with GPTQ's paper settings, q2_k with the method's defaults (static scales, percdamp 0.1, v_proj's
    # attention-output Hessian)
    runs = {"q3_k": ["--gptq-scales", "dynamic", "--percdamp", "0.01", "--gptq-v-hessian", "input"], "q2_k": []}
    for t, extra in runs.items():
        out = tmp_path / f"g-{t}.gguf"
        assert cli.main(["convert", str(model), "-o", str(out), "--type", t, "--method", "gptq", "--calib", str(text),
                         "--calib-samples", "4", "--calib-seq-len", "32", *extra]) == 0
        got = cs.read_tensor_bytes(out)
        T = t.upper()
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            assert got[f"blk.0.{name}.weight"][0] == T, name
        assert got["output.weight"][0] == "Q6_K"
        # layer 0 sees the float model's inputs: its bytes are GPTQ of its Hessians
        static = dict(scale_rule="static", percdamp=0.1) if not extra else {}
        layer, prefix, stats = _layer0_hessians(model, text, **({"attention_weights": True} if not extra else {}))
        for hf, gguf, heads in (("self_attn.k_proj", "attn_k", n_kv), ("mlp.down_proj", "ffn_down", None),
                                ("self_attn.v_proj", "attn_v", None)):
            w = layer.get_submodule(hf).weight.detach().numpy()
            s = stats[f"{prefix}.{hf}"]
            if hf.endswith("v_proj") and not extra:   # per kv head, its attention-output Hessian
                parts = [G.gptq(r, Hg, T, **static) for r, Hg in zip(np.split(w, n_kv), s["attn_hessian"])]
                b = np.concatenate([p.pack(GRIDS[T]) for p in parts])
            else:
                b = G.gptq(w, s["hessian"], T, **static).pack(GRIDS[T])
            if heads:
                b = permute_qk(b, heads)
            assert got[f"blk.0.{gguf}.weight"][2] == b.tobytes(), (t, gguf)
        assert np.isfinite(cs.gguf_logits(out, ids)).all()  # runs in our llama.cpp (stock types only)


def _llama_quantize_pure(src, dst, ftype, tok_type, out_type=None):
    args = ["--pure", "--token-embedding-type", tok_type] + (["--output-tensor-type", out_type] if out_type else [])
    r = subprocess.run(tools.command("llama-quantize", *args, src, dst, ftype, "2"), env=tools.tool_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.parametrize("model", ["untied-256", "default"])
def test_pure_k_files_are_llama_quantize_pure(model, tmp_path):
    """--type q3_k / q2_k (rtn) = llama-quantize --pure with the same token-embedding / output types:
    tensor for tensor (name, type, bytes); on the default model the 576-long rows fall back to Q4_0
    and the tied embeddings are Q8_0 in both."""
    folder = cs.default_hf() if model == "default" else _untied_256()
    f32 = cs.default_converted("f32") if model == "default" else tmp_path / "f32.gguf"
    if model != "default":
        convert(folder, f32, "f32")
    for t, ftype in (("q3_k", "Q3_K_S"), ("q2_k", "Q2_K")) if model != "default" else (("q3_k", "Q3_K_S"),):
        ours, ref = tmp_path / f"ours-{t}.gguf", tmp_path / f"ref-{t}.gguf"
        convert(folder, ours, t)
        a = cs.read_tensor_bytes(ours)
        if model == "default":
            _llama_quantize_pure(f32, ref, ftype, "q8_0")
            types = {v[0] for n, v in a.items() if n.startswith("blk.") and n.endswith("ffn_down.weight")}
            assert types == {"Q3_K"} and a["blk.0.attn_q.weight"][0] == "Q4_0" and a["token_embd.weight"][0] == "Q8_0"
        else:
            _llama_quantize_pure(f32, ref, ftype, t, "q6_k")
        b = cs.read_tensor_bytes(ref)
        assert a.keys() == b.keys()
        for name in a:
            assert a[name][:2] == b[name][:2], f"{t}: {name} is {a[name][:2]} here, {b[name][:2]} from llama-quantize"
            assert a[name][2] == b[name][2], f"{t}: bytes of {name} differ"
        ours.unlink()
        ref.unlink()
