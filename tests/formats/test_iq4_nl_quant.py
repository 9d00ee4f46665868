"""ggml-ext's IQ4_NL quantizer (ggml_ext/src/iq4_nl_quant.c) through ggml_ext.quants.

* on real weight matrices (SmolLM2, and Gemma-3-270M when fetched) its error is no larger
  than ggml's quantize_iq4_nl's: plain and x^2-weighted without an imatrix, imatrix-weighted
  with a real one from llama-imatrix;
* per block it finds the best fp16 scale: checked against a brute force over every finite
  fp16 value of either sign;
* its bytes are ggml's block_iq4_nl: ggml's own dequantize_row_iq4_nl reads them as the
  docs/formats/interleaved4.md table says; edge blocks (zeros, constants, huge, tiny, denormal) give finite
  scales; NaN/inf input is refused with a clear error; threads do not change the bytes.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

from ggml_ext import assets, quants
from ggml_ext.calibrate import imatrix

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
SMOL = ["model.layers.0.self_attn.q_proj.weight", "model.layers.15.mlp.down_proj.weight",
        "model.layers.29.self_attn.v_proj.weight"]
GEMMA = ["blk.0.attn_q.weight", "blk.5.ffn_down.weight", "blk.11.ffn_up.weight", "blk.17.attn_v.weight"]


def dequant(q: np.ndarray, shape) -> np.ndarray:
    """docs/formats/interleaved4.md: fp16 d, 16 bytes; weight j low nibble of qs[j], weight j+16 the high nibble."""
    b = np.ascontiguousarray(q).reshape(-1, 18)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    qs = b[:, 2:]
    return (np.concatenate([KVALUES[qs & 15], KVALUES[qs >> 4]], axis=1) * d).reshape(shape)


def ggml_dequant(q: np.ndarray, n: int) -> np.ndarray:
    lib = quants.library()
    fn = lib.dequantize_row_iq4_nl
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    q = np.ascontiguousarray(q)
    out = np.empty(n, dtype=np.float32)
    fn(q.ctypes.data, out.ctypes.data, n)
    return out


def errors(x: np.ndarray, q: np.ndarray, im: np.ndarray | None) -> dict[str, float]:
    e2 = (dequant(q, x.shape).astype(np.float64) - x) ** 2
    r = {"plain": float(e2.mean()), "x2": float((e2 * x.astype(np.float64) ** 2).sum() / (x.astype(np.float64) ** 2).sum())}
    if im is not None:
        r["imatrix"] = float((e2 * im).sum() / (im.sum() * x.shape[0]))
    return r


# ---------------------------------------------------------------- real tensors

@pytest.fixture(scope="module")
def smol_weights():
    from safetensors.numpy import load_file
    w = load_file(str(assets.path("smollm2-hf") / "model.safetensors"))
    return {k: np.ascontiguousarray(w[k], dtype=np.float32) for k in SMOL}


@pytest.fixture(scope="module")
def smol_imatrix(tmp_path_factory, wiki_test):
    """A real imatrix of the default model's f16 GGUF (llama-imatrix, 2 windows of 256 tokens)."""
    from default_models import default_model
    out = tmp_path_factory.mktemp("imatrix") / "smol.imatrix"
    return imatrix.load(imatrix.make(default_model("f16"), out, wiki_test, chunks=2, n_ctx=256))



def _gemma_path():
    try:
        return assets.path("gemma3-270m-gguf")
    except Exception:  # noqa: BLE001 - not fetched (only `assets fetch --all` gets it)
        return None


@pytest.fixture(scope="module")
def gemma_weights():
    path = _gemma_path()
    if path is None or not Path(path).exists():
        pytest.skip("Gemma-3-270M not fetched (ggml-ext assets fetch --all)")
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        if t.name in GEMMA:
            out[t.name] = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
    return path, out


@pytest.fixture(scope="module")
def gemma_imatrix(gemma_weights, tmp_path_factory, wiki_test):
    """A real imatrix of Gemma-3-270M (its Q4_K_M file; 1 window of 256 tokens)."""
    path, _ = gemma_weights
    out = tmp_path_factory.mktemp("imatrix") / "gemma.imatrix"
    return imatrix.load(imatrix.make(path, out, wiki_test, chunks=1, n_ctx=256))


