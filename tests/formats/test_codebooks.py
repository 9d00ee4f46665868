"""The codebook types CB2 / CB3 (docs/formats/codebooks.md): discovery (Algorithm 1) reproducible from
a seed and the built-in tables its output, the C reference quantizer on real weights (error against an
exhaustive numpy search, importance weighting, block sizes), the numpy twin of dequantize bit-exact
against the C one, and bad input refused. Real data: SmolLM2's and Gemma-3-270M's HF folders."""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

from ggml_ext import assets, codebooks
from ggml_ext.codebooks import discover as disc
from ggml_ext.codebooks import builtin as tb

#: the source checkout: the committed tables JSON and header (an installed package has neither)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def smollm2_hf():
    return assets.path("smollm2-hf")


@pytest.fixture(scope="session")
def real_rows(smollm2_hf) -> np.ndarray:
    """48 rows of 512 real weights from three of SmolLM2's matrices (attention, MLP up and down)."""
    from safetensors import safe_open
    rng = np.random.default_rng(7)
    parts = []
    with safe_open(str(smollm2_hf / "model.safetensors"), framework="np") as st:
        for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.11.mlp.up_proj.weight",
                     "model.layers.29.mlp.down_proj.weight"):
            w = st.get_tensor(name)
            parts.append(w[rng.choice(w.shape[0], 16, replace=False), :512])
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


# ---------------------------------------------------------------- discovery and the built-in tables

def test_discovery_reproducible_from_seed(smollm2_hf, tmp_path):
    """The same seed gives the same tables twice, through the API and through `ggml-ext codebooks discover`,
    and the output records the inputs (sha256), the command, the versions and the seed."""
    from ggml_ext import cli
    a = disc.discover([str(smollm2_hf)], max_groups=2000, seed=3, hash_inputs=False)
    out, header = tmp_path / "t.json", tmp_path / "t.h"
    assert cli.main(["codebooks", "discover", str(smollm2_hf), "-o", str(out), "--max-groups", "2000",
                     "--seed", "3", "--header", str(header)]) == 0
    b = json.loads(out.read_text())
    assert disc.tables_of(a) == disc.tables_of(b)
    for name, (n_cb, n_e) in (("CB2", (4, 4)), ("CB3", (4, 8))):
        books = np.array(b["types"][name]["codebooks"])
        assert books.shape == (n_cb, n_e)
        assert (books >= -127).all() and (books <= 127).all() and (np.diff(books, axis=1) > 0).all()
    prov = b["provenance"]
    want = assets.manifest()["assets"]["smollm2-hf"]["files"]["smollm2-hf/model.safetensors"]["sha256"]
    assert [r["sha256"] for r in prov["inputs"]] == [want]
    assert prov["seed"] == 3 and prov["max_groups"] == 2000 and prov["groups_used"] == 2000
    assert prov["command"] == ["ggml-ext", "codebooks", "discover", str(smollm2_hf), "-o", str(out), "--max-groups",
                               "2000", "--bins", "16", "--seed", "3", "--header", str(header)]
    import sklearn
    assert prov["sklearn"] == sklearn.__version__
    assert header.read_text() == tb.header_text(b, out.name)


def test_builtin_header_is_generated_from_the_json():
    """The committed header is what the committed JSON generates, and the library holds those tables."""
    result = tb.load(tb.builtin_json_path(ROOT))
    assert tb.builtin_header_path(ROOT).read_text() == tb.header_text(result)
    assert codebooks.tables_version() == result["tables_version"] == tb.TABLES_VERSION
    for bits in (2, 3):
        assert codebooks.tables(bits).tolist() == result["types"][f"CB{bits}"]["codebooks"]


def test_builtin_tables_come_from_discovery_on_the_real_models():
    """Re-running the recorded discovery on the recorded inputs (the same files, by sha256) gives the
    built-in tables. k-means is only reproducible within one scikit-learn version: skipped on another."""
    import sklearn
    result = tb.load(tb.builtin_json_path(ROOT))
    prov = result["provenance"]
    if prov["sklearn"] != sklearn.__version__:
        pytest.skip(f"tables made with scikit-learn {prov['sklearn']}, this is {sklearn.__version__}")
    files = assets.manifest()["assets"]
    paths = []
    for rec, name in zip(prov["inputs"], ("smollm2-hf", "gemma3-hf")):
        assert files[name]["files"][f"{name}/{rec['file']}"]["sha256"] == rec["sha256"]
        paths.append(str(assets.path(name)))
    again = disc.discover(paths, max_groups=prov["max_groups"], bins=prov["bins"], seed=prov["seed"],
                          hash_inputs=False)
    assert disc.tables_of(again) == disc.tables_of(result)


