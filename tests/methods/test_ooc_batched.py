"""OOC's batched sweep (ggml_ext.methods.ooc.gptq_candidates, gptq.sweep over stacked copies) against the sequential reference, on the CPU.

All candidate groups of a matrix (and the plain GPTQ flow) in one GPTQ sweep over stacked copies of W
must give, per candidate, the bytes, block scales, clear values and side-car of that candidate's own
sweep (``gptq(..., clear=...)``), and the OOC method must choose the same group and write the same
bytes with ``implementation="batched"`` as with ``"reference"``: on layer 1 of the default model
(wiki-train Hessians, the last sample as probe; Q4_0) and on a synthetic matrix with a dead column, mixed
clear bit widths and no act-order (Q4_0 and the K-grid Q4_K). ~50 s of sweeps on the shared 2-core box (load
15), plus the real layer's calibration pass (cached per process, shared with test_ooc.py, which runs first). The same comparison runs on the GPU in bench/gptq/bench_ooc_speed.py --check.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import convert_support as cs  # noqa: E402
from ggml_ext import methods  # noqa: E402
from ggml_ext.methods import MethodError  # noqa: E402
from ggml_ext.methods import gptq as G  # noqa: E402
from ggml_ext.methods import ooc as O  # noqa: E402
from ggml_ext.methods.grids import GRIDS  # noqa: E402


def _layer(index: int = 1) -> dict:
    return {name.rsplit(".", 1)[-1]: (w, st["hessian"], st["probe_hessian"])
            for name, (w, st) in cs.real_layer(str(cs.default_hf()), index, ("hessian", "probe_hessian")).items()}


def _same(a: G.GPTQResult, b: G.GPTQResult, type_name: str) -> None:
    assert np.array_equal(a.pack(GRIDS[type_name]), b.pack(GRIDS[type_name]))
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.scales, b.scales)
    assert np.array_equal(a.Q, b.Q)
    assert (a.clear_values is None) == (b.clear_values is None)
    if a.clear_values is not None:
        assert np.array_equal(a.clear_values, b.clear_values)


def _synthetic(rows=64, cols=320, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.normal(0, 0.02, (rows, cols))
    X = rng.normal(size=(512, cols)) @ (np.eye(cols) + 0.1 * rng.normal(size=(cols, cols)) / cols ** 0.5)
    X[:, ::40] *= 20.0
    X[:, 7] = 0.0            # a dead column
    return W, X.T @ X, X[-32:].T @ X[-32:]


def test_one_sweep_gives_each_candidate_its_own_sweep_on_a_real_layer():
    type_name = "Q4_0"
    W, H, _ = _layer()["q_proj"]
    clears = [G.Clear(O.clear_columns(W, H, g, 128, 0.1), 8) for g in (3, 0)] + [None]
    with G._torch_threads(1):
        got = O.gptq_candidates(W, H, type_name, clears)
        for cl, r in zip(clears, got):
            _same(G.gptq(W, H, type_name, clear=cl), r, type_name)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K"])
def test_dead_columns_mixed_bits_and_no_act_order(type_name):
    W, H, _ = _synthetic(rows=32, cols=256)
    clears = [G.Clear(np.array([5, 7, 30]), 8), None, G.Clear(np.array([100, 101, 200, 255]), 3),
              G.Clear(np.array([7, 100]), 4)]   # overlapping candidates, the dead column 7 clear in two
    with G._torch_threads(1):
        for act_order in (True, False):
            got = O.gptq_candidates(W, H, type_name, clears, act_order=act_order, block_size=48)
            for cl, r in zip(clears, got):
                _same(G.gptq(W, H, type_name, clear=cl, act_order=act_order, block_size=48), r, type_name)


def test_batched_ooc_chooses_and_writes_what_the_reference_does():
    W, H, Hp = _layer()["down_proj"]     # 1536 columns: 12 groups, s=0.15 scans 2
    with G._torch_threads(1):
        ref = O.gptq_hlps(W, H, Hp, "Q4_0", h=8, p=0.1, s=0.15)
        bat, plain = O.gptq_hlps_batched(W, H, Hp, "Q4_0", h=8, p=0.1, s=0.15, with_plain=True)
        _same(G.gptq(W, H, "Q4_0"), plain, "Q4_0")
    assert bat.group == ref.group and len(ref.candidates) == 2
    assert [g for g, _ in bat.candidates] == [g for g, _ in ref.candidates]
    np.testing.assert_allclose([v for _, v in bat.candidates], [v for _, v in ref.candidates], rtol=1e-9)
    _same(ref.base, bat.base, "Q4_0")
    assert np.array_equal(ref.idx, bat.idx) and np.array_equal(ref.S, bat.S)


def test_the_method_writes_the_same_bytes_and_sidecar_either_way():
    W, H, Hp = _synthetic(rows=48, cols=256, seed=1)
    W = W.astype(np.float32)
    got = {}
    for impl in ("batched", "reference"):
        m = methods.create("ooc", s=1.0, group=64, implementation=impl)
        out = np.zeros(48 * 256, dtype=np.uint8)
        n = m.quantize("blk.0.attn_q.weight", "q4_0", W, out, calibration={"hessian": H, "probe_hessian": Hp,
                                                                            "flow": "ooc"})
        got[impl] = (out[:n].copy(), m.sidecars["ooc"]["blk.0.attn_q.weight"], m.results["blk.0.attn_q.weight"].group)
    (b1, (i1, s1), g1), (b2, (i2, s2), g2) = got["batched"], got["reference"]
    assert np.array_equal(b1, b2) and np.array_equal(i1, i2) and np.array_equal(s1, s2) and g1 == g2
    with pytest.raises(MethodError, match="implementation"):
        methods.create("ooc", implementation="parallel")


def test_q4_0_scales_on_the_device_are_ggml_s():
    """scales_torch.q4_0_scales against ggml's quantizer (Grid.scales) on random blocks with outliers,
    grid-aligned ties, all-zero and one-entry blocks, sign flips, and importances spanning six decades
    (some zero); without importances too."""
    from ggml_ext.methods.scales_torch import q4_0_scales
    g = GRIDS["Q4_0"]
    rng = np.random.default_rng(3)
    x = rng.normal(0, 0.02, (3000, 32)).astype(np.float32)
    x[::7, rng.integers(0, 32)] *= 30
    x[::11] = np.round(x[::11] * 400) / 400
    x[5] = 0
    x[6] = 0
    x[6, 3] = 1e-3
    x[8, :2] = [0.5, -0.5]
    x[1::2] = -x[1::2]
    for imp in (None, (rng.random(32) * 10 ** rng.uniform(-3, 3, 32)).astype(np.float32)):
        if imp is not None:
            imp[:3] = 0
        want = g.scales(x, imp)[:, 0]
        got = q4_0_scales(torch.from_numpy(x), None if imp is None else torch.from_numpy(imp)).numpy()
        assert np.array_equal(want, got), int((want != got).sum())


def test_host_and_device_scales_give_the_same_sweep():
    W, H, _ = _synthetic(rows=32, cols=256, seed=2)
    clears = [G.Clear(np.array([3, 64]), 8), None]
    with G._torch_threads(1):
        for imp in ("hessian", "none"):
            a = O.gptq_candidates(W, H, "Q4_0", clears, scale_importance=imp, device_scales=True)
            b = O.gptq_candidates(W, H, "Q4_0", clears, scale_importance=imp, device_scales=False)
            for cl, x, y in zip(clears, a, b):
                _same(x, y, "Q4_0")
                _same(G.gptq(W, H, "Q4_0", clear=cl, scale_importance=imp), x, "Q4_0")
