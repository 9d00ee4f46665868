"""QDEC (ggml_ext.qdec, docs/QDEC.md) on the default model: `calibrate dec` against a Q4_0 base made
by our llama-quantize, the side file read back, the residual it holds, the channel selection of torch and
of the C reference (ggml_ext_qdec_select) equal on real activations, the approximate top-k's recall, and
the compensation lowering perplexity (dynamic better than random channels). The op itself:
tests/kernels/test_ext_ops.py (tests/c/test_ext_ops.cpp's DEC cases)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import convert_support as cs  # noqa: E402
from ggml_ext import assets, tools  # noqa: E402
from ggml_ext.qdec import K_GRID, calibration, residual, select  # noqa: E402

SAMPLES, SEQ = 2, 128   # a small calibration of a few layers: the side file in well under a minute
LAYERS = {0, 1, 2, 3, 12, 25}


@pytest.fixture(scope="module")
def hf_dir():
    return assets.path("smollm2-hf")




@pytest.fixture(scope="module")
def base(default_gguf):
    return cs.dec_q4_0_base(default_gguf)


@pytest.fixture(scope="module")
def side(base, hf_dir):
    path = base.with_name(f"smollm2-q4_0.c{SAMPLES}x{SEQ}.l{'-'.join(map(str, sorted(LAYERS)))}.dec.gguf")
    try:
        d = calibration.load(path, base)   # made from this very base, this version's format
        assert sorted(int(n.split(".")[1]) for n in d.linears)[::7] == sorted(LAYERS)
    except (calibration.DecError, AssertionError):
        calibration.calibrate(base, hf_dir, None, SAMPLES, SEQ, progress=False, layers=LAYERS).save(path, force=True)
    return path


def test_residual_codes_and_layout():
    rng = np.random.default_rng(0)
    R = (rng.standard_normal((37, 50)) * rng.uniform(0.01, 1.0, (37, 1))).astype(np.float32)
    q, s = residual.quantize(R)
    assert q.dtype == np.int8 and q.min() >= -7 and q.max() <= 7 and s.shape == (37,)
    # the grid never loses to the plain absmax scale (alpha = 1 is on the grid)
    q1, s1 = residual.quantize(R, np.array([1.0]))
    err = ((residual.dequantize(q, s) - R) ** 2).sum(1)
    err1 = ((residual.dequantize(q1, s1) - R) ** 2).sum(1)
    assert (err <= err1 * (1 + 1e-6)).all() and err.sum() < 0.95 * err1.sum()
    p = residual.pack(q)
    assert p.shape == (50, 19) and p.dtype == np.uint8             # input-channel-major, odd M padded
    b = int(p[3, 5])
    assert (b & 15) - 8 == q[10, 3] and (b >> 4) - 8 == q[11, 3]
    assert (residual.unpack(p, 37) == q).all()


def test_side_file_holds_the_residual_and_bounds(side, base, hf_dir):
    from ggml_ext.converters.archs import permute_qk
    from ggml_ext.converters.source import open_checkpoint
    d = calibration.load(side, base)
    assert d.k_chunks == list(K_GRID) and len(d.linears) == len(LAYERS) * 7
    ck = open_checkpoint(hf_dir)
    links, *_ = calibration.linear_map(base, hf_dir, LAYERS)
    for module, hf_name, gname, t in links[:3] + links[-3:]:
        lin = d.linears[gname]
        W = ck.load(hf_name).astype(np.float32)
        if hf_name.endswith("q_proj.weight"):
            W = permute_qk(W, 9)
        elif hf_name.endswith("k_proj.weight"):
            W = permute_qk(W, 3)
        R = W - calibration.base_weight(base, t)
        rel = np.linalg.norm(lin.residual() - R) / np.linalg.norm(R)
        assert 0 < rel < 0.25, (gname, rel)                          # 4 bits of the residual
        b = lin.bounds
        assert b[0] >= b[1] and (np.diff(b[1:]) <= 0).all() and b[-1] > 0, (gname, b)
        assert lin.act.shape == (t.shape[0],) and (lin.act > 0).all()
    with pytest.raises(calibration.DecError, match="another base"):
        calibration.load(side, hf_dir / "config.json")


def test_bad_inputs_are_named(tmp_path, hf_dir, base, capsys):
    from ggml_ext.gguf import GGUFWriter
    bad = tmp_path / "bad.gguf"
    w = GGUFWriter(bad)
    a = np.zeros((3, 4), np.float32)
    w.add_tensor_info("blk.0.ffn_down.weight", (4, 3), 0, a.nbytes)
    with w:
        w.write_tensor(a)
    with pytest.raises(calibration.DecError, match="blk.0.ffn_down.weight has shape"):
        calibration.linear_map(bad, hf_dir)
    # the CLI says so and writes nothing
    import argparse
    p = argparse.ArgumentParser()
    calibration.add_arguments(p)
    out = tmp_path / "out.dec.gguf"
    assert calibration.main(p.parse_args([str(bad), "--hf", str(hf_dir), "-o", str(out)])) == 1
    assert "blk.0.ffn_down.weight has shape" in capsys.readouterr().err and not out.exists()
    nan = tmp_path / "nan.gguf"
    w = GGUFWriter(nan)
    a[1, 2] = np.nan
    w.add_tensor_info("blk.0.ffn_up.weight", (4, 3), 0, a.nbytes)
    with w:
        w.write_tensor(a)
    from ggml_ext.gguf import read_gguf
    with pytest.raises(calibration.DecError, match="blk.0.ffn_up.weight .* non-finite"):
        calibration.base_weight(nan, read_gguf(nan).tensors[0])
    with pytest.raises(calibration.DecError, match="no tensor blk.0.ffn_down.weight"):
        calibration.linear_map(nan, hf_dir)
    with pytest.raises(calibration.DecError, match="not a QDEC side file"):
        calibration.load(base)


@pytest.fixture(scope="module")
def activations(hf_dir):
    """Real inputs of a few linears of the default model on wiki-test (2 x 128 tokens)."""
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.stream import LayerStream
    want = {"model.layers.3.self_attn.q_proj", "model.layers.12.mlp.down_proj", "model.layers.25.self_attn.o_proj"}
    got = {}

    def hooks(i, layer, prefix):
        hs = []
        for path, m in layer.named_modules():
            if f"{prefix}.{path}" in want:
                hs.append(m.register_forward_pre_hook(
                    lambda mod, args, n=f"{prefix}.{path}": got.setdefault(n, []).append(
                        args[0].detach().reshape(-1, args[0].shape[-1]).clone())))
        return lambda: [h.remove() for h in hs]
    tokens = tokenize(hf_dir, assets.path("wiki-test"), 2, 128)
    for _ in LayerStream(hf_dir).run(tokens.ids, hooks=hooks, progress=False):
        pass
    return {n: torch.cat(v) for n, v in got.items()}


def test_torch_selection_is_the_c_reference(activations, side, base):
    from ggml_ext import quants
    lib = quants.library()
    f = lib.ggml_ext_qdec_select
    f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_float,
                  ctypes.c_void_p]
    f.restype = ctypes.c_int64
    d = calibration.load(side)
    names = {"model.layers.3.self_attn.q_proj": "blk.3.attn_q.weight",
             "model.layers.12.mlp.down_proj": "blk.12.ffn_down.weight"}
    for hf, g in names.items():
        x = activations[hf][:40].contiguous()
        lin = d.linears[g]
        for k in (8, 64):
            for exact in (False, True):
                m = select.mask(x, k, lin.b0(), lin.b15(d.k_chunks, k), exact=exact)
                for t in range(x.shape[0]):
                    row = np.ascontiguousarray(x[t].numpy())
                    sel = np.zeros(row.size, np.int32)
                    n = f(row.ctypes.data, row.size, k, int(exact), lin.b0(), lin.b15(d.k_chunks, k), sel.ctypes.data)
                    assert np.array_equal(sel[:n], np.flatnonzero(m[t].numpy())), (hf, k, exact, t)


def test_approximate_topk_recall(activations, side):
    """The paper reports ~80 % recall of its approximate top-k against the exact one."""
    d = calibration.load(side)
    names = {"model.layers.3.self_attn.q_proj": "blk.3.attn_q.weight",
             "model.layers.12.mlp.down_proj": "blk.12.ffn_down.weight",
             "model.layers.25.self_attn.o_proj": "blk.25.attn_output.weight"}
    recalls = []
    for hf, g in names.items():
        x, lin = activations[hf], d.linears[g]
        for k in (16, 32, 64):
            a = select.mask(x, k, lin.b0(), lin.b15(d.k_chunks, k))
            e = select.mask(x, k, exact=True)
            assert (a.sum(1) == e.sum(1)).all()
            recalls.append(select.recall(a, e))
    r = float(np.mean(recalls))
    print(f"approximate top-k recall, mean of {len(recalls)}: {r:.3f} (min {min(recalls):.3f})")
    assert 0.6 < r <= 1.0 and min(recalls) > 0.3
    # and far better than chance (k of the chunk's channels)
    assert r > 5 * 64 / 576


def test_compensation_lowers_perplexity(side, base, hf_dir):
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.qdec.simulate import DecModel
    tokens = tokenize(hf_dir, assets.path("wiki-test"), 2, 128).ids
    m = DecModel(base, side, hf_dir)
    ppl = {}
    for mode, k in (("none", 0), ("dynamic", 64), ("random", 64), ("full", 0)):
        m.configure(mode, k)
        ppl[mode] = m.perplexity(tokens)
    print(ppl)
    assert ppl["full"] < ppl["dynamic"] < ppl["none"]
    assert ppl["dynamic"] < ppl["random"]


def test_rebase_keeps_statistics_and_recomputes_residuals(side, base, hf_dir):
    # rebase onto the very base it was made from: the same side file, bit for bit
    d = calibration.load(side, base)
    r = calibration.rebase(d, base, hf_dir)
    assert r.meta == d.meta and sorted(r.linears) == sorted(d.linears)
    for name, a in d.linears.items():
        b = r.linears[name]
        assert (a.packed == b.packed).all() and (a.scales == b.scales).all()
        assert (a.bounds == b.bounds).all() and (a.act == b.act).all()
    # refused for another model's folder is covered by linear_map; a side file of another model is refused
    bad = calibration.DecSideFile({**d.meta, "model_sha256": "0" * 64}, d.linears)
    with pytest.raises(calibration.DecError, match="another model"):
        calibration.rebase(bad, base, hf_dir)


def test_perplexity_scores_the_second_half_like_llama_perplexity(side, base, hf_dir):
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.qdec.simulate import DecModel
    tokens = tokenize(hf_dir, assets.path("wiki-test"), 2, 64).ids
    m = DecModel(base, side, hf_dir)
    m.configure("none", 0)
    with torch.no_grad():
        nll = [torch.nn.functional.cross_entropy(m.model(input_ids=row[None]).logits[0, 32:-1], row[33:],
                                                 reduction="sum") for row in tokens]
    want = float(torch.exp(sum(nll) / (2 * 31)))
    assert m.perplexity(tokens, first=32) == pytest.approx(want, rel=1e-4)
    with pytest.raises(ValueError):
        m.perplexity(tokens, first=63)
