"""GPTQ (ggml_ext.methods.gptq) with ggml's block types as the rounding function, and the converter's
calibration step that runs it (convert --method gptq).

On real calibration Hessians of the default model (layer 1, wiki-train), for every supported type:
GPTQ's layer-output error ||(W - Q) X|| is below round-to-nearest's (the type's own quantizer) and
below round-to-nearest with the Hessian's diagonal as importance matrix (llama.cpp's imatrix path);
ggml's dequantize of the bytes GPTQ writes is exactly GPTQ's quantized matrix; the sequential numpy
reference and the batched torch implementation write the same bytes, with and without act-order and
with lazy blocks that straddle ggml blocks. Act-order's permutation is undone (a diagonal Hessian:
no compensation, so column order cannot matter); dead columns (H_ii = 0) are zeroed and do not
influence anything else. Through the converter: a tiny random Llama's GGUF holds, for the first
layer, exactly the bytes GPTQ gives for the layer's Hessian (q/k rows permuted as llama.cpp wants);
the next layer was calibrated on the quantized layer's output; clear errors for a missing
calibration text, types without a grid, and --calib with rtn. The default model converted with
gptq (8 x 256 calibration tokens; cached under the ggml-ext cache by the code's digest, a cold run
costs a few minutes) runs in our llama-perplexity with a finite perplexity below round-to-nearest's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import convert_support as cs  # noqa: E402
from ggml_ext import methods, quants, tools  # noqa: E402
from ggml_ext.converters import ConversionError, convert  # noqa: E402
from ggml_ext.converters.archs import permute_qk  # noqa: E402
from ggml_ext.methods import gptq as G  # noqa: E402
from ggml_ext.methods.grids import GRIDS  # noqa: E402

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL")


def _layer(model_dir: str, index: int) -> dict:
    """module name -> (weight float32, Hessian XᵀX float64) of decoder layer ``index`` (cs.real_layer)."""
    return {name: (w, st["hessian"]) for name, (w, st) in cs.real_layer(model_dir, index).items()}


def _default_layer1():
    return _layer(str(cs.default_hf()), 1)


def _err(W, Q, H) -> float:
    """||(W - Q) X||_F from H = XᵀX."""
    D = W.astype(np.float64) - Q.astype(np.float64)
    return float(np.sqrt(np.sum((D @ H) * D)))


@pytest.mark.parametrize("type_name", TYPES)
def test_gptq_beats_rtn_and_imatrix_rtn_on_real_layers(type_name):
    g = GRIDS[type_name]
    for short in ("self_attn.k_proj", "mlp.down_proj"):
        W, H = _default_layer1()[f"model.layers.1.{short}"]
        r = G.gptq(W, H, type_name)
        b = r.pack(g)
        assert quants.validate(type_name, b)
        deq = quants.dequantize(b, type_name, W.shape[1])
        np.testing.assert_array_equal(deq, r.Q)  # ggml computes with exactly GPTQ's matrix
        rtn = quants.dequantize(quants.quantize(W, type_name), type_name, W.shape[1])
        imat = quants.dequantize(quants.quantize(W, type_name, imatrix=np.diag(H).astype(np.float32)),
                                 type_name, W.shape[1])
        e_gptq, e_rtn, e_im = _err(W, r.Q, H), _err(W, rtn, H), _err(W, imat, H)
        if min(e_rtn, e_im) == 0:  # SmolLM2's weights sit on a Q4_1 grid (ASSETS.md): found exactly
            assert e_gptq == 0, (short, e_gptq)
        else:
            assert e_gptq < 0.95 * e_rtn and e_gptq < 0.95 * e_im, (short, e_gptq, e_rtn, e_im)


@pytest.mark.parametrize("type_name,act_order,block_size", [("Q4_0", True, 48), ("IQ4_NL", True, 128),
                                                             ("Q4_1", False, 40), ("Q8_0", True, 128)])
def test_reference_and_batched_write_the_same_bytes(type_name, act_order, block_size):
    """Same algorithm, different order of summing the column updates (float64): identical bytes.
    Lazy blocks of 48 or 40 columns straddle the 32-column ggml blocks, and with act-order a ggml
    block's scales are chosen while some of its columns still wait for a lazy update."""
    W, H = _default_layer1()["model.layers.1.self_attn.k_proj"]
    g = GRIDS[type_name]
    a = G.gptq(W, H, type_name, act_order=act_order, block_size=block_size)
    b = G.gptq_reference(W, H, type_name, act_order=act_order)
    np.testing.assert_array_equal(a.pack(g), b.pack(g))
    np.testing.assert_array_equal(a.Q, b.Q)


