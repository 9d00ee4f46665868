"""Any-precision files run in our llama.cpp (the APQ type and the APQ_MUL_MAT op, docs/formats/anyprec.md).

The default model converted once with ``--method anyprec --bits 3-8`` (cached under
``~/.cache/ggml-ext/tests``, keyed by the code it depends on; unweighted k-means, ``fisher=False``: the
Fisher-weighted conversion is tested in tests/methods/test_anyprec.py and costs a calibration pass more).
From that one file our llama-perplexity, at ``--apq-bits`` 3, 4 and 8, gives the perplexity of the same
file's precision extracted as F32 matrices (``ggml-ext anyprec extract --type f32``: the b-bit values,
multiplied by llama.cpp's own F32 path) up to summation order; a small batch (``-ub 8``) goes through the
bitplane GEMV instead of the dequantized blocks and agrees as well; the 8-bit model is near the f16
model; a precision the file does not serve is refused with a message naming the range, from the flag,
the environment and llama-cpp-python's ``apq_bits``; ``ggml-ext info`` lists the precisions. llama-server
serves each request at the precision its ``apq_bits`` field asks for from one copy of the weights (patch
0311): the same answer as a server started at that precision, concurrent requests of two precisions
included, and a precision the file does not serve is a 400, not a crash.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import convert_support as cs
from ggml_ext import tools
from ggml_ext.anyprec import extract as X

CTX, CHUNKS = 256, 3


def _code_digest() -> str:
    """What the bitplane conversion's bytes depend on: our code, the library, the assets."""
    return cs.code_digest("methods/anyprec.py", "anyprec/__init__.py", "converters/pipeline.py",
                          "converters/policy.py", "quants.py")


@pytest.fixture(scope="module")
def apq_file():
    from ggml_ext.converters import convert
    return cs.cached_default_conversion(
        "smollm2-anyprec-3-8", _code_digest(),
        lambda path: convert(cs.default_hf(), path, method="anyprec", method_options={"fisher": False, "bits": "3-8"}))


def _ppl(path, wiki_test, threads, **kw):
    return tools.perplexity(path, wiki_test, n_ctx=CTX, chunks=CHUNKS, threads=threads, **kw).ppl


def test_file_holds_apq_weights_and_info_lists_the_precisions(apq_file):
    f = X.open_file(apq_file)
    assert (f.seed, f.parent) == (3, 8) and len(f.matrices) == 7 * 30
    t = f.gguf.tensor("blk.0.ffn_down.weight")
    assert t.type_name == "APQ" and tuple(t.shape) == (1536, 576)
    out = subprocess.run([sys.executable, "-m", "ggml_ext.cli", "info", str(apq_file)], capture_output=True, text=True,
                         env=tools.tool_env())
    assert out.returncode == 0, out.stderr
    assert "precisions 3..8" in out.stdout and "--apq-bits 3..8" in out.stdout


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_perplexity_at_each_precision_is_the_extracted_models(apq_file, wiki_test, threads, tmp_path, bits):
    got = _ppl(apq_file, wiki_test, threads, apq_bits=bits)
    ref_file = X.extract(apq_file, bits, tmp_path / f"x{bits}.gguf", type="f32")
    want = _ppl(ref_file, wiki_test, threads)
    # the same weights; only the order of float32 sums differs (dequantized blocks + ggml's dot vs its F32
    # GEMM), which 30 layers amplify to a few 1e-4 of the perplexity (measured: 3-5e-4; the F32 file alone
    # moves by 1e-3 between ubatches of 9 and 64 tokens on a 64-token window). Which precision
    # the op reads is checked exactly in tests/c/test_ext_ops.cpp (random tables per precision).
    assert abs(got - want) <= 2e-3 * want, (bits, got, want)
    if bits == 8:
        f16 = _ppl(cs.default_converted("f16"), wiki_test, threads)
        assert abs(got - f16) <= 0.02 * f16, (got, f16)
    if bits == 4:
        # ubatches of 8 tokens: the bitplane GEMV (AVX2 / NEON / scalar) per token, not the dequantized
        # blocks, against the F32 file in the same ubatches (llama.cpp's other matmuls take their
        # small-batch kernels too); one shorter window, as it is slower (measured: equal to 4 decimals)
        small = dict(n_ctx=128, chunks=1, threads=threads, extra=["-b", "128", "-ub", "8"])
        got = tools.perplexity(apq_file, wiki_test, apq_bits=4, **small).ppl
        want = tools.perplexity(ref_file, wiki_test, **small).ppl
        assert abs(got - want) <= 1e-3 * want, (got, want)


