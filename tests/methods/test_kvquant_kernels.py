"""KVQuant's C kernels (ggml_ext.kvquant.kernels) against the torch simulation and numpy, on the
default model's real keys and values (layer 5 of SmolLM2 on wiki-test, 3 KV heads x 64, 9 query heads):

* the C append-and-quantize with the calibration's nuq2/3/4 tables and thresholds dequantizes to the
  simulation's values (simulate.quantize_keys / quantize_values, same tables, same outliers) within fp16
  rounding -- keys exactly but for the fp16 outliers, values up to their fp16 scale;
* q . K with RoPE on the fly equals q . RoPE(dequantized K) computed in numpy with llama.cpp's angles,
  for the scalar reference (forced) and for the implementation this CPU dispatches to; the same keys in
  llama.cpp's GGUF channel order with normal RoPE give the same scores;
* attention . V equals weights @ dequantized V; every KV head in one call equals the per-head calls; bad
  input is refused naming the layer.

The calibration (1 x 64 tokens of wiki-train, nuq2/3/4) is cached under ~/.cache/ggml-ext/tests/.
"""
from __future__ import annotations


import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import convert_support as cs  # noqa: E402
from ggml_ext.kvquant import KVCalibration, scheme  # noqa: E402
from ggml_ext.kvquant.kernels import (KVCacheLayer, KVKernelError, Rope, default_slots,  # noqa: E402
                                              force, rope_of)
from ggml_ext.kvquant.simulate import quantize_keys, quantize_values  # noqa: E402

LAYER = 5
T = 96


