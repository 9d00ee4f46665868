"""ggml-ext's types on CUDA against the CPU (tests/c/test_types_backends.cpp --require-gpu): the interleaved
layouts held on the GPU as their base type (ggml_ext/src/cuda/interleaved4_cuda.cu, patch 0400) give
upstream's result on the base type's tensor bit for bit and the CPU's within test-backend-ops' MUL_MAT bound;
uploads in pieces read back byte for byte; get_rows and partial-row views are refused. Needs a
GGML_EXT_CUDA=ON build and an NVIDIA GPU (`make test-cuda` runs the same program); elsewhere it skips."""
from __future__ import annotations

import pytest

from cuda_support import run_on_gpus


@pytest.mark.cuda
def test_interleaved_types_on_cuda_match_the_base_type_and_the_cpu(types_backends):
    run_on_gpus(types_backends)