def test_act_order_permutation_is_undone():
    """With a diagonal Hessian no error moves between columns, so visiting them in any order must give
    the same bytes: act-order's permutation (here far from the identity) is undone on output."""
    rng = np.random.default_rng(1)
    W = rng.standard_normal((24, 128)).astype(np.float32)
    H = np.diag(rng.uniform(0.1, 10.0, 128))
    p = G.prepare(W, H)
    assert not (p.perm == np.arange(128)).all() and (p.pos[p.perm] == np.arange(128)).all()
    assert (np.diff(np.diag(H)[p.perm]) <= 0).all()
    for t in ("Q4_0", "IQ4_NL"):
        a, b = G.gptq(W, H, t, act_order=True), G.gptq(W, H, t, act_order=False)
        np.testing.assert_array_equal(a.pack(GRIDS[t]), b.pack(GRIDS[t]))
        # and the result is plain nearest rounding under ggml's scales for each block
        plain = quants.dequantize(quants.quantize(W, t, imatrix=(np.diag(H) + 0.01 * np.diag(H).mean())
                                                  .astype(np.float32)), t, 128)
        assert _err(W, a.Q, H) <= _err(W, plain, H) * (1 + 1e-6)


def test_dead_columns_are_zeroed_and_ignored():
    W, H = _default_layer1()["model.layers.1.self_attn.k_proj"]
    H = H.copy()
    dead = [3, 40, 41]
    H[dead, :] = 0
    H[:, dead] = 0
    W2 = W.copy()
    W2[:, dead] = 1000.0  # whatever a dead column holds, nothing else may change
    for t in ("Q4_0", "Q5_1"):
        a, b = G.gptq(W, H, t), G.gptq(W2, H, t)
        np.testing.assert_array_equal(a.pack(GRIDS[t]), b.pack(GRIDS[t]))
        assert np.isfinite(a.Q).all()
        if t == "Q4_0":
            assert (a.Q[:, dead] == 0).all()
        ref = G.gptq_reference(W2, H, t)
        np.testing.assert_array_equal(ref.pack(GRIDS[t]), b.pack(GRIDS[t]))


def test_bad_hessians_and_options_are_refused():
    W = np.ones((4, 64), np.float32)
    H = np.eye(64)
    H[2, 2] = np.nan
    with pytest.raises(G.GPTQError, match="layer.x: the Hessian holds NaN"):
        G.gptq(W, H, "Q4_0", name="layer.x")
    with pytest.raises(G.GPTQError, match="Hessian of shape"):
        G.gptq(W, np.eye(32), "Q4_0")
    with pytest.raises(G.GPTQError, match="not positive definite"):
        G.gptq(W, -np.eye(64), "Q4_0", percdamp=0.0)
    with pytest.raises(methods.MethodError, match="percdamp"):
        methods.create("gptq", percdamp=2.0)
    m = methods.create("gptq")
    out = np.empty(4 * quants.row_size("Q4_0", 64), np.uint8)
    with pytest.raises(methods.MethodError, match="needs the Hessian of blk.0.attn_q.weight"):
        m.quantize("blk.0.attn_q.weight", "Q4_0", W, out)
    # outside the layers (embeddings, output): the type's RTN
    assert m.quantize("token_embd.weight", "Q4_0", W, out) == out.nbytes
    assert out.tobytes() == quants.quantize(W, "Q4_0").tobytes()


#: GPTQ as the paper runs it (dynamic scales, percdamp 0.01, every matrix its input Hessian), which the functions
#: below default to; the method's own defaults are the best measured settings (test_method_defaults_are_the_best_measured)
PAPER = {"scale_rule": "dynamic", "percdamp": 0.01, "v_hessian": "input"}


