"""llama-cpp-python 0.3.36 runs on our libllama and generates deterministic greedy text."""
from __future__ import annotations

import json
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


def _clean_env() -> dict[str, str]:
    """The environment of a new shell: nothing of ours pointing llama_cpp or Python anywhere."""
    drop = {"LLAMA_CPP_LIB_PATH", "MTMD_CPP_LIB", "PYTHONPATH", "GGML_EXT_PREFIX", "LD_LIBRARY_PATH"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_plain_llama_cpp_python_code_runs_on_our_libllama(default_gguf, threads, tmp_path):
    # what every llama-cpp-python user writes, with no ggml_ext import: the .pth our wheel installs does it
    code = textwrap.dedent(f"""
        import json
        import llama_cpp
        from llama_cpp import Llama
        llm = Llama(model_path={str(default_gguf)!r}, n_ctx=256, n_threads={threads}, verbose=False)
        out = llm("The capital of France is", max_tokens=8, temperature=0)
        print(json.dumps([out["choices"][0]["text"], hasattr(llama_cpp.llama_cpp._lib, "ggml_ext_version"),
                          str(llama_cpp.llama_cpp._base_path)]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(),
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text, ours, base = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "Paris" in text  # " Paris.\n\nThe United States has"
    assert ours, "llama_cpp loaded a libllama without ggml_ext_version"
    assert os.path.realpath(base) == os.path.realpath(_locate.lib_dir())


def test_the_start_up_hook_is_cheap_and_silent(tmp_path):
    # it runs in every Python process of the environment: no heavy imports, no output, a set value is kept
    code = ("import os, sys; print(os.environ.get('LLAMA_CPP_LIB_PATH')); "
            "print([m for m in ('ggml_ext', 'numpy', 'llama_cpp') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(),
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    lib, imported = proc.stdout.splitlines()
    assert os.path.realpath(lib) == os.path.realpath(_locate.lib_dir()) and imported == "[]"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(_clean_env(), LLAMA_CPP_LIB_PATH="/elsewhere"), cwd=tmp_path, timeout=60)
    assert proc.stdout.splitlines() == ["/elsewhere", "[]"] and proc.stderr == ""