# ---------------------------------------------------------------- the C reference

def _weighted_error(x, y, w):
    return float((((x - y) ** 2) * w).sum())


def _exhaustive(xb: np.ndarray, wb: np.ndarray, bits: int, n_d: int = 96) -> float:
    """The numpy search the C quantizer is held against: for each fp16 super-scale of a log grid,
    every sub-group takes its best codebook and multiplier 1..16 exhaustively, nearest codes."""
    t = codebooks.tables(bits).astype(np.float32)
    amax = np.abs(xb).max()
    ds = np.unique(np.geomspace(amax / (16 * 127), amax / (16 * 40), n_d).astype(np.float16).astype(np.float32))
    xs, ws = xb.reshape(16, 16), wb.reshape(16, 16)
    m = np.arange(1, 17, dtype=np.float32)
    best = np.inf
    for d in ds:
        vals = (d * m)[None, :, None] * t[:, None, :]                       # (c, m, entry)
        e = ((xs[:, None, None, :, None] - vals[None, :, :, None, :]) ** 2).min(-1)
        best = min(best, float((e * ws[:, None, None, :]).sum(-1).reshape(16, -1).min(1).sum()))
    return best


@pytest.mark.parametrize("bits", [2, 3])
def test_error_close_to_exhaustive_search(real_rows, bits):
    """dequantize(quantize(x)) on real weights: the weighted error is within a few percent of an
    exhaustive numpy search (each block at most 15% above it, the mean ratio at most 6%)."""
    rng = np.random.default_rng(bits)
    x = real_rows[rng.choice(real_rows.shape[0], 6, replace=False), :256]
    for imp in (None, rng.lognormal(0.0, 1.5, 256).astype(np.float32)):
        w = np.ones(256, np.float32) if imp is None else imp
        y = codebooks.fake_quantize(x, bits, imp)
        ratios = [_weighted_error(x[i], y[i], w) / _exhaustive(x[i], w, bits) for i in range(len(x))]
        assert max(ratios) < 1.15 and np.mean(ratios) < 1.06, ratios


@pytest.mark.parametrize("bits", [2, 3])
def test_importance_lowers_weighted_error(real_rows, bits):
    """Quantizing with an importance vector lowers the error it weights, against the same rows quantized
    with equal weights."""
    imp = np.random.default_rng(11).lognormal(0.0, 1.5, real_rows.shape[1]).astype(np.float32)
    with_imp = codebooks.fake_quantize(real_rows, bits, imp)
    plain = codebooks.fake_quantize(real_rows, bits)
    assert _weighted_error(real_rows, with_imp, imp) < 0.95 * _weighted_error(real_rows, plain, imp)


@pytest.mark.parametrize("bits", [2, 3])
def test_sqrt_s2x2_weighting(real_rows, bits):
    """The "sqrt_s2x2" weighting minimises importance * sqrt(sigma2 + x^2)-weighted error: lower in that
    measure than the plain importance weighting; with importance 1 it differs from the unweighted result."""
    imp = np.random.default_rng(13).lognormal(0.0, 1.0, real_rows.shape[1]).astype(np.float32)
    blocks = real_rows.reshape(real_rows.shape[0], -1, 256)
    sigma2 = (blocks ** 2).mean(-1, keepdims=True)
    w = (imp.reshape(-1, 256)[None] * np.sqrt(sigma2 + blocks ** 2)).reshape(real_rows.shape)
    a = codebooks.fake_quantize(real_rows, bits, imp, weighting="sqrt_s2x2")
    b = codebooks.fake_quantize(real_rows, bits, imp)
    assert _weighted_error(real_rows, a, w) < _weighted_error(real_rows, b, w)
    with pytest.raises(codebooks.CodebookError, match="unknown weighting"):
        codebooks.quantize(real_rows, bits, weighting="x2")


