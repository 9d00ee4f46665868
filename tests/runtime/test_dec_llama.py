"""QDEC in our llama.cpp (docs/QDEC.md "In llama.cpp"): the side file of `ggml-ext calibrate dec` given to
llama-cpp-python (GGML_EXT_DEC / ``Llama(dec=...)``) and to llama-cli (--dec, --dec-k), on the CPU.

The base is the default model requantized to Q4_0 by our llama-quantize and the side file covers six of its
30 decoder layers (tests/methods/test_dec.py's, same cache). Decoding one token at a time (ubatches of one
token: DEC_MUL_MAT after each covered linear), the logits come closer to the f16 model's than the base's
alone; k_chunk 0 gives the base's logits bit for bit; a prefill (one ubatch of many tokens) is the base's
bit for bit (DEC is for decode only). A side file of another base (the f16 model: same shapes, other
types), one covering a layer the model lacks, and a GGUF that is no side file are refused at load with a
message naming why; a bad --dec-k is refused by the tool's argument parser.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import convert_support as cs  # noqa: E402
from ggml_ext import assets, tools  # noqa: E402
from ggml_ext.llama_cpp_glue import Llama, set_dec  # noqa: E402
from ggml_ext.qdec import calibration  # noqa: E402

SAMPLES, SEQ = 2, 128
LAYERS = {0, 1, 2, 3, 12, 25}   # tests/methods/test_dec.py's side file (same cache entry)
N_TOK = 40                      # tokens of wiki-test decoded one by one


@pytest.fixture(scope="module")
def base(default_gguf):
    return cs.dec_q4_0_base(default_gguf)


@pytest.fixture(scope="module")
def side(base):
    hf_dir = assets.path("smollm2-hf")
    path = base.with_name(f"smollm2-q4_0.c{SAMPLES}x{SEQ}.l{'-'.join(map(str, sorted(LAYERS)))}.dec.gguf")
    try:
        d = calibration.load(path, base)
        assert "base_types" in d.meta   # written by this version (the runtime checks the types)
    except (calibration.DecError, AssertionError):
        calibration.calibrate(base, hf_dir, None, SAMPLES, SEQ, progress=False, layers=LAYERS).save(path, force=True)
    return path


@pytest.fixture(scope="module")
def tokens(wiki_test, default_gguf, threads):
    llm = Llama(default_gguf, n_ctx=256, n_threads=threads, vocab_only=True)
    text = wiki_test.read_text(encoding="utf-8")[2000:6000]
    return llm.tokenize(text.encode(), add_bos=True)[:N_TOK]


def _logits(model, toks, threads, *, dec=None, k=None, one_by_one=True, logits_all=True):
    """Logits of every position: decoded one token per llama_decode, or one prefill (logits_all False: only
    the last position's are computed, and llama.cpp's last layer then sees one row)."""
    set_dec(dec, k=k)
    try:
        llm = Llama(model, n_ctx=128, n_batch=64, n_ubatch=64, n_threads=threads, logits_all=logits_all, seed=0)
        if one_by_one:
            for t in toks:
                llm.eval([t])
        else:
            llm.eval(list(toks))
        if logits_all:
            out = np.array(llm.scores[:len(toks)], dtype=np.float64)
        else:  # llama-cpp-python keeps no scores then: the context's one row of logits
            out = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(1, llm.n_vocab())).astype(np.float64)
        llm.close()
        return out
    finally:
        set_dec(None)


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _kl(ref, got):
    """Mean KL(ref || got) over the positions."""
    lp, lq = _log_softmax(ref), _log_softmax(got)
    return float((np.exp(lp) * (lp - lq)).sum(axis=-1).mean())


@pytest.fixture(scope="module")
def f16_logits(tokens, threads):
    return _logits(cs.default_converted("f16"), tokens, threads)


@pytest.fixture(scope="module")
def base_logits(base, tokens, threads):
    return _logits(base, tokens, threads)


def test_decode_with_dec_is_closer_to_f16(base, side, tokens, threads, f16_logits, base_logits):
    kl_base = _kl(f16_logits, base_logits)
    got = {k: _kl(f16_logits, _logits(base, tokens, threads, dec=side, k=k)) for k in ("16", "1024")}
    # six of 30 layers compensated: at k_chunk 16 (16 of 576 channels) a little, at 1024 (every channel:
    # the whole 4-bit residual) clearly closer to the f16 model (measured in docs/RESULTS.md "QDEC")
    assert got["16"] < kl_base, (got, kl_base)
    assert got["1024"] < 0.9 * kl_base, (got, kl_base)


def test_k0_is_the_base_and_prefill_is_untouched(base, side, tokens, threads, base_logits):
    assert np.array_equal(_logits(base, tokens, threads, dec=side, k="0"), base_logits)
    pre = _logits(base, tokens, threads, one_by_one=False)
    pre_dec = _logits(base, tokens, threads, dec=side, k="1024", one_by_one=False)
    assert np.array_equal(pre, pre_dec)
    # and the one-token path does change with DEC on (the test above would also pass if it did nothing)
    assert not np.array_equal(_logits(base, tokens[:4], threads, dec=side, k="1024"), base_logits[:4])


def test_prefill_last_layer_on_one_row_is_untouched(base, side, tokens, threads, tmp_path):
    # only the last token's logits asked for: llama.cpp's last layer (29) runs its FFN on that one row. A
    # side file covering layer 29 (layer 25's residuals under layer 29's names: same shapes; any residual
    # shows whether DEC ran) must leave the prefill alone (a build deciding by rows alone changed these
    # logits by up to 2.3)
    d = calibration.load(side)
    d.linears = {n.replace("blk.25.", "blk.29."): v for n, v in d.linears.items()}
    d.meta["base_types"] = [t.replace("blk.25.", "blk.29.") for t in d.meta["base_types"]]
    side29 = tmp_path / "l29.dec.gguf"
    d.save(side29)
    pre = _logits(base, tokens, threads, one_by_one=False)
    last = _logits(base, tokens, threads, one_by_one=False, logits_all=False)
    last_dec = _logits(base, tokens, threads, dec=side29, k="1024", one_by_one=False, logits_all=False)
    assert np.array_equal(last, last_dec) and np.allclose(last[0], pre[-1], rtol=0, atol=1e-2)
    # and a decode step does go through layer 29's DEC
    one = _logits(base, tokens[:1], threads)
    one_dec = _logits(base, tokens[:1], threads, dec=side29, k="1024")
    assert not np.array_equal(one, one_dec)


def test_per_type_k_and_bad_values(base, side, tokens, threads, base_logits):
    # only the MLP's down projection compensated: differs from both off and all-on
    down = _logits(base, tokens[:6], threads, dec=side, k="qkv=0,o=0,gateup=0,down=64")
    assert not np.array_equal(down, base_logits[:6])
    with pytest.raises(ValueError, match="qkv, o, gateup, down"):
        set_dec(side, k="attn=3")
    set_dec(None)


def _write_side(path, src, extra_layer=False):
    """A copy of side file ``src``, optionally with a residual for a layer the model lacks."""
    from ggml_ext.qdec.calibration import DecLinear
    d = calibration.load(src)
    if extra_layer:
        one = d.linears["blk.0.attn_q.weight"]
        d.linears["blk.99.attn_q.weight"] = DecLinear(one.M, one.K, one.packed, one.scales, one.bounds, one.act)
    d.save(path, force=True)
    return path


def _load_error(model, dec, threads):
    r = subprocess.run(tools.command("llama-cli", "-m", model, "--dec", dec, "-p", "Hi", "-n", "2", "-st",
                                     "--temp", "0", "-c", "128", "-t", str(threads), "--no-warmup", "--simple-io"),
                       capture_output=True, text=True, env=tools.tool_env(), timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    return r.stdout + r.stderr


def test_wrong_side_files_are_refused(base, side, threads, tmp_path):
    f16 = cs.default_converted("f16")
    log = _load_error(f16, side, threads)
    assert "does not belong to this model" in log and "is f16 here" in log and "of a q4_0 base" in log, log[-2000:]
    log = _load_error(base, _write_side(tmp_path / "extra.dec.gguf", side, extra_layer=True), threads)
    assert "does not belong to this model" in log and "blk.99.attn_q.weight" in log, log[-2000:]
    log = _load_error(base, base, threads)
    assert "is not a QDEC side file" in log, log[-2000:]
    with pytest.raises(ValueError):
        set_dec(side)
        try:
            Llama(f16, n_ctx=64, n_threads=threads)
        finally:
            set_dec(None)


def test_llama_cli_runs_with_dec(base, side, threads):
    args = ["-m", base, "--dec", side, "--dec-k", "qkv=16,o=8,gateup=16,down=32", "--dec-ntb", "4",
            "-p", "The capital of France is", "-n", "8", "-st", "--temp", "0", "--seed", "0", "-c", "256",
            "-t", str(threads), "--no-warmup", "--simple-io"]
    r = subprocess.run(tools.command("llama-cli", *args), capture_output=True, text=True, env=tools.tool_env(),
                       timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "linears compensated at decode" in r.stderr
    bad = subprocess.run(tools.command("llama-cli", "-m", base, "--dec", side, "--dec-k", "qkv=x"),
                         capture_output=True, text=True, env=tools.tool_env(), timeout=120, stdin=subprocess.DEVNULL)
    assert bad.returncode != 0 and "--dec-k" in bad.stdout + bad.stderr


def test_tuner_refuses_without_a_gpu(base, side, tmp_path):
    import sys
    devs = subprocess.run(tools.command("llama-bench", "--list-devices"), capture_output=True, text=True,
                          env=tools.tool_env(), timeout=120)
    if "CUDA0" in devs.stdout + devs.stderr:
        pytest.skip("this build sees a CUDA GPU: the tuner measures there (bench/device/device_dec.sh MODE=tune)")
    r = subprocess.run([sys.executable, "-m", "ggml_ext.cli", "tune", "dec", str(base), "--dec", str(side),
                        "-o", str(tmp_path / "t")], capture_output=True, text=True, env=tools.tool_env(), timeout=300)
    assert r.returncode == 1 and "lists no CUDA device" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "t").exists()
