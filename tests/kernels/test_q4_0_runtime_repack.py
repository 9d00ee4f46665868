"""Stock Q4_0 files through our kernels (patch 0112): ggml-cpu's runtime repack puts plain
Q4_0 weights into our Q4_0_8_8 layout on x86 AVX2 / AVX-512 and runs them with our
mul_mat, so the plain Q4_0 file and the pre-interleaved Q4_0_8_8 file compute bit for
bit the same; GGML_EXT_RUNTIME_REPACK=0 gives the weights back to upstream's repack.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import q4_0_probe
from ggml_ext import repack

TESTS = Path(__file__).resolve().parents[1]
X86_AVX2 = platform.machine() in ("x86_64", "AMD64") and "avx2" in repack._cpu_features()
pytestmark = pytest.mark.skipif(not X86_AVX2, reason="our runtime repack takes Q4_0 on x86 AVX2 / AVX-512 only; "
                                "elsewhere upstream's repack keeps it")
OFF = q4_0_probe.UPSTREAM_REPACK


@pytest.fixture(scope="module")
def files(q4_0_files):
    """The default model as Q4_0 and repacked into each interleaved layout (conftest)."""
    return q4_0_files


def test_mul_mat_through_the_repack_buffer(tmp_path):
    """tests/c/test_q4_0_runtime_repack.c on our installed libggml, both ways."""
    from ggml_ext import _locate
    exe = tmp_path / "t_runtime_repack"
    lib = _locate.lib_dir()
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{_locate.prefix() / 'include'}",
                    str(TESTS / "c" / "test_q4_0_runtime_repack.c"), f"-L{lib}", "-lggml", "-lggml-base",
                    "-lggml-cpu", "-lm", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    for mode, env in (("ours", {}), ("upstream", OFF)):
        proc = subprocess.run([str(exe), mode], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env})
        print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def _repacked_at_load(path, env, tool_env, wiki_test):
    """{tensor: what took it} from a llama-perplexity load log at full verbosity (ggml debug lines)."""
    from ggml_ext import tools
    proc = subprocess.run(tools.command("llama-perplexity", "-m", path, "-f", wiki_test, "-c", "64", "--chunks", "1",
                                        "-t", "1", "--no-warmup", "-v"),
                          env={**tool_env, **env}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = proc.stdout + proc.stderr
    taken = {m[1]: "ours" for m in re.finditer(r"ggml-ext runtime repack of (\S+) into Q4_0_8_8", log)}
    taken.update({m[1]: "upstream" for m in re.finditer(r"repack tensor (\S+) with q4_0_8x8", log)})
    return taken, log


def test_runtime_repack_takes_the_tensors_repack_interleaves(files, tool_env, wiki_test):
    """The weights repacked at load are exactly those `repack --layout 8x8` (and `convert --type
    q4_0_8_8`, tested byte-identical to it) interleaves; token_embd (get_rows) stays plain."""
    converted = set(files["converted", "Q4_0_8_8"])
    assert "token_embd.weight" not in converted and len(converted) == 30 * 7
    ours, log = _repacked_at_load(files["q4_0"], {}, tool_env, wiki_test)
    assert ours == dict.fromkeys(converted, "ours"), log[-3000:]
    assert "CPU_REPACK model buffer" in log
    upstream, _ = _repacked_at_load(files["q4_0"], OFF, tool_env, wiki_test)
    assert upstream == dict.fromkeys(converted, "upstream")


def test_same_tensor_selection_with_an_output_matrix_and_rows_that_do_not_divide(tmp_path, tool_env, wiki_test):
    """A tiny untied llama with a Q4_0 output.weight (taken by both) and 132-row ffn_gate/up
    (taken by neither: 132 is not a multiple of 8; they run ggml's plain Q4_0 kernels)."""
    import ggml_ext
    from convert_support import make_tiny
    folder = make_tiny("llama", tmp_path / "tiny", tie_word_embeddings=False, intermediate_size=132)
    q4 = tmp_path / "tiny-q4_0.gguf"
    ggml_ext.convert(folder, q4, "q4_0", keep=["output.weight=q4_0"])
    r = repack.repack(q4, tmp_path / "tiny-q4_0_8_8.gguf", "8x8")
    assert "output.weight" in r.converted and any("ffn_gate" in k for k in r.kept), (r.converted, r.kept)
    ours, log = _repacked_at_load(q4, {}, tool_env, wiki_test)
    assert ours == dict.fromkeys(r.converted, "ours"), log[-3000:]


@pytest.mark.parametrize("nth", [1, 2, 4])
def test_q4_0_file_and_q4_0_8_8_file_are_bit_identical(files, tmp_path, nth):
    """32 greedy tokens identical, and every logit of prompt + tokens (one batch) equal bit
    for bit: the same kernels on the same bytes with the same thread split."""
    q4 = q4_0_probe.run(files["q4_0"], nth, tmp_path)
    i8 = q4_0_probe.run(files["Q4_0_8_8"], nth, tmp_path)
    assert q4["tokens"].tolist() == i8["tokens"].tolist()
    assert np.array_equal(q4["logits"], i8["logits"])
    if nth == 2:
        # upstream's repack of the same file (GGML_EXT_RUNTIME_REPACK=0) is another computation
        up = q4_0_probe.run(files["q4_0"], nth, tmp_path, env=OFF)
        assert up["prompt"].tolist() == q4["prompt"].tolist()
        assert not np.array_equal(up["logits"][:len(q4["prompt"])], q4["logits"][:len(q4["prompt"])])