def test_default_precision_is_the_parent(apq_file, wiki_test, threads):
    assert _ppl(apq_file, wiki_test, threads) == _ppl(apq_file, wiki_test, threads, env={"GGML_EXT_APQ_BITS": "8"})


def test_a_precision_the_file_does_not_serve_is_refused(apq_file, wiki_test, threads):
    with pytest.raises(RuntimeError, match="serve 3 to 8 bits only"):
        _ppl(apq_file, wiki_test, threads, apq_bits=2)
    with pytest.raises(RuntimeError, match="serve 3 to 8 bits only"):
        _ppl(apq_file, wiki_test, threads, env={"GGML_EXT_APQ_BITS": "2"})
    with pytest.raises(RuntimeError, match="not a precision"):
        _ppl(apq_file, wiki_test, threads, env={"GGML_EXT_APQ_BITS": "eight"})
    with pytest.raises(RuntimeError, match="--apq-bits: 9 is out of range; use 1..8"):
        _ppl(apq_file, wiki_test, threads, apq_bits=9)


def test_split_mode_tensor_refuses_apq_weights(apq_file, two_rpc_servers, wiki_test, tool_env):
    """Bitplanes are plane-major over the whole matrix: no row or column cut of an APQ weight is a contiguous
    slice, so `-sm tensor` over two devices refuses the file at load, naming the tensor and the way out."""
    from ggml_ext import tools
    rpc = ",".join(f"127.0.0.1:{p}" for p in two_rpc_servers)
    for _ in range(8):  # llama.cpp's log thread can lose the last lines when the process exits at once (more often
        # on a loaded machine: three losses in a row were seen): retry
        proc = subprocess.run(tools.command("llama-perplexity", "-m", apq_file, "-f", wiki_test, "-c", "128",
                                            "--chunks", "1", "-t", "1", "--no-warmup", "--rpc", rpc, "-ngl", "99",
                                            "-sm", "tensor", "-lv", "4"),
                              env=tool_env, capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, "split mode tensor ran an any-precision file"
        if "split mode \"tensor\" cannot" in out:
            break
    assert "any-precision (APQ)" in out and "--split-mode layer" in out, out[-3000:]


def test_llama_cpp_python_apq_bits(apq_file, tmp_path):
    pytest.importorskip("llama_cpp")
    from ggml_ext.llama_cpp_glue import Llama, set_apq_bits
    with pytest.raises(ValueError, match="serves 3 to 8 bits"):
        Llama(apq_file, apq_bits=2)
    ids = [1, 504, 3458, 314, 4649, 282]
    try:
        got = Llama(apq_file, apq_bits=3, n_ctx=64, n_threads=2, logits_all=True)
        got.eval(ids)
        lg = np.array(got.scores[:len(ids)])
        ref = Llama(X.extract(apq_file, 3, tmp_path / "x3.gguf", type="f32"), n_ctx=64, n_threads=2,
                    logits_all=True)
        ref.eval(ids)
        want = np.array(ref.scores[:len(ids)])
        top = Llama(apq_file, apq_bits=8, n_ctx=64, n_threads=2, logits_all=True)
        top.eval(ids)
        lg8 = np.array(top.scores[:len(ids)])
    finally:
        set_apq_bits(None)
    # the same weights, other kernels: the op's GEMV (per token, F32 activations) against ggml's F32 matmul.
    # This small model amplifies kernel differences in its attention (the first position, which attends only
    # to itself, agrees exactly): measured max |diff| / max |logit| 0.0 on an AVX2 host, 4.8e-3 on an AVX-512
    # host (2026-11-24, where the same 3-bit values as F16 vs F32 files differ by 1.2e-2) -- kernel noise,
    # far below what a wrong precision does: 3 vs 8 bits differ by ~1 (checked next)
    err = np.abs(lg - want).max()
    assert err <= 1e-2 * np.abs(want).max(), err
    assert np.abs(lg8 - want).max() >= 30 * max(err, 1e-3 * np.abs(want).max()), "apq_bits=3 did not select 3 bits"


def test_two_contexts_of_one_process_keep_their_precisions(apq_file):
    """Precision per context (patch 0312): a Llama keeps the precision in effect when it was made, whatever
    is set later in the process (another Llama's apq_bits, set_apq_bits)."""
    pytest.importorskip("llama_cpp")
    from ggml_ext.llama_cpp_glue import Llama, set_apq_bits
    ids = [1, 504, 3458, 314, 4649, 282]

    def run(llm):
        llm.reset()
        llm.eval(ids)
        return np.array(llm.scores[:len(ids)])

    try:
        a3 = Llama(apq_file, apq_bits=3, n_ctx=64, n_threads=2, logits_all=True)
        first = run(a3)
        a8 = Llama(apq_file, apq_bits=8, n_ctx=64, n_threads=2, logits_all=True)   # the process is at 8 now
        lg8 = run(a8)
        again = run(a3)
        set_apq_bits(5)
        again5 = run(a3)
        lg8_again = run(a8)
    finally:
        set_apq_bits(None)
    assert np.array_equal(first, again) and np.array_equal(first, again5)
    assert np.array_equal(lg8, lg8_again)
    assert np.abs(lg8 - first).max() > 0.1 * np.abs(lg8).max(), "the two contexts ran at one precision"


def test_bench_runs_each_precision(apq_file, threads):
    from ggml_ext.bench import split_apq_bits
    assert split_apq_bits(["--apq-bits", "3,8", "-m", "F", "--", "-n", "4"]) == ([3, 8], ["-m", "F", "-n", "4"])
    assert split_apq_bits(["--apq-bits=5"]) == ([5], [])
    out = subprocess.run([sys.executable, "-m", "ggml_ext.cli", "bench", "--apq-bits", "3,8", "-m", str(apq_file),
                          "-p", "0", "-n", "4", "-r", "1", "-t", str(threads), "-o", "md"],
                         capture_output=True, text=True, env=tools.tool_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("# --apq-bits") == 2 and out.stdout.count("tg4") == 2, out.stdout


def test_bench_sweep_prints_speed_and_perplexity_per_precision(apq_file, wiki_test, threads, tmp_path):
    """`ggml-ext bench --apq-bits ... --ppl TEXT`: one table of bytes read, tokens/s and perplexity per precision;
    `all` is every precision the file serves; a precision it does not serve is refused before any run."""
    base = [sys.executable, "-m", "ggml_ext.cli", "bench"]
    tail = ["-m", str(apq_file), "-p", "0", "-n", "4", "-r", "1", "-t", str(threads), "-o", "md"]
    out = subprocess.run([*base, "--apq-bits", "3,8", "--ppl", str(wiki_test), "--ppl-ctx", "128", "--ppl-chunks", "2",
                          "--json", str(tmp_path / "sweep.json"), *tail],
                         capture_output=True, text=True, env=tools.tool_env())
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["bits"] for r in rows] == [3, 8], rows
    for r in rows:
        assert list(r["tokens_per_s"]) == [f"tg4 t{threads}"] and r["tokens_per_s"][f"tg4 t{threads}"] > 0, r
    assert rows[0]["bytes_read"] < rows[1]["bytes_read"] and rows[0]["bits_per_weight"] < rows[1]["bits_per_weight"]
    # the sweep's perplexity is the tool's at that precision (same windows), and 3 bits is the worse one
    want = [tools.perplexity(apq_file, wiki_test, n_ctx=128, chunks=2, apq_bits=b).ppl for b in (3, 8)]
    assert [r["perplexity"] for r in rows] == pytest.approx(want, rel=1e-6)
    assert rows[0]["perplexity"] > rows[1]["perplexity"]
    assert "| 3 |" in out.stdout and "| 8 |" in out.stdout and "perplexity" in out.stdout, out.stdout

    out = subprocess.run([*base, "--apq-bits", "all", "--json", str(tmp_path / "all.json"), *tail],
                         capture_output=True, text=True, env=tools.tool_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert [r["bits"] for r in json.loads((tmp_path / "all.json").read_text())] == [3, 4, 5, 6, 7, 8]

    out = subprocess.run([*base, "--apq-bits", "2,8", "--ppl", str(wiki_test), *tail],
                         capture_output=True, text=True, env=tools.tool_env())
    assert out.returncode != 0 and "serves precisions 3..8, not [2]" in out.stderr, out.stderr
    assert "llama-bench" not in out.stderr


def _complete(url: str, **fields) -> dict:
    body = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0, "n_probs": 4, "seed": 0,
            **fields}
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _answer(r: dict) -> tuple[str, list[float]]:
    """The text and every returned log-probability (chosen and top tokens) of a /completion answer."""
    probs = [p["logprob"] for step in r["completion_probabilities"] for p in [step, *step["top_logprobs"]]]
    return r["content"], probs


def _same(got, want):
    return got[0] == want[0] and len(got[1]) == len(want[1]) and max(
        abs(a - b) for a, b in zip(got[1], want[1])) <= 1e-4


def test_server_serves_each_request_at_its_precision(apq_file, threads, tmp_path):
    from ggml_ext import serve

    def start(extra, name):
        log = open(tmp_path / name, "w")
        proc, url = serve.start(apq_file, port=0, ctx_size=512, log=log,
                                extra=["-t", str(threads), "-np", "2", "--no-webui", *extra])
        return proc, url, log

    want = {}
    for bits in (3, 8):  # one server per precision, the process-wide --apq-bits: the reference
        proc, url, log = start(["--apq-bits", str(bits)], f"ref{bits}.log")
        try:
            want[bits] = _answer(_complete(url))
        finally:
            serve.stop(proc)
            log.close()
    assert want[3][1][0] != pytest.approx(want[8][1][0], abs=1e-3), "3 and 8 bits should not agree"

    proc, url, log = start([], "server.log")
    try:
        # one after another on the same prompt: the 8-bit request must not reuse the 3-bit request's KV
        for bits in (3, 8, 3):
            assert _same(_answer(_complete(url, apq_bits=bits)), want[bits]), bits
        assert _same(_answer(_complete(url)), want[8])  # no field: the server's precision (the parent)
        # two precisions at once on two slots: never one batch
        got = {}
        workers = [threading.Thread(target=lambda b=b: got.__setitem__(b, _answer(_complete(url, apq_bits=b))))
                   for b in (3, 8)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert _same(got[3], want[3]) and _same(got[8], want[8])
        for bad, msg in ((2, "serve 3 to 8 bits"), ("8", "must be an integer")):
            with pytest.raises(urllib.error.HTTPError) as e:
                _complete(url, apq_bits=bad)
            assert e.value.code == 400 and msg in e.value.read().decode(), bad
        # the OpenAI-style endpoint takes the field too
        chat = urllib.request.Request(url + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                                      data=json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                                                       "max_tokens": 2, "apq_bits": 9}).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(chat, timeout=300)
        assert e.value.code == 400 and "serve 3 to 8 bits" in e.value.read().decode()
        assert proc.poll() is None and _same(_answer(_complete(url, apq_bits=3)), want[3])
    finally:
        serve.stop(proc)
        log.close()
