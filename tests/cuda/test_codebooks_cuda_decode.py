"""The codebook types' CUDA kernels read the bits as the C reference does (tests/cuda/codebooks_decode_check.cu):
the __host__ __device__ functions both kernels use (ggml_ext/src/cuda/codebooks_decode.cuh: the dequantize
kernel's per-weight reading, each f32 mat-vec lane's 8 weights, each integer mat-vec lane quarter's 64 int8
weights from byte permutes) run on the host over CB2 / CB3 rows from
ggml_quantize_chunk and must give ggml's to_float bit for bit, every weight read once. Needs nvcc (no GPU:
host code only); skipped without it. The kernels themselves on a GPU: tests/cuda/test_types_cuda.py."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_cuda_codebook_decoding_matches_the_reference(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc: the CUDA decode functions cannot be compiled here")
    from ggml_ext import _locate
    lib, inc = _locate.lib_dir(), _locate.prefix() / "include"
    exe = tmp_path / "codebooks_decode_check"
    subprocess.run([nvcc, "-std=c++17", "-x", "cu", str(REPO / "tests/cuda/codebooks_decode_check.cu"),
                    f"-I{REPO / 'ggml_ext/src/cuda'}", f"-I{REPO / 'ggml_ext/src'}", f"-I{REPO / 'ggml_ext/include'}",
                    f"-I{inc}", f"-L{lib}", "-lggml-base", "-Xlinker", "-rpath", "-Xlinker", str(lib), "-o", str(exe)],
                   check=True, timeout=300)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "CB2: 96 blocks checked" in proc.stdout and "CB3: 96 blocks checked" in proc.stdout
    assert "OK: 0 failures" in proc.stdout
