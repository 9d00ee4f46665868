"""What the CUDA tests (tests/cuda/) share: run a backend test program on every GPU, or skip and say which
of the two things a GPU run needs is missing here (a GGML_EXT_CUDA=ON build, an NVIDIA GPU)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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


def run_host_check(source: Path, tmp_path: Path, what: str) -> subprocess.CompletedProcess:
    """A tests/cuda/*_check.cu program (the CUDA code's __host__ __device__ pieces against the CPU, no GPU) compiled
    with nvcc against the installed ggml and run; its exit status 0 asserted. Skipped without nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip(f"no nvcc: {what} cannot be compiled here")
    from ggml_ext import _locate
    repo = Path(__file__).resolve().parents[1]
    lib, inc = _locate.lib_dir(), _locate.prefix() / "include"
    exe = tmp_path / source.stem
    subprocess.run([nvcc, "-std=c++17", "-x", "cu", str(source),
                    f"-I{repo / 'ggml_ext/src/cuda'}", f"-I{repo / 'ggml_ext/src'}", f"-I{repo / 'ggml_ext/include'}",
                    f"-I{inc}", f"-L{lib}", "-lggml-base", "-lggml-cpu", "-Xlinker", "-rpath", "-Xlinker", str(lib),
                    "-o", str(exe)], check=True, timeout=300)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc
