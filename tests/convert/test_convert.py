"""`ggml-ext convert` on the default model (SmolLM2-135M-Instruct, float32 HF folder):
next-token logits and perplexity against transformers, the verb, the Python API, atomic output.

Tolerances (measured on this model, with margin; its logits have a standard
deviation of about 7): f16 file, logits within 0.15 of transformers' float32
logits at every position of the prompts (measured: 0.055), mean difference below
0.03 (0.012), top-1 token agreeing at >= 98% of positions (100%) and at every
prompt's last position; q8_0 within 2.0 (1.36), mean below 0.4 (0.28), top-1 >= 85%
(94%): Q8_0 weights and llama.cpp's Q8_0 activations in the dot products add up
over 30 layers. Perplexity over the
same windows (n_ctx 256, 4 chunks, second half of each scored: 508 tokens) within
1% of transformers' for f16 and 3% for q8_0.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import convert_support as cs
from ggml_ext import tools

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived",
    "Photosynthesis is the process by which green plants",
]


@pytest.fixture(scope="module")
def hf_model():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    m = AutoModelForCausalLM.from_pretrained(cs.default_hf(), dtype=torch.float32)
    m.eval()
    return m, AutoTokenizer.from_pretrained(cs.default_hf())


def _hf_logits(hf_model, ids):
    import torch
    m, _ = hf_model
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("out_type,max_abs,max_mean,min_top1", [("f16", 0.15, 0.03, 0.98), ("q8_0", 2.0, 0.4, 0.85)])
def test_logits_match_transformers(hf_model, out_type, max_abs, max_mean, min_top1):
    path = cs.default_converted(out_type)
    _, tok = hf_model
    worst, agree, total, sum_abs, n_abs = 0.0, 0, 0, 0.0, 0
    all_ids = [tok.encode(prompt, add_special_tokens=False) for prompt in PROMPTS]
    for prompt, ids, got in zip(PROMPTS, all_ids, cs.gguf_logits_many(path, all_ids)):
        ref = _hf_logits(hf_model, ids)
        assert got.shape == ref.shape
        worst = max(worst, float(np.abs(ref - got).max()))
        sum_abs += float(np.abs(ref - got).sum())
        n_abs += ref.size
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        total += len(ids)
        if out_type == "f16":
            assert ref[-1].argmax() == got[-1].argmax(), f"next token differs for {prompt!r}"
    assert worst < max_abs, f"{out_type}: max |logit difference| {worst:.4f}"
    assert sum_abs / n_abs < max_mean, f"{out_type}: mean |logit difference| {sum_abs / n_abs:.4f}"
    assert agree / total >= min_top1, f"{out_type}: top-1 agreement {agree}/{total}"


def _hf_perplexity(hf_model, tokens: list[int], n_ctx: int, chunks: int) -> tuple[float, int]:
    """llama-perplexity's method: windows of n_ctx tokens, the second half of each scored."""
    import torch
    m, _ = hf_model
    first = n_ctx // 2
    nll, count = 0.0, 0
    for c in range(chunks):
        window = tokens[c * n_ctx:(c + 1) * n_ctx]
        with torch.no_grad():
            logits = m(torch.tensor([window])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        for pos in range(first, n_ctx - 1):
            nll -= float(logp[pos, window[pos + 1]])
            count += 1
    return math.exp(nll / count), count


def test_perplexity_matches_transformers(hf_model, wiki_test, threads):
    n_ctx, chunks = 256, 4
    text = wiki_test.read_text(encoding="utf-8")[:40_000]  # llama-perplexity reads the whole file; 40k chars > 4 windows
    _, tok = hf_model
    hf_tokens = tok.encode(text, add_special_tokens=False)  # SmolLM2 adds no BOS, nor does llama-perplexity here
    from ggml_ext.llama_cpp_glue import Llama
    vocab = Llama(str(cs.default_converted("f16")), vocab_only=True, verbose=False)
    ours_tokens = vocab.tokenize(text.encode(), add_bos=True, special=False)
    assert ours_tokens[: n_ctx * chunks] == hf_tokens[: n_ctx * chunks], "same windows on both sides"
    ref, scored = _hf_perplexity(hf_model, hf_tokens, n_ctx, chunks)
    for out_type, rel in (("f16", 0.01), ("q8_0", 0.03)):
        p = tools.perplexity(cs.default_converted(out_type), wiki_test, n_ctx=n_ctx, chunks=chunks, threads=threads)
        assert p.n_tokens_scored == scored == chunks * (n_ctx - 1 - n_ctx // 2)
        assert abs(p.ppl - ref) / ref < rel, f"{out_type}: llama.cpp PPL {p.ppl:.4f} vs transformers {ref:.4f}"


def test_metadata_and_types_of_the_default_model():
    from ggml_ext import quants
    from ggml_ext.gguf import read_gguf
    g = read_gguf(cs.default_converted("q8_0"))
    kv = g.kv
    assert kv["general.architecture"] == "llama" and kv["general.file_type"] == 7
    assert kv["general.quantization_version"] == 2
    assert kv["ggml_ext.format_version"] == quants.format_version() == 1
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "gpt-2"  # see python/ggml_ext/converters/vocab.py
    assert kv["tokenizer.ggml.bos_token_id"] == 1 and kv["tokenizer.ggml.eos_token_id"] == 2
    assert kv["tokenizer.ggml.add_bos_token"] is False
    assert "<|im_start|>" in kv["tokenizer.chat_template"]
    assert kv["llama.rope.freq_base"] == 100000.0 and kv["llama.attention.head_count_kv"] == 3
    types = {t.name: t.type_name for t in g.tensors}
    assert "output.weight" not in types, "tied embeddings: no output tensor"
    assert types["token_embd.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "Q8_0"
    assert types["blk.0.attn_norm.weight"] == "F32" and types["output_norm.weight"] == "F32"
    # the source hash is recomputable from the folder
    from ggml_ext.converters.source import Checkpoint
    assert kv["ggml_ext.source_hash"] == Checkpoint(cs.default_hf()).source_hash()


def ggml_ext_cli(*args, timeout=300, **kw):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "ggml_ext.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env, **kw)


def test_cli_verb_writes_atomically_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "m.gguf"
    r = ggml_ext_cli("convert", cs.default_hf(), "-o", out, "--type", "q4_0", "-q")
    assert r.returncode == 0, r.stderr
    assert "q4_0" in r.stdout and out.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"], "no temp file left"
    before = out.stat().st_mtime_ns
    r = ggml_ext_cli("convert", cs.default_hf(), "-o", out, "--type", "q4_0", "-q")
    assert r.returncode == 1 and "exists" in r.stderr and "--force" in r.stderr
    assert out.stat().st_mtime_ns == before
    r = ggml_ext_cli("convert", cs.default_hf(), "-o", out, "--type", "q4_1", "--force", "-q",
                     "--keep", "blk.*.ffn_down.weight=q8_0")
    assert r.returncode == 0, r.stderr
    from ggml_ext.gguf import read_gguf
    g = read_gguf(out)
    types = {t.name: t.type_name for t in g.tensors}
    assert g.kv["general.file_type"] == 3
    assert types["blk.3.ffn_down.weight"] == "Q8_0" and types["blk.3.ffn_up.weight"] == "Q4_1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_interrupt_leaves_no_file(tmp_path):
    out = tmp_path / "m.gguf"
    proc = subprocess.Popen([sys.executable, "-m", "ggml_ext.cli", "convert", str(cs.default_hf()), "-o", str(out),
                             "--type", "f32"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=cs.default_sigint)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):
        time.sleep(0.02)  # wait until it is writing
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert list(tmp_path.iterdir()) == [], "neither output nor temp file after an interrupt"


def test_python_api_and_progress(tmp_path):
    import ggml_ext
    seen = []
    r = ggml_ext.convert(cs.default_hf(), tmp_path / "v.gguf", "bf16", vocab_only=True,
                         progress=lambda d, t, n: seen.append((d, t)))
    assert r.n_tensors == 0 and r.tokenizer_pre == "gpt-2" and seen == []
    from ggml_ext.converters import convert
    r = convert(cs.tiny("llama"), tmp_path / "t.gguf", "bf16", progress=lambda d, t, n: seen.append((d, t)))
    assert r.type_counts == {"BF16": 15, "F32": 5}  # 2 layers x 7 matrices + embedding; 5 norms
    assert seen[-1][0] == seen[-1][1] and all(a[0] < b[0] for a, b in zip(seen, seen[1:]))


def test_options_value_keywords_and_cli_flags_write_the_same_file(tmp_path):
    """One conversion asked three ways -- a ConvertOptions value, the keyword form (which builds one) and
    the verb's flags (which build one too) -- writes byte-identical files; a keyword that is no option is a
    TypeError, as an unknown keyword argument always was."""
    import argparse
    from ggml_ext import convert as verb
    from ggml_ext.converters import ConvertOptions, convert
    keep = ["blk.0.ffn_down.weight=q8_0"]
    a = convert(cs.tiny("llama"), tmp_path / "a.gguf",
                options=ConvertOptions(type="q4_0", keep=keep, name="tiny", threads=1))
    b = convert(cs.tiny("llama"), tmp_path / "b.gguf", "q4_0", keep=keep, name="tiny", threads=1)
    p = argparse.ArgumentParser()
    verb.add_arguments(p)
    args = p.parse_args([str(cs.tiny("llama")), "-o", str(tmp_path / "c.gguf"), "--type", "q4_0", "--keep", keep[0],
                         "--name", "tiny", "-t", "1", "-q"])
    assert verb.options(args) == ConvertOptions(type="q4_0", keep=keep, name="tiny", threads=1, calib_progress=False,
                                                method_options={})
    assert verb.main(args) == 0
    data = [(tmp_path / f"{n}.gguf").read_bytes() for n in "abc"]
    assert data[0] == data[1] == data[2] and a.type_counts == b.type_counts
    assert ConvertOptions(type="q4_0").replace(method="rtn").method == "rtn"
    with pytest.raises(TypeError):
        convert(cs.tiny("llama"), tmp_path / "d.gguf", "q4_0", no_such_option=1)
    assert not (tmp_path / "d.gguf").exists()
