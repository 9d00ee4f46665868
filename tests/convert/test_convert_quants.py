"""Our quantized bytes are llama-quantize's bytes, and the type policy is llama.cpp's.

The converter writes every type through ``ggml_ext.quants`` (ctypes on our
libggml-base's ``ggml_quantize_chunk``). For each output type, our file must equal,
tensor for tensor (name, type, shape, bytes), what our ``llama-quantize`` makes of
our float32 conversion of the same model: on the default model (tied embedding:
Q8_0, its 576-wide rows do not fit Q6_K) and on a tiny untied model with 256-wide
rows (``output.weight`` becomes Q6_K).
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

import convert_support as cs
from ggml_ext import quants, tools
from ggml_ext.converters import ConversionError, convert
from ggml_ext.converters.policy import choose_type, parse_keep

QUANT_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]


def _llama_quantize(src, dst, type_name):
    r = subprocess.run(tools.command("llama-quantize", src, dst, type_name.upper(), "2"), env=tools.tool_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def _untied_256():
    return cs.tiny("llama", tokenizer="llama-spm", hidden_size=256, intermediate_size=512, tie_word_embeddings=False)


@pytest.mark.parametrize("model", ["default", "untied-256"])
def test_bit_identical_to_llama_quantize(model, tmp_path):
    folder = cs.default_hf() if model == "default" else _untied_256()
    f32 = cs.default_converted("f32") if model == "default" else tmp_path / "f32.gguf"
    if model != "default":
        convert(folder, f32, "f32")
    for t in QUANT_TYPES:
        ours = tmp_path / f"ours-{t}.gguf"
        ref = tmp_path / f"ref-{t}.gguf"
        convert(folder, ours, t)
        _llama_quantize(f32, ref, t)
        a, b = cs.read_tensor_bytes(ours), cs.read_tensor_bytes(ref)
        assert a.keys() == b.keys()
        for name in a:
            assert a[name][:2] == b[name][:2], f"{t}: {name} is {a[name][:2]} here, {b[name][:2]} from llama-quantize"
            assert a[name][2] == b[name][2], f"{t}: bytes of {name} differ"
        types = {n: v[0] for n, v in a.items()}
        if model == "default":
            assert types["token_embd.weight"] == "Q8_0"  # tied, 576 % 256 != 0: Q6_K falls back to Q8_0
        else:
            assert types["output.weight"] == ("Q8_0" if t == "q8_0" else "Q6_K")
            assert types["token_embd.weight"] == t.upper()
        ours.unlink()
        ref.unlink()


def test_policy_table():
    f = choose_type
    assert f("blk.0.attn_norm.weight", (64,), "q4_0", has_output=True) == "F32"
    assert f("blk.0.attn_q.bias", (64,), "q4_0", has_output=True) == "F32"
    assert f("blk.0.attn_q_norm.weight", (64,), "f16", has_output=True) == "F32"
    assert f("blk.0.attn_q.weight", (64, 64), "f16", has_output=True) == "F16"
    assert f("token_embd.weight", (576, 10), "q4_1", has_output=False) == "Q8_0"
    assert f("token_embd.weight", (512, 10), "q4_1", has_output=False) == "Q6_K"
    assert f("token_embd.weight", (512, 10), "q4_1", has_output=True) == "Q4_1"
    assert f("output.weight", (512, 10), "q8_0", has_output=True) == "Q8_0"
    assert f("blk.0.ffn_down.weight", (48, 64), "q5_0", has_output=True) == "F16"  # 48 % 32: llama.cpp's fallback
    keep = (parse_keep("blk.*.ffn_down.weight=q8_0"), parse_keep("blk.0.*=f32"))
    assert f("blk.3.ffn_down.weight", (64, 64), "q4_0", has_output=True, keep=keep) == "Q8_0"
    assert f("blk.0.attn_v.weight", (64, 64), "q4_0", has_output=True, keep=keep) == "F32"
    assert f("blk.0.attn_norm.weight", (64,), "q4_0", has_output=True, keep=keep) == "F32"
    with pytest.raises(ConversionError, match="PATTERN=TYPE"):
        parse_keep("blk.0.attn_v.weight")
    with pytest.raises(ConversionError, match="unknown type"):
        parse_keep("x=q3_0")
    with pytest.raises(ConversionError, match="not a multiple"):
        f("blk.0.attn_v.weight", (64, 64), "q4_0", has_output=True, keep=(parse_keep("*=q6_k"),))


def test_keep_pattern_matching_nothing_is_an_error(tmp_path):
    with pytest.raises(ConversionError, match="matches no weight matrix"):
        convert(cs.tiny("llama"), tmp_path / "x.gguf", "q4_0", keep=["blk.*.attn_vv.weight=q8_0"])
    assert not (tmp_path / "x.gguf").exists()


def test_quants_binding():
    assert quants.blck_size("Q4_0") == 32 and quants.type_size("Q4_0") == 18
    assert quants.row_size("Q8_0", 64) == 68 and quants.row_size("F16", 7) == 14
    assert quants.type_name("q5_1") == "q5_1" and quants.format_version() == 1
    rng = np.random.default_rng(0)
    w = rng.standard_normal((37, 256)).astype(np.float32)
    one = quants.quantize(w, "Q4_K", threads=1)
    many = quants.quantize(w, "Q4_K", threads=4)
    assert np.array_equal(one, many), "rows are independent: the split over threads does not matter"
    assert quants.validate("Q4_K", one)
    assert np.array_equal(quants.quantize(w, "F16").view(np.float16), w.astype(np.float16))
    q8 = quants.quantize(w[:1, :32], "Q8_0")[0]
    d = q8[:2].view(np.float16)[0]
    assert np.allclose(q8[2:].view(np.int8) * np.float32(d), w[0, :32], atol=float(d))  # Q8_0: q * d
    with pytest.raises(quants.QuantError, match="whole number"):
        quants.quantize(w[:, :100], "Q8_0")
    with pytest.raises(quants.QuantError):
        quants.quantize(w, "Q4_0_4_4")