def _compare(x: np.ndarray, im: np.ndarray | None) -> tuple[dict, dict]:
    ours = errors(x, quants.quantize(x, "IQ4_NL", imatrix=im, quantizer="ggml-ext"), im)
    ggml = errors(x, quants.quantize(x, "IQ4_NL", imatrix=im, quantizer="ggml"), im)
    return ours, ggml


def _check(name: str, x: np.ndarray, im: np.ndarray | None) -> None:
    ours, ggml = _compare(x, im)
    print(name, "imatrix" if im is not None else "plain", {k: f"{ours[k] / ggml[k]:.3f}" for k in ours})
    if im is None:
        assert ours["plain"] <= ggml["plain"], (name, ours, ggml)
        assert ours["x2"] <= ggml["x2"], (name, ours, ggml)
    else:
        assert ours["imatrix"] <= ggml["imatrix"], (name, ours, ggml)


@pytest.mark.parametrize("name", SMOL)
def test_error_no_larger_than_ggml_smollm2(smol_weights, name):
    _check(name, smol_weights[name], None)


@pytest.mark.parametrize("name", SMOL)
def test_error_no_larger_than_ggml_smollm2_imatrix(smol_weights, smol_imatrix, name):
    gguf = {"model.layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
            "model.layers.15.mlp.down_proj.weight": "blk.15.ffn_down.weight",
            "model.layers.29.self_attn.v_proj.weight": "blk.29.attn_v.weight"}[name]
    x = smol_weights[name]
    _check(name, x, smol_imatrix.for_tensor(gguf, x.shape[1]))


@pytest.mark.parametrize("name", GEMMA)
def test_error_no_larger_than_ggml_gemma3(gemma_weights, name):
    _check(name, gemma_weights[1][name], None)


@pytest.mark.parametrize("name", GEMMA)
def test_error_no_larger_than_ggml_gemma3_imatrix(gemma_weights, gemma_imatrix, name):
    x = gemma_weights[1][name]
    _check(name, x, gemma_imatrix.for_tensor(name, x.shape[1]))


# ---------------------------------------------------------------- the scale search is exact

FP16_POS = np.arange(1, 0x7c00, dtype=np.uint16).view(np.float16).astype(np.float64)  # every finite d > 0


def _brute_best(x: np.ndarray, w: np.ndarray) -> float:
    """min over every finite fp16 d (both signs) of sum w (x - d v[nearest])^2."""
    best = float((w * x * x).sum())  # d = 0
    mids = (KVALUES[1:] + KVALUES[:-1]).astype(np.float64) / 2
    for d in (FP16_POS, -FP16_POS):
        z = x[None, :] / d[:, None]
        idx = np.searchsorted(mids, z, side="right")
        err = (w[None, :] * (x[None, :] - d[:, None] * KVALUES[idx]) ** 2).sum(axis=1)
        best = min(best, float(err.min()))
    return best


def test_each_block_gets_the_best_fp16_scale(smol_weights):
    rng = np.random.default_rng(0)
    x = smol_weights[SMOL[1]].reshape(-1, 32)[rng.choice(27648, 12, replace=False)].astype(np.float64)
    x = np.concatenate([x, rng.standard_normal((6, 32)) * 0.02, rng.standard_t(3, (6, 32))])
    worse = 0
    for blk in x.astype(np.float32):
        b64 = blk.astype(np.float64)
        xs = b64 / np.abs(b64).max()
        w = np.sqrt((xs * xs).mean() + xs * xs)  # the default weighting (sqrt_s2x2), up to a constant
        q = quants.quantize(blk[None, :], "IQ4_NL", quantizer="ggml-ext")
        ours = float((w * (dequant(q, (32,)).astype(np.float64) - b64) ** 2).sum())
        best = _brute_best(b64, w)
        assert ours <= best * (1 + 1e-3) + 1e-30, (ours, best)
        worse += ours > best * (1 + 1e-9)
    assert worse <= 1  # the three fp16 candidates next to the exact optimum miss the fp16 optimum at most rarely


# ---------------------------------------------------------------- bytes, edge blocks, refusals

def _edge_blocks() -> np.ndarray:
    rng = np.random.default_rng(3)
    b = [np.zeros(32), np.full(32, 0.5), np.full(32, -3.0), np.full(32, 65504.0 * 300), np.full(32, -1e30),
         np.r_[1e30, rng.standard_normal(31)], np.full(32, 1e-30), np.full(32, 1e-40), np.r_[np.zeros(31), 2.0],
         np.tile([1.0, -1.0], 16), rng.standard_normal(32) * 1e4, np.r_[-1e-3, np.zeros(31)]]
    return np.array(b, dtype=np.float32)