def test_method_defaults_are_the_best_measured():
    """`convert --method gptq` with no options runs the settings docs/GPTQ.md "Defaults" measured best: static
    scales, percdamp 0.1, the attention-output Hessian for v_proj (so it collects attn_hessian)."""
    m = methods.create("gptq")
    assert m.options["scale_rule"] == "static" and m.options["percdamp"] == 0.1 and m.v_hessian == "attention"
    assert m.calibration_needs == ("hessian", "attn_hessian")
    o = methods.create("ooc")   # OOC's clear columns need dynamic scales; its plain flow is the paper's GPTQ
    assert o.plain.options["scale_rule"] == "dynamic" and o.plain.v_hessian == "input"


def _tiny_text(tmp_path: Path) -> Path:
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(f"word{i} and some more text, number {i * 7}." for i in range(3000)))
    return text


def test_convert_writes_gptq_bytes_and_feeds_quantized_outputs(tmp_path):
    model = cs.tiny("llama")
    text = _tiny_text(tmp_path)
    out = tmp_path / "g.gguf"
    r = convert(model, out, "q4_0", method="gptq", calib=text, calib_samples=4, calib_seq_len=32,
                calib_progress=False, method_options=PAPER)
    assert r.type_counts.get("Q4_0", 0) > 0
    got = cs.read_tensor_bytes(out)
    # layer 0 sees the float model's inputs: its bytes are GPTQ of its Hessian, q/k rows in llama.cpp's order
    from ggml_ext.calibrate.data import tokenize
    tok = tokenize(model, str(text), n_samples=4, seq_len=32)
    from ggml_ext.calibrate.collect import Collector
    from ggml_ext.calibrate.stream import LayerStream
    st, col = LayerStream(model), Collector(("hessian",))
    float_h1 = None
    for i, layer, prefix in st.run(tok.ids, hooks=col.attach, progress=False):
        stats = col.take(prefix)
        if i == 0:
            import json
            n_head = json.loads((Path(model) / "config.json").read_text())["num_attention_heads"]
            n_kv = json.loads((Path(model) / "config.json").read_text())["num_key_value_heads"]
            for hf, gguf, heads in (("self_attn.q_proj", "attn_q", n_head), ("self_attn.k_proj", "attn_k", n_kv),
                                    ("mlp.down_proj", "ffn_down", None)):
                w = layer.get_submodule(hf).weight.detach().numpy()
                b = G.gptq(w, stats[f"{prefix}.{hf}"]["hessian"], "Q4_0").pack(GRIDS["Q4_0"])
                if heads:
                    b = permute_qk(b, heads)
                assert got[f"blk.0.{gguf}.weight"][2] == b.tobytes(), gguf
        else:
            float_h1 = stats[f"{prefix}.self_attn.q_proj"]["hessian"]
            break
    # layer 1 was calibrated on quantized layer-0 outputs, so its bytes differ from GPTQ on float inputs
    w1 = cs.read_tensor_bytes(out)["blk.1.ffn_up.weight"][2]
    st2 = LayerStream(model)
    for i, layer, prefix in st2.run(tok.ids, hooks=col.attach, progress=False):
        stats = col.take(prefix)
        if i == 1:
            up = layer.get_submodule("mlp.up_proj").weight.detach().numpy()
            on_float = G.gptq(up, stats[f"{prefix}.mlp.up_proj"]["hessian"], "Q4_0").pack(GRIDS["Q4_0"])
            assert on_float.tobytes() != w1
            break
    assert float_h1 is not None
    # the file runs in our llama.cpp
    ids = cs.hf_tokenize(model, "word12 and some more text, number 84.")
    logits = cs.gguf_logits(out, ids)
    assert np.isfinite(logits).all()


def test_convert_errors_are_clear(tmp_path):
    model = cs.tiny("llama")
    out = tmp_path / "x.gguf"
    with pytest.raises(ConversionError, match="calibration text .*not found"):
        convert(model, out, "q4_0", method="gptq", calib=tmp_path / "missing.txt", calib_progress=False)
    with pytest.raises(ConversionError, match="gptq cannot round to Q4_0_4_4"):
        convert(model, out, "q4_0_4_4", method="gptq", calib=_tiny_text(tmp_path), calib_progress=False)
    with pytest.raises(ConversionError, match="gptq cannot round to F16"):
        convert(model, out, "f16", method="gptq", calib=_tiny_text(tmp_path), calib_progress=False)
    with pytest.raises(ConversionError, match="--calib is for methods that calibrate"):
        convert(model, out, "q4_0", method="rtn", calib=_tiny_text(tmp_path))
    assert not out.exists()


