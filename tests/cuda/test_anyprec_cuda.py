"""The any-precision one-token CUDA GEMV's tensor-core path at b <= 4 (ggml_ext/src/cuda/anyprec_decode.cuh; docs/formats/
anyprec.md "CUDA op"), on the host (nvcc, no GPU): row-lane words of random codes through the kernel's own fragment
functions, the warp's MMA emulated from PTX's fragment layout, every row's sum within 1e-5 of sum |w x| of a double
dot product, each weight in one MMA (tests/cuda/anyprec_decode_check.cu). Skipped without nvcc. The kernels on a GPU
against the CPU: tests/c/test_ext_ops.cpp (make test-cuda) and bench/device/device_anyprec.sh."""
from __future__ import annotations

from pathlib import Path

from cuda_support import run_host_check

REPO = Path(__file__).resolve().parents[2]


def test_anyprec_tensor_core_fragments_match_the_reference(tmp_path):
    proc = run_host_check(REPO / "tests/cuda/anyprec_decode_check.cu", tmp_path, "the APQ fragment functions")
    assert "APQ tensor-core fragments: 48 row groups checked" in proc.stdout, proc.stdout[-2000:]
    assert "OK: 0 failures" in proc.stdout, proc.stdout[-2000:]