@pytest.fixture(scope="module")
def real():
    """(calibration, HF config, K pre-RoPE (T, D), V (T, D), Q pre-RoPE (T, n_head * hd)) of layer LAYER."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ggml_ext import assets
    hf = cs.default_hf()
    cal = KVCalibration.load(cs.default_kv_calibration(), hf)
    tok = AutoTokenizer.from_pretrained(hf)
    text = assets.path("wiki-test").read_text(encoding="utf-8")[40000:50000]
    ids = torch.tensor([tok(text, add_special_tokens=False).input_ids[:T]])
    m = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    got = {}
    attn = m.model.layers[LAYER].self_attn
    hooks = [getattr(attn, p).register_forward_hook(lambda mod, a, out, p=p: got.__setitem__(p, out[0].detach().numpy()))
             for p in ("q_proj", "k_proj", "v_proj")]
    with torch.no_grad():
        m(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    return cal, m.config, got["k_proj"].copy(), got["v_proj"].copy(), got["q_proj"].copy()


def _fp16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("outliers", [True, False])
def test_dequantized_equals_simulation(real, bits, outliers):
    cal, config, K, V, _ = real
    D = K.shape[1]
    name = f"nuq{bits}-1%" if outliers else f"nuq{bits}"
    s = scheme(name)
    sim_k = quantize_keys(s, cal, LAYER, torch.from_numpy(K)[None])[0].numpy()
    sim_v = quantize_values(s, cal, LAYER, torch.from_numpy(V)[None])[0].numpy()
    vk = max(1, round(D * 0.01 / 2)) if outliers else 0
    layer = KVCacheLayer.from_calibration(cal, LAYER, bits, outliers, rope_of(config), slots=(D if outliers else 0, 2 * vk, vk))
    ck = layer.dequantize_k(layer.quantize_k(K))
    assert layer.last_dropped == 0 or not outliers  # without outliers every key is clamped into the dense part
    L = cal.layers[LAYER]
    lo, hi = (L["k_lo"], L["k_hi"]) if outliers else (L["k_lo0"], L["k_hi0"])
    out = ((K > hi) | (K < lo)) if outliers else np.zeros_like(K, dtype=bool)
    assert out.mean() > 0.001 if outliers else True
    np.testing.assert_array_equal(ck[out], _fp16(K[out]))                      # outliers: their fp16 values
    np.testing.assert_allclose(ck[~out], sim_k[~out], rtol=1e-6, atol=1e-6)   # the rest: the same levels
    cv = layer.dequantize_v(layer.quantize_v(V))
    # values: the same indices; mid and half range stored in fp16 (a relative 2^-11 each)
    _, dq = cal.levels(LAYER, "v", bits, outliers)
    lo_v = np.sort(V, 1)[:, vk:vk + 1]
    hi_v = np.sort(V, 1)[:, D - 1 - vk:D - vk]
    tol = (np.abs(hi_v + lo_v) / 2 + np.abs(dq).max() * (hi_v - lo_v) / 2) * 2 ** -10 + 1e-6
    vout = (V > hi_v) | (V < lo_v)
    assert (np.abs(cv - sim_v) <= np.where(vout, np.abs(V) * 2 ** -11 + 1e-7, tol)).all()
    assert vout.sum(1).max() <= 2 * vk


def _angles(rope: Rope, hd: int, pos: np.ndarray) -> np.ndarray:
    """llama.cpp's rope angles (ggml_rope_cache_init, float32): theta = pos * theta_scale^j by repeated
    multiplication, / freq factor, * freq_scale; pairs beyond n_dims: 0. Shape (tokens, hd / 2)."""
    nd = rope.n_dims or hd
    ts = np.float32(rope.freq_base) ** np.float32(-2.0 / nd)
    theta = pos.astype(np.float32)
    out = np.zeros((len(pos), hd // 2), dtype=np.float32)
    for j in range(nd // 2):
        out[:, j] = np.float32(rope.freq_scale) * theta
        theta = (theta * ts).astype(np.float32)
    return out


def _rope(k: np.ndarray, ang: np.ndarray, mode: str) -> np.ndarray:
    """RoPE of keys (tokens, hd): NEOX pairs (j, j + hd/2), normal pairs (2j, 2j + 1)."""
    hd = k.shape[1]
    a_idx = np.arange(hd // 2) if mode == "neox" else 2 * np.arange(hd // 2)
    b_idx = a_idx + hd // 2 if mode == "neox" else a_idx + 1
    c, s = np.cos(ang.astype(np.float64)), np.sin(ang.astype(np.float64))
    a, b = k[:, a_idx].astype(np.float64), k[:, b_idx].astype(np.float64)
    out = np.empty(k.shape, dtype=np.float64)
    out[:, a_idx], out[:, b_idx] = a * c - b * s, a * s + b * c
    return out


def _gguf_order(x: np.ndarray, hd: int) -> np.ndarray:
    """llama.cpp's converter permutation of a llama K/Q projection's channels (per head: HF channel j ->
    2j, j + hd/2 -> 2j + 1), which turns HF's rotate_half into llama.cpp's normal RoPE."""
    sh = x.shape
    return x.reshape(*sh[:-1], -1, 2, hd // 2).swapaxes(-1, -2).reshape(sh)


@pytest.mark.parametrize("bits", [4, 3, 2])
def test_scores_equal_rope_of_dequantized_keys(real, bits):
    cal, config, K, _, Q = real
    hd, n_kv = int(cal.meta["head_dim"]), int(cal.meta["n_kv_heads"])
    group = Q.shape[1] // hd // n_kv
    rope = rope_of(config)
    layer = KVCacheLayer.from_calibration(cal, LAYER, bits, True, rope)
    rows = layer.quantize_k(K)
    deq = layer.dequantize_k(rows)
    kl, kv = cal.levels(LAYER, "k", bits, True)
    vl, vv = cal.levels(LAYER, "v", bits, True)
    ks, vs, vk = default_slots(n_kv * hd, float(cal.meta["outlier_fraction"]))
    norm = Rope("norm", 0, rope.freq_base, rope.freq_scale)
    perm_layer = KVCacheLayer(bits=bits, n_kv_heads=n_kv, head_dim=hd, k_lo=_gguf_order(cal.layers[LAYER]["k_lo"], hd),
                              k_hi=_gguf_order(cal.layers[LAYER]["k_hi"], hd), k_levels=kl, k_values=kv, v_levels=vl,
                              v_values=vv, k_slots=ks, v_slots=vs, v_outliers_per_side=vk, rope=norm)
    perm_rows = perm_layer.quantize_k(_gguf_order(K, hd))
    for pos in (np.arange(T), 3000 + np.cumsum(np.random.default_rng(bits).integers(1, 40, T))):
        ang = _angles(rope, hd, pos)
        for h in range(n_kv):
            q = Q[7, h * group * hd:(h + 1) * group * hd].reshape(group, hd)  # one token's query heads of KV head h
            ref = q.astype(np.float64) @ _rope(deq[:, h * hd:(h + 1) * hd], ang, "neox").T
            mag = np.abs(q).astype(np.float64) @ np.abs(deq[:, h * hd:(h + 1) * hd]).T
            for impl in ("generic", None):
                force(impl)
                try:
                    got = layer.k_scores(h, q, rows, pos)
                    got_norm = perm_layer.k_scores(h, _gguf_order(q, hd), perm_rows, pos)
                finally:
                    force(None)
                # the scalar reference computes llama.cpp's angles exactly as numpy does here (measured error
                # < 2e-7 of the magnitude); SIMD takes pos * theta_j (one rounding, not llama's product of j
                # roundings) and cos/sin by recurrence: ~1 ulp of the angle, 2e-5 of it at position 5000
                tol = (2e-6 if impl == "generic" else 2e-4) * mag + 1e-5
                assert (np.abs(got - ref) <= tol).all(), (impl, h, np.abs(got - ref).max())
                assert (np.abs(got_norm - ref) <= tol).all(), (impl, h, np.abs(got_norm - ref).max())
        # every KV head in one call: the per-head results, head-major
        qa = Q[11].reshape(-1, hd)
        every = layer.k_scores(None, qa, rows, pos)
        per = np.concatenate([layer.k_scores(h, qa[h * group:(h + 1) * group], rows, pos) for h in range(n_kv)])
        np.testing.assert_allclose(every, per, rtol=1e-5, atol=1e-4)


def test_attention_weights_times_values(real):
    cal, config, _, V, _ = real
    hd, n_kv = int(cal.meta["head_dim"]), int(cal.meta["n_kv_heads"])
    rng = np.random.default_rng(0)
    for bits in (4, 3):
        layer = KVCacheLayer.from_calibration(cal, LAYER, bits, True, rope_of(config))
        rows = layer.quantize_v(V)
        deq = layer.dequantize_v(rows)
        w = rng.dirichlet(np.ones(T), size=3).astype(np.float32)
        for h in range(n_kv):
            ref = w.astype(np.float64) @ deq[:, h * hd:(h + 1) * hd]
            for impl in ("generic", None):
                force(impl)
                try:
                    got = layer.v_accumulate(h, w, rows)
                finally:
                    force(None)
                np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(deq).max())
        wa = rng.dirichlet(np.ones(T), size=3 * n_kv).astype(np.float32)
        every = layer.v_accumulate(None, wa, rows)
        per = np.concatenate([layer.v_accumulate(h, wa[3 * h:3 * h + 3], rows) for h in range(n_kv)])
        np.testing.assert_allclose(every, per, rtol=1e-5, atol=1e-6)


def test_bad_input_refused(real):
    cal, config, K, _, _ = real
    layer = KVCacheLayer.from_calibration(cal, LAYER, 4, True, rope_of(config))
    bad = K[:3].copy()
    bad[1, 7] = np.nan
    with pytest.raises(KVKernelError, match=r"blk\.5 keys: token 1 holds a NaN"):
        layer.quantize_k(bad)
    with pytest.raises(KVKernelError, match="bits must be 2, 3 or 4"):
        KVCacheLayer(bits=5, n_kv_heads=1, head_dim=64, k_lo=np.zeros(64), k_hi=np.ones(64), k_levels=np.zeros(32),
                     k_values=np.zeros(32), v_levels=np.zeros(32), v_values=np.zeros(32))
    with pytest.raises(KVKernelError, match="KV head 3 of 3"):
        layer.k_scores(3, np.zeros((1, 64)), layer.quantize_k(K[:2]), [0, 1])