@pytest.mark.parametrize("bits,nbytes,bpw", [(2, 78, 2.4375), (3, 110, 3.4375)])
def test_block_size_is_the_stated_bits_per_weight(real_rows, bits, nbytes, bpw):
    q = codebooks.quantize(real_rows, bits)
    assert q.shape == (real_rows.shape[0], real_rows.shape[1] // 256 * nbytes)
    assert codebooks.bits_per_weight(bits) == bpw == q.size * 8 / real_rows.size
    lib = codebooks._lib()
    assert lib.ggml_ext_codebooks_block_size(bits) == nbytes and lib.ggml_ext_codebooks_block_size(4) == 0


@pytest.mark.parametrize("bits", [2, 3])
def test_result_independent_of_threads(real_rows, bits):
    assert np.array_equal(codebooks.quantize(real_rows, bits, threads=1), codebooks.quantize(real_rows, bits, threads=3))


@pytest.mark.parametrize("bits", [2, 3])
def test_numpy_twin_bit_exact(real_rows, bits):
    """The numpy dequantizer (written from the documented layout) equals the C one bit for bit: real
    weights, Gaussian rows spanning scales, an all-zero block and random bytes (every field value)."""
    rng = np.random.default_rng(5)
    gauss = (rng.standard_normal((8, 512)) * np.geomspace(1e-4, 1e3, 8)[:, None]).astype(np.float32)
    gauss[0, :256] = 0.0
    for rows in (real_rows, gauss):
        q = codebooks.quantize(rows, bits)
        assert np.array_equal(codebooks.dequantize(q, bits).view(np.uint32),
                              codebooks.dequantize_numpy(q, bits).view(np.uint32))
    raw = rng.integers(0, 256, size=(4, 3 * codebooks.BLOCK_BYTES[bits]), dtype=np.uint8)
    raw.reshape(-1, codebooks.BLOCK_BYTES[bits])[:, 1] &= 0x7B  # finite fp16 super-scales
    assert np.array_equal(codebooks.dequantize(raw, bits).view(np.uint32),
                          codebooks.dequantize_numpy(raw, bits).view(np.uint32))
    assert np.array_equal(codebooks.fake_quantize(gauss[:1, :256], bits), np.zeros((1, 256), np.float32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_input_refused(real_rows, bad):
    x = real_rows[:2].copy()
    x[1, 300] = bad
    with pytest.raises(codebooks.CodebookError, match=r"blk\.3\.ffn_up\.weight.*NaN or infinite.*row 1, column 300"):
        codebooks.quantize(x, 2, name="blk.3.ffn_up.weight")
    # the C function refuses by itself too: nothing written, 0 returned
    out = np.full(2 * 2 * 78, 0xAB, dtype=np.uint8)
    assert codebooks._lib().ggml_ext_codebooks_quantize(2, x.ctypes.data, out.ctypes.data, 2, 512, None) == 0
    assert (out == 0xAB).all()


def test_bad_importance_and_shapes_refused(real_rows):
    imp = np.ones(real_rows.shape[1], np.float32)
    imp[3] = -1.0
    with pytest.raises(codebooks.CodebookError, match="negative"):
        codebooks.quantize(real_rows, 3, imp, name="t")
    with pytest.raises(codebooks.CodebookError, match="not a whole number of 256"):
        codebooks.quantize(real_rows[:, :200], 2, name="t")
    with pytest.raises(codebooks.CodebookError, match="not 4"):
        codebooks.quantize(real_rows, 4)
    imp[3] = np.nan
    out = np.zeros(real_rows.shape[0] * 2 * 110, np.uint8)
    assert codebooks._lib().ggml_ext_codebooks_quantize(3, real_rows.ctypes.data, out.ctypes.data, real_rows.shape[0],
                                                 512, imp.ctypes.data_as(ctypes.c_void_p)) == 0


def test_discovery_refuses_unreadable_input(tmp_path):
    with pytest.raises(disc.DiscoveryError, match="not a Hugging Face model folder"):
        list(disc.iter_matrices(tmp_path / "x.bin"))
    with pytest.raises(disc.DiscoveryError, match="no \\*.safetensors"):
        list(disc.iter_matrices(tmp_path))


def test_discovery_reads_gguf_blocks(default_gguf, smollm2_hf):
    """A GGUF input is dequantized (the gguf package): SmolLM2's Q4_1 file gives the same values as the
    HF folder dequantized from it (layer 0's MLP down projection, which the converter does not permute)."""
    from safetensors import safe_open
    for m in disc.iter_matrices(default_gguf):
        if m.name == "blk.0.ffn_down.weight":
            break
    else:
        pytest.fail("blk.0.ffn_down.weight not among the GGUF's block matrices")
    with safe_open(str(smollm2_hf / "model.safetensors"), framework="np") as st:
        ref = st.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert m.rows.shape == ref.shape
    np.testing.assert_allclose(m.rows, ref, rtol=0, atol=1e-6)
