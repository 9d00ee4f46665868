"""`ggml-ext convert --type iq4_nl` (ggml-ext's IQ4_NL quantizer) and `--imatrix`, end to end.

The default model converted to iq4_nl has llama-quantize's IQ4_NL mix tensor for tensor
(file_type 25), runs in llama-cpp-python and answers the France prompt, and our
llama-perplexity scores it like the file our llama-quantize --type IQ4_NL makes from the
f16 GGUF (plain IQ4_NL is stock type 20: our build reads it with stock code). An imatrix
made by `ggml-ext imatrix` from a small text (GGUF, and llama-imatrix's legacy .dat)
loads, changes the mix as llama-quantize's does, and converts to a working model; bad
imatrix files are refused with a clear error and no output.
"""
from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggml_ext import assets, tools
from ggml_ext.calibrate import imatrix
from ggml_ext.gguf import read_gguf
from ggml_ext.converters import ConversionError, convert
from ggml_ext.llama_cpp_glue import Llama

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from default_models import default_model  # noqa: E402

CLI = [sys.executable, "-m", "ggml_ext.cli"]
QUESTION = "What is the capital of France? Answer in one sentence."


def types_of(path) -> dict[str, str]:
    return {t.name: t.type_name for t in read_gguf(path).tensors}


def answer(path, threads) -> str:
    llm = Llama(path, n_ctx=256, n_threads=threads, seed=0, verbose=False)
    r = llm.create_chat_completion(messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0.0)
    return r["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("iq4nl")


@pytest.fixture(scope="module")
def iq4(iq4_nl_files) -> Path:
    return iq4_nl_files["iq4_nl"]


@pytest.fixture(scope="module")
def small_text(work) -> Path:
    p = work / "calib.txt"
    p.write_text(assets.path("wiki-train").read_text(encoding="utf-8")[:6000], encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def im_file(work, small_text, threads) -> Path:
    out = work / "smol.imatrix"
    r = subprocess.run([*CLI, "imatrix", str(default_model("f16")), "--text", str(small_text), "-o", str(out),
                        "--chunks", "2", "-c", "256", "-t", str(threads)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "2 chunks of 256 tokens" in r.stdout
    return out


def test_mix_and_file_type_match_llama_quantize(iq4):
    g = read_gguf(iq4)
    assert g.kv["general.file_type"] == 25
    ref = default_model("IQ4_NL")  # our llama-quantize from the f16 GGUF (ggml's quantizer)
    assert types_of(iq4) == types_of(ref)
    counts = {}
    for t in types_of(iq4).values():
        counts[t] = counts.get(t, 0) + 1
    # SmolLM2: 30 layers -> ffn_down of layers 0-2 Q5_K (n_layer/8, no imatrix); n_gqa = 3 keeps attn_v
    # IQ4_NL; the tied embedding Q8_0 (576 is not a multiple of 256)
    assert counts == {"IQ4_NL": 207, "Q5_K": 3, "Q8_0": 1, "F32": 61}


def test_answers_paris(iq4, threads):
    assert "Paris" in answer(iq4, threads)


def test_perplexity_like_llama_quantize_iq4_nl(iq4, wiki_test, threads):
    ours = tools.perplexity(iq4, wiki_test, n_ctx=512, chunks=2, threads=threads)
    ggml = tools.perplexity(default_model("IQ4_NL"), wiki_test, n_ctx=512, chunks=2, threads=threads)
    print(f"IQ4_NL ppl ours {ours.ppl:.4f} ggml {ggml.ppl:.4f}")
    assert np.isfinite(ours.ppl) and ours.ppl < 1.03 * ggml.ppl


def test_imatrix_file_loads(im_file, work, small_text, threads):
    im = imatrix.load(im_file)
    assert not im.legacy and im.chunk_count == 2
    q = im.for_tensor("blk.0.attn_q.weight", 576)
    assert q.shape == (576,) and (q >= 0).all() and q.max() > 0
    assert im.for_tensor("blk.0.ffn_down.weight", 1536).shape == (1536,)
    # llama-imatrix's legacy .dat of the same run reads to the same values
    dat = work / "smol.dat"
    r = subprocess.run(tools.command("llama-imatrix", "-m", default_model("f16"), "-f", small_text, "-o", dat,
                                     "--output-format", "dat", "--chunks", "2", "-c", "256", "--no-ppl",
                                     "-t", str(threads)), env=tools.tool_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:]
    legacy = imatrix.load(dat)
    assert legacy.legacy and set(legacy.entries) == set(im.entries)
    for name, v in im.entries.items():
        np.testing.assert_allclose(legacy.entries[name], v, rtol=1e-5, err_msg=name)


def test_convert_with_imatrix(im_file, work, threads, tool_env):
    out = work / "smol-iq4_nl-imatrix.gguf"
    r = subprocess.run([*CLI, "convert", str(assets.path("smollm2-hf")), "-o", str(out), "--type", "iq4_nl",
                        "--imatrix", str(im_file), "-q", "-t", str(threads)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # llama-quantize --imatrix's mix: ffn_down of the first layers stays IQ4_NL
    ref = work / "ref-imatrix.gguf"
    q = subprocess.run(tools.command("llama-quantize", "--imatrix", im_file, default_model("f16"), ref, "IQ4_NL",
                                     str(threads)), env=tool_env, capture_output=True, text=True)
    assert q.returncode == 0, q.stdout[-2000:] + q.stderr[-2000:]
    assert types_of(out) == types_of(ref)
    assert types_of(out)["blk.0.ffn_down.weight"] == "IQ4_NL"
    assert "Paris" in answer(out, threads)


def _legacy(path: Path, entries: dict[str, np.ndarray]) -> Path:
    b = struct.pack("<i", len(entries))
    for name, v in entries.items():
        b += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 1, v.size) + v.astype("<f4").tobytes()
    path.write_bytes(b)
    return path


@pytest.mark.parametrize("kind", ["garbage", "truncated", "wrong_length", "negative", "model_file"])
def test_bad_imatrix_refused(kind, work):
    bad = work / f"bad-{kind}.imatrix"
    if kind == "garbage":
        bad.write_bytes(b"\xff" * 100)
    elif kind == "truncated":
        _legacy(bad, {"blk.0.attn_q.weight": np.ones(576)})
        bad.write_bytes(bad.read_bytes()[:200])
    elif kind == "wrong_length":
        _legacy(bad, {"blk.0.attn_q.weight": np.ones(100)})
    elif kind == "negative":
        _legacy(bad, {"blk.0.attn_q.weight": -np.ones(576)})
    else:
        bad = default_model("Q8_0")
    out = work / f"out-{kind}.gguf"
    r = subprocess.run([*CLI, "convert", str(assets.path("smollm2-hf")), "-o", str(out), "--type", "iq4_nl",
                        "--imatrix", str(bad), "-q"], capture_output=True, text=True)
    assert r.returncode == 1
    want = {"garbage": "neither a GGUF nor a legacy imatrix", "truncated": "truncated legacy imatrix",
            "wrong_length": "blk.0.attn_q.weight has 1 x 100 values, expected 1 x 576",
            "negative": "NaN, infinite or negative", "model_file": "not 'imatrix'"}[kind]
    assert r.stderr.startswith("error:") and want in r.stderr, r.stderr
    assert not out.exists() and not list(work.glob(f"out-{kind}*"))


def test_imatrix_verb_errors(work):
    r = subprocess.run([*CLI, "imatrix", str(work / "missing.gguf"), "-o", str(work / "x.imatrix")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not found" in r.stderr
    with pytest.raises(ConversionError, match="unknown IQ4_NL weighting"):
        convert(assets.path("smollm2-hf"), work / "never.gguf", "iq4_nl", iq4_nl_weighting="cubic")
