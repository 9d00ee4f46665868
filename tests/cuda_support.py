"""What the CUDA tests (tests/cuda/) share: run a backend test program on every GPU, or skip and say which
of the two things a GPU run needs is missing here (a GGML_EXT_CUDA=ON build, an NVIDIA GPU)."""
from __future__ import annotations

import subprocess

import pytest

from ggml_ext import build_info

SKIP = 77  # the programs' exit status when --require-gpu finds no GPU device


def run_on_gpus(program) -> subprocess.CompletedProcess:
    """`program` (a conftest fixture: tests/c/<name>.cpp built) run with --require-gpu; passed, or skipped."""
    if not build_info.get().cuda:
        pytest.skip("build without GGML_EXT_CUDA: no CUDA backend to compare")
    proc = program("--require-gpu")
    if proc.returncode == SKIP:
        pytest.skip("no CUDA device")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "+ GPU" in proc.stdout and "backend: CUDA0" in proc.stdout, proc.stdout[-2000:]
    return proc
