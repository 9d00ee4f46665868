"""Interleaved IQ4_NL (types 36-38) as GGUF file types, end to end through our llama.cpp.

The default model is converted to IQ4_NL by our converter; `ggml-ext repack` turns its
matrices into each interleaved layout and back (bytes identical); `convert --type
iq4_nl_8_8` writes exactly the repacked bytes; our llama.cpp answers the chat prompt
from the IQ4_NL_8_8 file and its logits stay as close to the plain IQ4_NL file's as
stock llama.cpp's own two IQ4_NL paths are to each other; a file whose row count does
not divide by N is refused. ggml graph comparisons (interleaved vs plain IQ4_NL,
1-33 rows, 1-4 threads) run in tests/c/test_interleaved4_mul_mat.c
(test_interleaved4_q4_0_gguf.py::test_cpu_mul_mat_hook_agrees_with_plain_q4_0).
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

import q4_0_probe
from ggml_ext import quants, repack
from ggml_ext.gguf import GGUFError, read_gguf
from ggml_ext.converters import ConversionError
from ggml_ext.converters.policy import choose_type, parse_keep

LAYOUTS = {"4x4": "IQ4_NL_4_4", "4x8": "IQ4_NL_4_8", "8x8": "IQ4_NL_8_8"}
ROWS = {"IQ4_NL_4_4": 4, "IQ4_NL_4_8": 4, "IQ4_NL_8_8": 8}
IDS = {"IQ4_NL_4_4": 36, "IQ4_NL_4_8": 37, "IQ4_NL_8_8": 38}


# ---------------------------------------------------------------- registration and quantizer

@pytest.mark.parametrize("name", sorted(ROWS))
def test_types_are_registered_in_our_ggml(name):
    tid = quants.type_id(name)
    assert tid == IDS[name]
    assert (quants.blck_size(tid), quants.type_size(tid)) == (32, 18)
    assert quants.type_name(tid) == name.lower().replace("nl_4_4", "nl_4x4").replace("nl_4_8", "nl_4x8") \
        .replace("nl_8_8", "nl_8x8")


@pytest.mark.parametrize("name", sorted(ROWS))
def test_quantize_chunk_equals_repacked_iq4_nl(name):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((24, 96), dtype=np.float32)
    imatrix = rng.uniform(0.1, 4.0, 96).astype(np.float32)
    for im in (None, imatrix):
        plain = quants.quantize(w, "IQ4_NL", imatrix=im)
        inter = quants.quantize(w, name, imatrix=im, threads=3)  # pieces of whole row groups
        assert inter.tobytes() == quants.repack_iq4_nl(name, plain, 24, 96).tobytes()
        assert quants.unpack_iq4_nl(name, inter, 24, 96).tobytes() == plain.tobytes()
        # no XOR: the interleaved bytes are a permutation of the plain ones
        assert sorted(inter.tobytes()) == sorted(plain.tobytes())
    # the importance matrix reaches the quantizer
    assert quants.quantize(w, name, imatrix=imatrix).tobytes() != quants.quantize(w, name).tobytes()
    assert quants.validate(name, inter)
    bad = inter.copy().reshape(-1)
    bad[0:2] = np.frombuffer(np.float16(np.nan).tobytes(), dtype=np.uint8)
    assert not quants.validate(name, bad)


def test_quantizer_and_repack_refuse_rows_that_do_not_divide():
    w = np.ones((12, 64), dtype=np.float32)
    quants.quantize(w, "IQ4_NL_4_4")
    with pytest.raises(quants.QuantError, match="divisible by 8"):
        quants.quantize(w, "IQ4_NL_8_8")
    with pytest.raises(quants.QuantError, match="divisible by 8"):
        quants.repack_iq4_nl("IQ4_NL_8_8", quants.quantize(w, "IQ4_NL"), 12, 64)
    with pytest.raises(quants.QuantError, match="not an interleaved IQ4_NL type"):
        quants.repack_iq4_nl("Q4_0_8_8", quants.quantize(w, "IQ4_NL"), 12, 64)


def test_policy_interleaves_block_matrices_only():
    kw = dict(has_output=False)
    assert choose_type("blk.0.attn_q.weight", (576, 576), "iq4_nl_8_8", **kw) == "IQ4_NL_8_8"
    assert choose_type("blk.0.ffn_up.weight", (576, 1536), "iq4_nl_4_8", **kw) == "IQ4_NL_4_8"
    assert choose_type("blk.0.ffn_up.weight", (576, 1540), "iq4_nl_8_8", **kw) == "IQ4_NL"
    assert choose_type("token_embd.weight", (576, 49152), "iq4_nl_8_8", **kw) == choose_type(
        "token_embd.weight", (576, 49152), "iq4_nl", **kw)
    assert choose_type("token_embd.weight", (512, 49152), "iq4_nl_8_8", has_output=True) == "IQ4_NL"
    with pytest.raises(ConversionError, match="divides by 8"):
        choose_type("blk.0.ffn_up.weight", (576, 1540), "iq4_nl", keep=(parse_keep("blk.*=iq4_nl_8_8"),), **kw)


def test_loader_refuses_rows_that_do_not_divide(tmp_path):
    """A hostile file: type 38 on a 12-row matrix."""
    from ggml_ext.gguf import GGUFWriter
    from ggml_ext.llama_cpp_glue import Llama
    path = tmp_path / "bad-rows.gguf"
    w = GGUFWriter(path)
    w.add("general.architecture", "str", "llama")
    data = quants.quantize(np.ones((12, 64), dtype=np.float32), "IQ4_NL")
    w.add_tensor_info("blk.0.attn_q.weight", (64, 12), quants.type_id("IQ4_NL_8_8"), data.nbytes)
    with w:
        w.write_tensor(data.reshape(-1))
    with pytest.raises(GGUFError, match="divisible by 8|row"):
        read_gguf(path)
    with pytest.raises(ValueError):
        Llama(path, n_ctx=64)
    from ggml_ext import tools
    proc = subprocess.run(tools.command("llama-cli", "-m", path, "-p", "hi", "-n", "1", "-st", "--no-warmup"),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "interleaved IQ4_NL type needs a row count (ne[1]) divisible by 8" in proc.stdout + proc.stderr


# ---------------------------------------------------------------- the default model, end to end

@pytest.fixture(scope="module")
def files(iq4_nl_files):
    return iq4_nl_files


@pytest.mark.parametrize("name", sorted(ROWS))
def test_repack_round_trips_to_the_same_bytes(files, name, tmp_path):
    src = read_gguf(files["iq4_nl"])
    dst = read_gguf(files[name])
    assert [(t.name, t.shape, t.offset, t.nbytes) for t in src.tensors] == \
           [(t.name, t.shape, t.offset, t.nbytes) for t in dst.tensors]
    for a, b in zip(src.tensors, dst.tensors):
        if a.name.startswith("blk.") and a.type_name == "IQ4_NL":
            assert b.type_name == name
        else:
            assert b.type_name == a.type_name, a.name
    assert src.kv["general.file_type"] == dst.kv["general.file_type"] == 25
    back = tmp_path / "back.gguf"
    repack.repack(files[name], back, "iq4_nl")
    assert back.read_bytes() == files["iq4_nl"].read_bytes()
    # --layout q4_0 leaves interleaved IQ4_NL alone
    other = tmp_path / "other.gguf"
    assert not repack.repack(files[name], other, "q4_0").converted


@pytest.mark.parametrize("name", sorted(ROWS))
def test_repack_from_one_interleaved_layout_to_another(files, name, tmp_path):
    """An interleaved IQ4_NL file repacked into another layout is the plain file repacked into it, byte for byte."""
    src = "IQ4_NL_8_8" if name != "IQ4_NL_8_8" else "IQ4_NL_4_4"
    layout = {v: k for k, v in LAYOUTS.items()}[name]
    out = tmp_path / "relaid.gguf"
    r = repack.repack(files[src], out, layout)
    assert r.converted and not r.kept
    assert out.read_bytes() == files[name].read_bytes()


def test_convert_type_iq4_nl_8_8_writes_the_repacked_bytes(files, tmp_path):
    import ggml_ext
    from ggml_ext import assets
    out = tmp_path / "smollm2-iq4_nl_8_8-convert.gguf"
    ggml_ext.convert(assets.path("smollm2-hf"), out, "iq4_nl_8_8")
    assert out.read_bytes() == files["IQ4_NL_8_8"].read_bytes()


@pytest.fixture(scope="module")
def reference(files, threads, tmp_path_factory):
    """Plain IQ4_NL through upstream's code: greedy tokens and the logits along them with stock
    llama.cpp's runtime repack (x86 AVX2: upstream's IQ4_NL 8x8 kernels) and without it (plain
    vec_dot); tests/q4_0_probe.py."""
    return q4_0_probe.stock_reference(files["iq4_nl"], threads, tmp_path_factory.mktemp("iq4_nl-reference"))


@pytest.mark.parametrize("name", sorted(ROWS))
def test_logits_along_the_greedy_tokens_match_iq4_nl(files, reference, threads, name, tmp_path):
    ours = q4_0_probe.run(files[name], threads, tmp_path, seq=reference["seq"])["logits"][reference["at"]]
    q4_0_probe.assert_close_to_stock(ours, reference, name)


def test_iq4_nl_8_8_answers_the_chat_prompt(files, tool_env, threads):
    from ggml_ext import tools
    proc = subprocess.run(
        tools.command("llama-cli", "-m", files["IQ4_NL_8_8"], "-p",
                      "What is the capital of France? Answer in one sentence.", "-st", "-n", "24", "--temp", "0",
                      "--seed", "0", "-c", "512", "-t", str(threads)),
        env=tool_env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Paris" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
