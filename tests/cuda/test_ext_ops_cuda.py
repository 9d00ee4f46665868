"""ggml-ext's CUDA code against the CPU, in the style of upstream's test-backend-ops: every case of every op
with a CUDA kernel (ggml_ext/src/cuda) on each GPU, compared with the CPU backend (NMSE at most 1e-7).
Needs a GGML_EXT_CUDA=ON build and an NVIDIA GPU (the device machine: `make test-cuda` runs the same
program); elsewhere it skips and says which of the two is missing."""
from __future__ import annotations

import pytest

from cuda_support import run_on_gpus


@pytest.mark.cuda
def test_col_sidecar_on_cuda_matches_the_cpu_backend(ext_ops):
    run_on_gpus(ext_ops)
