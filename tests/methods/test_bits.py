"""`ggml-ext bits`: the K-OOC bit family (quant, flag, mark bits per weight; A_max, A_lim) of real GGUF files.

On the default model (stock Q4_1 blocks, Q8_0 embedding) and, when fetched, Gemma-3-270M's stock
Q4_K_M file (Q4_K, Q6_K, ...): every tensor's B + F + M equals its stored bytes per weight, the file's
total equals the file's tensor bytes, the splits are the types' layouts (Q4_1: 4 + 32/32, Q4_K: 4 +
128/256, Q6_K: 6 + 144/256), and the CLI prints them.
"""
from __future__ import annotations

import json

import pytest

from ggml_ext import assets, bits, cli
from ggml_ext.gguf.reader import read_gguf

SPLIT = {"Q4_1": (4, 1.0), "Q8_0": (8, 0.5), "Q4_K": (4, 0.5), "Q6_K": (6, 0.5625), "Q5_0": (5, 0.5),
         "F32": (32, 0.0)}


def _check(path):
    g = read_gguf(path)
    fb = bits.file_bits(g)
    assert len(fb.tensors) == len(g.tensors)
    for r, t in zip(fb.tensors, g.tensors):
        assert r.quant is not None, r
        assert r.quant + r.flag + r.mark == pytest.approx(t.nbytes * 8 / t.n_elements), r.name
        assert r.a_max == r.a_lim  # ggml's blocks: nothing paid per row or per matrix
        if r.type_name in SPLIT:
            assert (r.quant, r.flag) == pytest.approx(SPLIT[r.type_name]), r.name
    assert fb.a_total == pytest.approx(g.tensor_bytes * 8 / g.n_weights)
    assert fb.a_max == max(r.a_max for r in fb.tensors if r.quantized)
    return fb


def test_bits_of_the_default_model(default_gguf, capsys):
    fb = _check(default_gguf)
    types = {r.type_name for r in fb.tensors}
    assert {"Q4_1", "Q8_0", "F32"} <= types
    assert fb.a_max == 8.5 and 5.0 < fb.a_lim < 8.5   # Q8_0 embedding the worst, Q4_1 blocks the most
    assert cli.main(["bits", str(default_gguf)]) == 0
    out = capsys.readouterr().out
    assert "blk.0.attn_q.weight" in out and "A_lim" in out
    assert cli.main(["bits", "--total", "--json", str(default_gguf)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["a_lim"] == pytest.approx(fb.a_lim) and "tensors" not in d


def test_bits_of_a_k_quant_mix():
    try:
        path = assets.path("gemma3-270m-gguf")
    except Exception as e:  # optional asset, fetched by `ggml-ext assets fetch`
        pytest.skip(f"Gemma-3-270M not available: {e}")
    fb = _check(path)
    assert {"Q4_K", "Q6_K"} <= {r.type_name for r in fb.tensors}


def test_bits_refuses_a_non_gguf(tmp_path, capsys):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"not a gguf file at all")
    assert cli.main(["bits", str(p)]) == 1
    assert "x.gguf" in capsys.readouterr().err