def _code_digest() -> str:
    """What the GPTQ conversion's bytes depend on: our code, the library, the assets."""
    return cs.code_digest("methods/gptq.py", "methods/grids.py", "methods/rtn.py", "converters/pipeline.py", "quants.py",
                          "calibrate/stream.py", "calibrate/collect.py", "calibrate/data.py", "converters/policy.py")


def test_default_model_gptq_runs_in_llama_perplexity(wiki_test, threads):
    path = cs.cached_default_conversion(
        "smollm2-q4_0-gptq-8x256", _code_digest(),
        lambda out: convert(cs.default_hf(), out, "q4_0", method="gptq", calib_samples=8, calib_seq_len=256,
                            calib_progress=False))
    p = tools.perplexity(path, wiki_test, n_ctx=256, chunks=4, threads=threads)
    rtn = tools.perplexity(cs.default_converted("q4_0"), wiki_test, n_ctx=256, chunks=4, threads=threads)
    assert np.isfinite(p.ppl) and 1 < p.ppl < rtn.ppl, (p.ppl, rtn.ppl)


def test_static_scales_are_the_imatrix_quantizers_and_both_implementations_agree():
    """scale_rule="static" (GPTQ's static groups): every block's scales are those llama.cpp's imatrix
    quantizer writes for the unmodified weights with diag(H) as imatrix (act-order's permutation undone),
    and the reference and the batched sweep write the same bytes with them."""
    W, H = _default_layer1()["model.layers.1.self_attn.k_proj"]
    for t in ("Q4_0", "Q4_1", "IQ4_NL"):
        g = GRIDS[t]
        a = G.gptq(W, H, t, scale_rule="static", block_size=48)
        b = G.gptq_reference(W, H, t, scale_rule="static")
        np.testing.assert_array_equal(a.pack(g), b.pack(g))
        im = quants.quantize(W, t, imatrix=np.diag(H).astype(np.float32)).reshape(W.shape[0], -1, g.nbytes)
        n = 2 if g.has_min else 1
        want = np.ascontiguousarray(im[:, :, :2 * n]).view(np.float16).astype(np.float32)
        np.testing.assert_array_equal(a.scales, want)
        e_im = _err(W, quants.dequantize(im.reshape(W.shape[0], -1), t, W.shape[1]), H)
        if e_im == 0:  # SmolLM2's weights sit on a Q4_1 grid (ASSETS.md): the imatrix's scales find it exactly
            assert _err(W, a.Q, H) == 0, t
        else:
            assert _err(W, a.Q, H) < 0.95 * e_im, t


def test_cli_gptq_scales_reaches_the_method():
    """`convert --gptq-scales static` becomes the method's scale_rule; rtn refuses the option by name."""
    from ggml_ext import cli
    from ggml_ext.convert import _method_options
    args = cli.build_parser().parse_args(["convert", "x", "-o", "y.gguf", "--method", "gptq", "--gptq-scales", "static"])
    opts = _method_options(args)
    assert opts["scale_rule"] == "static"
    assert methods.create("gptq", **opts).options["scale_rule"] == "static"
    args = cli.build_parser().parse_args(["convert", "x", "-o", "y.gguf", "--method", "gptq",
                                          "--gptq-v-hessian", "attention", "--gptq-shrink", "0.25"])
    m = methods.create("gptq", **_method_options(args))
    assert m.v_hessian == "attention" and m.options["shrink"] == 0.25
    assert m.calibration_needs == ("hessian", "attn_hessian")
    args = cli.build_parser().parse_args(["convert", "x", "-o", "y.gguf", "--method", "rtn", "--gptq-scales", "static"])
    with pytest.raises(methods.MethodError, match="scale_rule"):
        methods.create(args.method, **_method_options(args))


