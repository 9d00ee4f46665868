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


@pytest.mark.cuda
def test_apq_mul_mat_on_cuda_matches_the_cpu_backend(ext_ops):
    """APQ_MUL_MAT (src/cuda/apq_mul_mat.cu): every case on the GPU (precisions 3..8, 1..33 tokens, odd row
    counts, padded row lengths), its weight uploaded and read back in uneven pieces through the row-lane
    layout; NMSE against the CPU at most 1e-7 up to 8 tokens (GEMV), 5e-4 above (fp16 into cuBLAS)."""
    proc = run_on_gpus(ext_ops)
    assert "APQ GPU: 41 runs of 41 cases" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.cuda
def test_dec_mul_mat_on_cuda_matches_the_cpu_backend(ext_ops):
    """DEC_MUL_MAT (src/cuda/dec_mul_mat.cu): the 6 CPU cases and 13 GPU-only ones (Llama-3-8B shapes at one
    token, odd M, rows not 16-byte aligned, k_chunk 0/8/16/64, approximate and exact top-k, n_tb from 1 up),
    each with the residual in GPU memory and in pinned host memory (zero-copy), each with the cooperative
    (grid.sync) and the two-kernel launch: the residual term's NMSE against the CPU at most 1e-7."""
    proc = run_on_gpus(ext_ops)
    assert "DEC GPU: 76 runs of 19 cases" in proc.stdout, proc.stdout[-2000:]