@pytest.mark.parametrize("with_imatrix", [False, True])
def test_edge_blocks_finite_and_read_by_ggml(with_imatrix):
    x = _edge_blocks()
    im = np.random.default_rng(4).gamma(0.5, 1.0, 32).astype(np.float32) if with_imatrix else None
    q = quants.quantize(x, "IQ4_NL", imatrix=im, quantizer="ggml-ext")
    d = q[:, :2].copy().view(np.float16).astype(np.float32).ravel()
    assert np.isfinite(d).all()
    assert quants.validate("IQ4_NL", q)
    ours = dequant(q, x.shape)
    assert np.array_equal(ggml_dequant(q, x.size).reshape(x.shape), ours)  # same bytes meaning in ggml
    assert np.array_equal(ours[0], np.zeros(32))
    for i, c in ((1, 0.5), (2, -3.0)):
        assert np.allclose(ours[i], c, rtol=2e-3), ours[i]
    assert abs(d[3]) == 65504.0 and abs(d[4]) == 65504.0  # clamped to fp16's largest, not inf
    assert np.allclose(ours[8], x[8], atol=0.02)  # one non-zero weight: exact up to fp16 rounding of d


def test_bytes_dequantize_through_ggml_on_real_rows(smol_weights):
    x = smol_weights[SMOL[0]][:64]
    q = quants.quantize(x, "IQ4_NL", quantizer="ggml-ext")
    assert np.array_equal(ggml_dequant(q, x.size).reshape(x.shape), dequant(q, x.shape))
    assert np.abs(dequant(q, x.shape) - x).max() < np.abs(x).max() * 0.1


def test_threads_do_not_change_bytes(smol_weights):
    x = smol_weights[SMOL[1]][:200]
    a = quants.quantize(x, "IQ4_NL", threads=1)
    assert np.array_equal(a, quants.quantize(x, "IQ4_NL", threads=3))
    assert np.array_equal(a, quants.quantize(x, "IQ4_NL", quantizer="ggml-ext", threads=2))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rows_refused(bad):
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    x[2, 37] = bad
    with pytest.raises(quants.QuantError, match=r"NaN or infinite values \(first at row 2, column 37\)"):
        quants.quantize(x, "IQ4_NL")
    # the C function refuses too (returns 0 bytes) rather than writing a garbage scale
    lib = quants.library()
    out = np.zeros(4 * 36, dtype=np.uint8)
    assert lib.ggml_ext_quantize_iq4_nl_weighted(x.ctypes.data, out.ctypes.data, 4, 64, None, 0) == 0


def test_bad_imatrix_and_arguments_refused():
    x = np.ones((2, 64), dtype=np.float32)
    for im in (np.full(64, np.nan, np.float32), np.full(64, -1.0, np.float32)):
        with pytest.raises(quants.QuantError, match="imatrix holds NaN, infinite or negative"):
            quants.quantize(x, "IQ4_NL", imatrix=im)
    with pytest.raises(quants.QuantError, match="imatrix must have 64 values"):
        quants.quantize(x, "IQ4_NL", imatrix=np.ones(32, np.float32))
    with pytest.raises(quants.QuantError, match="unknown IQ4_NL weighting"):
        quants.quantize(x, "IQ4_NL", weighting="cubic")
    with pytest.raises(quants.QuantError, match="IQ4_NL only"):
        quants.quantize(x, "Q4_0", quantizer="ggml-ext")
    lib = quants.library()
    out = np.zeros(64, dtype=np.uint8)
    assert lib.ggml_ext_quantize_iq4_nl_weighted(x.ctypes.data, out.ctypes.data, 1, 48, None, 0) == 0
    assert lib.ggml_ext_quantize_iq4_nl_weighted(x.ctypes.data, out.ctypes.data, 1, 64, None, 9) == 0


def test_all_zero_imatrix_block_falls_back_to_plain_error():
    x = np.random.default_rng(6).standard_normal((3, 64)).astype(np.float32)
    im = np.r_[np.zeros(32), np.ones(32)].astype(np.float32)
    q = quants.quantize(x, "IQ4_NL", imatrix=im)
    plain = quants.quantize(x, "IQ4_NL", weighting="one")
    assert np.array_equal(q.reshape(3, 2, 18)[:, 0], plain.reshape(3, 2, 18)[:, 0])