def test_shrink_interpolates_between_gptq_and_the_imatrix_quantizer():
    """shrink=0 is plain GPTQ; shrink=1 (the Hessian's diagonal only) propagates no error: with static
    scales it is the imatrix quantizer (IQ4_NL byte for byte; Q4_0 rounds each weight to the nearest
    value under the same scales, where ggml picks its indices under the unrounded scale)."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((16, 128)).astype(np.float32)
    X = rng.standard_normal((512, 128)) * np.exp(rng.standard_normal(128))
    H = X.T @ X
    np.testing.assert_array_equal(G.gptq(W, H, "Q4_0", shrink=0.0).Q, G.gptq(W, H, "Q4_0").Q)
    im = quants.quantize(W, "IQ4_NL", imatrix=np.diag(H).astype(np.float32))
    a = G.gptq(W, H, "IQ4_NL", scale_rule="static", shrink=1.0)
    np.testing.assert_array_equal(a.pack(GRIDS["IQ4_NL"]).reshape(-1), im.reshape(-1))
    q = G.gptq(W, H, "Q4_0", scale_rule="static", shrink=1.0)
    im = quants.dequantize(quants.quantize(W, "Q4_0", imatrix=np.diag(H).astype(np.float32)), "Q4_0", 128)
    assert np.mean(q.Q == im) > 0.95
    half = G.gptq(W, H, "Q4_0", scale_rule="static", shrink=0.5)
    assert _err(W, half.Q, H) < _err(W, q.Q, H)
    with pytest.raises(methods.MethodError, match="shrink"):
        methods.create("gptq", shrink=1.5)
    with pytest.raises(G.GPTQError, match="layer.y: shrink"):
        G.gptq(W, H, "Q4_0", shrink=-0.1, name="layer.y")


def test_v_hessian_attention_quantizes_v_proj_per_kv_head(tmp_path):
    """v_hessian="attention": the stream runs eager attention, the collector gives v_proj's per-kv-head
    attention-output Hessian (n_kv x d x d, symmetric, PSD), and layer 0's attn_v bytes are GPTQ of each
    kv head's rows with its own H_g; the file runs in our llama.cpp."""
    from ggml_ext.calibrate.collect import Collector
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.stream import LayerStream
    import json
    model = cs.tiny("llama")
    text = _tiny_text(tmp_path)
    out = tmp_path / "va.gguf"
    convert(model, out, "q4_0", method="gptq", calib=text, calib_samples=4, calib_seq_len=32, calib_progress=False,
            method_options={**PAPER, "v_hessian": "attention"})
    cfg = json.loads((Path(model) / "config.json").read_text())
    tok = tokenize(model, str(text), n_samples=4, seq_len=32)
    st, col = LayerStream(model, attention_weights=True), Collector(("hessian", "attn_hessian"))
    for i, layer, prefix in st.run(tok.ids, hooks=col.attach, progress=False):
        s = col.take(prefix)[f"{prefix}.self_attn.v_proj"]
        Hs = s["attn_hessian"]
        assert Hs.shape[0] == cfg["num_key_value_heads"] and Hs.shape[1:] == s["hessian"].shape
        for Hg in Hs:
            np.testing.assert_allclose(Hg, Hg.T, rtol=1e-12, atol=1e-12)
            assert np.linalg.eigvalsh(Hg).min() > -1e-9 * np.trace(Hg)
        w = layer.get_submodule("self_attn.v_proj").weight.detach().numpy()
        want = b"".join(G.gptq(R, Hg, "Q4_0").pack(GRIDS["Q4_0"]).tobytes()
                        for R, Hg in zip(np.split(w, len(Hs)), Hs))
        assert cs.read_tensor_bytes(out)["blk.0.attn_v.weight"][2] == want
        assert G.gptq(w, s["hessian"], "Q4_0").pack(GRIDS["Q4_0"]).tobytes() != want
        break
    with pytest.raises(methods.MethodError, match="v_hessian"):
        methods.create("gptq", v_hessian="output")
    logits = cs.gguf_logits(out, cs.hf_tokenize(model, "word12 and some more text, number 84."))
    assert np.isfinite(logits).all()


