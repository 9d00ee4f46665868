"""ggml-ext's CUDA code against the CPU, in the style of upstream's test-backend-ops: every case of every op
with a CUDA kernel (ggml_ext/src/cuda) on each GPU, compared with the CPU backend (NMSE at most 1e-7).
Needs a GGML_EXT_CUDA=ON build and an NVIDIA GPU (the device machine: `make test-cuda` runs the same
program); elsewhere it skips and says which of the two is missing."""
from __future__ import annotations

import pytest

from ggml_ext import build_info

SKIP = 77  # the program's exit status when --require-gpu finds no GPU device


@pytest.mark.cuda
def test_col_sidecar_on_cuda_matches_the_cpu_backend(ext_ops):
    if not build_info.get().cuda:
        pytest.skip("build without GGML_EXT_CUDA: no CUDA backend to compare")
    proc = ext_ops("--require-gpu")
    if proc.returncode == SKIP:
        pytest.skip("no CUDA device")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "+ GPU" in proc.stdout and "backend: CUDA0" in proc.stdout, proc.stdout[-2000:]
