"""The codebook types CB2 / CB3 as ggml types, end to end (docs/formats/codebooks.md):

- ggml graphs on our installed libggml (tests/c/test_codebooks_graph.c): mul_mat through the hook
  and ggml's own get_rows through the types' row-wise to_float agree with the dequantized F32
  weights, 1-33 activation rows, 1-2 planes, 1-4 threads; ids without a type read "reserved";
- the converter: the policy of the four recipes, and a too-short row falling back (with a warning);
- the default model converted with ``--type cb2`` (importance from 4 x 128 calibration tokens,
  the act-importance method; cached under the ggml-ext cache by the code's digest) holds CB2
  ``ffn_down`` matrices, IQ4_NL fallbacks, file type 100, and runs in our llama-perplexity with a
  finite perplexity above the source GGUF's and within 2.5x of it (a decoding error in a kernel
  gives hundreds).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import convert_support as cs
from ggml_ext import tools
from ggml_ext.converters.policy import choose_type

REPO = Path(__file__).resolve().parents[2]


def test_ggml_graphs_mul_mat_and_get_rows(tmp_path):
    from ggml_ext import _locate
    exe = tmp_path / "t_cb_graph"
    lib = _locate.lib_dir()
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{_locate.prefix() / 'include'}",
                    str(REPO / "tests" / "c" / "test_codebooks_graph.c"), f"-L{lib}", "-lggml", "-lggml-base",
                    "-lggml-cpu", "-lm", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("recipe,expect", [
    ("cb2", {"blk.0.ffn_down.weight": "CB2", "blk.0.attn_v.weight": "CB2", "blk.0.ffn_up.weight": "CB2"}),
    ("cb2_m", {"blk.0.ffn_down.weight": "CB3", "blk.0.attn_v.weight": "CB3", "blk.0.ffn_up.weight": "CB2"}),
    ("cb3", {"blk.0.ffn_down.weight": "CB3", "blk.0.attn_output.weight": "CB3"}),
    ("cb3_m", {"blk.0.ffn_down.weight": "Q4_K", "blk.0.attn_output.weight": "Q4_K", "blk.0.ffn_gate.weight": "CB3"}),
])
def test_recipes(recipe, expect):
    for name, t in expect.items():
        assert choose_type(name, (4096, 1024), recipe, has_output=True) == t, name
    assert choose_type("output.weight", (4096, 32000), recipe, has_output=True) == "Q6_K"
    assert choose_type("token_embd.weight", (4096, 32000), recipe, has_output=False) == "Q6_K"
    assert choose_type("blk.0.attn_norm.weight", (4096,), recipe, has_output=True) == "F32"
    # rows that are not whole 256-blocks: llama-quantize's fallbacks
    assert choose_type("blk.0.ffn_up.weight", (576, 1536), recipe, has_output=True) in ("IQ4_NL", "Q5_0")
    assert choose_type("output.weight", (576, 49152), recipe, has_output=True) == "Q8_0"


def test_keep_cb_on_a_short_row_is_refused_by_name():
    from ggml_ext.converters import ConversionError
    from ggml_ext.converters.policy import parse_keep
    rule = parse_keep("blk.*.attn_q.weight=cb2")
    assert choose_type("blk.3.attn_q.weight", (1024, 1024), "q8_0", has_output=True, keep=(rule,)) == "CB2"
    with pytest.raises(ConversionError, match=r"blk\.3\.attn_q\.weight has rows of 576 weights.*CB2's block of 256"):
        choose_type("blk.3.attn_q.weight", (576, 576), "q8_0", has_output=True, keep=(rule,))


@pytest.fixture(scope="module")
def cb2_file():
    return cs.cached_cb2_file()


def test_cb2_file_holds_codebook_and_fallback_tensors(cb2_file):
    from ggml_ext.gguf import read_gguf
    g = read_gguf(cb2_file)
    types = {t.name: t.type_name for t in g.tensors}
    assert g.kv["general.file_type"] == 100
    assert all(types[f"blk.{i}.ffn_down.weight"] == "CB2" for i in range(30)), types
    assert types["blk.0.attn_q.weight"] == "IQ4_NL" and types["token_embd.weight"] == "Q8_0"
    cb = [t for t in g.tensors if t.type_name == "CB2"]
    assert all(t.nbytes == t.n_elements // 256 * 78 for t in cb)


def test_cb2_file_runs_in_llama_perplexity(cb2_file, default_gguf, wiki_test, threads):
    p = tools.perplexity(cb2_file, wiki_test, n_ctx=256, chunks=4, threads=threads)
    ref = tools.perplexity(default_gguf, wiki_test, n_ctx=256, chunks=4, threads=threads)
    print(f"cb2 {p.ppl:.3f}, source gguf {ref.ppl:.3f}")
    assert np.isfinite(p.ppl) and ref.ppl < p.ppl < 2.5 * ref.ppl, (p.ppl, ref.ppl)