def test_k_hessian_attention_is_the_key_weighted_hessian_per_kv_head(tmp_path):
    """k_hessian="attention": the collector's key_hessian equals, per kv head g, Σ_t c_gt x_t x_tᵀ with
    c_gt = Σ_(h of g) Σ_q A_hqt² ||v_t - o_hq||² ||q_hq||², computed here directly from the layer's own
    q, v, attention weights and k_proj inputs (loops and broadcasting, not the collector's algebra); the
    converter quantizes each kv head's rows of k_proj with that head's H_g (then llama.cpp's RoPE row
    order), and the file runs in our llama.cpp."""
    import json
    from ggml_ext.calibrate.collect import Collector
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.stream import LayerStream
    from ggml_ext import cli
    from ggml_ext.convert import _method_options
    model = cs.tiny("llama")
    text = _tiny_text(tmp_path)
    out = tmp_path / "ka.gguf"
    convert(model, out, "q4_0", method="gptq", calib=text, calib_samples=4, calib_seq_len=32, calib_progress=False,
            method_options={**PAPER, "k_hessian": "attention"})
    cfg = json.loads((Path(model) / "config.json").read_text())
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tok = tokenize(model, str(text), n_samples=4, seq_len=32)
    col = Collector(("hessian", "key_hessian"))
    seen: dict = {"x": [], "q": [], "v": [], "A": []}   # per forward (the stream may run several batches)

    def hooks(index, layer, prefix):
        attn = layer.self_attn
        hs = [attn.k_proj.register_forward_pre_hook(lambda m, a: seen["x"].append(a[0].detach().double())),
              attn.q_proj.register_forward_hook(lambda m, a, o: seen["q"].append(o.detach().double())),
              attn.v_proj.register_forward_hook(lambda m, a, o: seen["v"].append(o.detach().double())),
              attn.register_forward_hook(lambda m, a, o: seen["A"].append(o[1].detach().double()))]
        remove = col.attach(index, layer, prefix)

        def both():
            remove()
            for h in hs:
                h.remove()
        return both

    for i, layer, prefix in LayerStream(model, attention_weights=True).run(tok.ids, hooks=hooks, progress=False):
        s = col.take(prefix)[f"{prefix}.self_attn.k_proj"]
        Hs = s["key_hessian"]
        X, q, v, A = (np.concatenate([t.numpy() for t in seen[k]]) for k in ("x", "q", "v", "A"))
        B, T = X.shape[:2]
        d = q.shape[-1] // n_head
        want = np.zeros_like(Hs)
        for b in range(B):
            for h in range(n_head):
                g = h // (n_head // n_kv)
                V = v[b, :, g * d:(g + 1) * d]                     # T x d
                o = A[b, h] @ V                                    # Q x d
                dist = ((V[None, :, :] - o[:, None, :]) ** 2).sum(-1)   # Q x T
                qn = (q[b, :, h * d:(h + 1) * d] ** 2).sum(-1)     # Q
                c = ((A[b, h] ** 2) * dist * qn[:, None]).sum(0)   # T
                want[g] += (X[b] * c[:, None]).T @ X[b]
        np.testing.assert_allclose(Hs, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())
        w = layer.get_submodule("self_attn.k_proj").weight.detach().numpy()
        b = np.concatenate([G.gptq(R, Hg, "Q4_0").pack(GRIDS["Q4_0"]) for R, Hg in zip(np.split(w, n_kv), Hs)])
        assert cs.read_tensor_bytes(out)["blk.0.attn_k.weight"][2] == permute_qk(b, n_kv).tobytes()
        assert G.gptq(w, s["hessian"], "Q4_0").pack(GRIDS["Q4_0"]).tobytes() != b.tobytes()
        break
    with pytest.raises(methods.MethodError, match="k_hessian"):
        methods.create("gptq", k_hessian="queries")
    args = cli.build_parser().parse_args(["convert", "x", "-o", "y.gguf", "--method", "gptq", "--gptq-k-hessian",
                                          "attention", "--gptq-v-hessian", "attention"])
    m = methods.create("gptq", **_method_options(args))
    assert m.k_hessian == "attention" and m.calibration_needs == ("hessian", "attn_hessian", "key_hessian")
    assert np.isfinite(cs.gguf_logits(out, cs.hf_tokenize(model, "word12 and some more text, number 84."))).all()
