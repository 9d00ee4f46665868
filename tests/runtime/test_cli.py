"""The ggml-ext verbs on real files: chat one-shot, perplexity, failures exit non-zero."""
from __future__ import annotations

import math
import subprocess
import sys

from ggml_ext import tools


def ggml_ext(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ggml_ext.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_chat_one_shot_streams_an_answer(default_gguf):
    r = ggml_ext("chat", default_gguf, "--prompt", "What is the capital of France? Answer in one sentence.", "-n", "24")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_chat_interactive_keeps_the_conversation(default_gguf):
    # two turns on standard input; an empty line ends the session
    turns = "What is the capital of France? Answer in one sentence.\nAnd of Germany? Answer in one sentence.\n\n"
    r = subprocess.run([sys.executable, "-m", "ggml_ext.cli", "chat", str(default_gguf), "-n", "24"], input=turns,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and "Berlin" in r.stdout


def test_chat_exits_non_zero_when_the_model_fails_to_load(tmp_path):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    r = ggml_ext("chat", bad, "--prompt", "hi")
    assert r.returncode != 0
    assert "error:" in r.stderr and "Traceback" not in r.stderr
    r = ggml_ext("chat", tmp_path / "missing.gguf", "--prompt", "hi")
    assert r.returncode != 0 and "not found" in r.stderr


def test_perplexity_function_and_verb(default_gguf, wiki_test, threads):
    p = tools.perplexity(default_gguf, wiki_test, n_ctx=256, chunks=4, threads=threads)
    assert math.isfinite(p.ppl) and 1.0 < p.ppl < 200.0
    assert p.n_ctx == 256 and p.n_chunks == 4 and p.n_tokens_scored == 4 * 127
    r = ggml_ext("perplexity", default_gguf, "--text", wiki_test, "-c", "256", "--chunks", "4", "-t", threads)
    assert r.returncode == 0, r.stderr
    assert f"PPL = {p.ppl:.4f}" in r.stdout, "same windows, same number"


def test_perplexity_of_a_missing_file_is_a_clear_error(wiki_test, tmp_path):
    r = ggml_ext("perplexity", tmp_path / "nope.gguf", "--text", wiki_test)
    assert r.returncode == 1 and "not found" in r.stderr


def test_bench_passes_through(default_gguf, threads):
    r = ggml_ext("bench", "-m", default_gguf, "-p", "16", "-n", "4", "-r", "1", "-t", threads, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert '"n_prompt": 16' in r.stdout
