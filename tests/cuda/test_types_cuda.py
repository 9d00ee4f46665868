"""ggml-ext's types on CUDA against the CPU (tests/c/test_types_backends.cpp --require-gpu): the interleaved
layouts held on the GPU as their base type (ggml_ext/src/cuda/interleaved4_cuda.cu, patch 0400) give
upstream's result on the base type's tensor bit for bit and the CPU's within test-backend-ops' MUL_MAT bound;
uploads in pieces read back byte for byte; get_rows and partial-row views are refused. The codebook types
CB2 / CB3 run ggml-ext's own CUDA kernels (ggml_ext/src/cuda/codebooks_cuda.cu, patch 0410: the mat-vec up to 8
tokens, dequantize + cuBLAS beyond): within NMSE 1e-5 of the exact product and 2e-4 of the CPU at batches
1, 2, 5, 8, 9, 33, 512; their get_rows and mul_mat_id are refused. Needs a
GGML_EXT_CUDA=ON build and an NVIDIA GPU (`make test-cuda` runs the same program); elsewhere it skips."""
from __future__ import annotations

import re

import pytest

from cuda_support import run_on_gpus


@pytest.mark.cuda
def test_interleaved_types_on_cuda_match_the_base_type_and_the_cpu(types_backends):
    proc = run_on_gpus(types_backends)
    assert re.search(r"^codebooks: \d+ mul_mat runs, 2 types x 8 shapes$", proc.stdout, re.M), proc.stdout[-2000:]
    assert re.search(r"^CUDA0 CB2 K=1536 N=576 M=1: ", proc.stdout, re.M), proc.stdout[-2000:]
