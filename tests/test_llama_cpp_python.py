"""llama-cpp-python 0.3.36 runs on our libllama and generates deterministic greedy text."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ggml_ext import _locate
from ggml_ext.llama_cpp_glue import Llama, load_llama_cpp


@pytest.fixture(scope="module")
def llm(default_gguf, threads):
    return Llama(default_gguf, n_ctx=512, n_threads=threads, seed=0)


def test_bound_to_our_libllama():
    llama_cpp = load_llama_cpp()
    assert llama_cpp.__version__ == "0.3.36"
    assert os.path.realpath(llama_cpp.llama_cpp._base_path) == os.path.realpath(_locate.lib_dir())
    info = llama_cpp.llama_print_system_info().decode()
    assert "GGML_EXT : VERSION" in info


def test_greedy_completion_is_deterministic_and_coherent(llm):
    out1 = llm("The capital of France is", max_tokens=8, temperature=0.0)["choices"][0]["text"]
    llm.reset()
    out2 = llm("The capital of France is", max_tokens=8, temperature=0.0)["choices"][0]["text"]
    assert out1 == out2
    assert "Paris" in out1


def test_chat_completion_uses_the_files_template(llm):
    r = llm.create_chat_completion(messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                                   max_tokens=24, temperature=0.0)
    assert "Paris" in r["choices"][0]["message"]["content"]


def test_loading_a_bad_file_raises_not_crashes(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(ValueError):
        Llama(bad, n_ctx=64)


def test_refuses_another_llama_cpp_python_version(tmp_path):
    # A dist-info earlier on sys.path is what importlib.metadata sees: a real 0.3.35 install, as far as we can tell.
    dist = tmp_path / "llama_cpp_python-0.3.35.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.35\n")
    code = textwrap.dedent("""
        from ggml_ext.llama_cpp_glue import load_llama_cpp, BindingError
        try:
            load_llama_cpp()
        except BindingError as e:
            print(e); raise SystemExit(3)
    """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 3, proc.stderr
    assert "0.3.35 is installed" in proc.stdout and "needs exactly 0.3.36" in proc.stdout
