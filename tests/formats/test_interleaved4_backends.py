"""The interleaved layouts through ggml's backend API (tests/c/test_types_backends.cpp, conftest's
types_backends): every type with a stock twin in mul_mat over the models' shapes on the CPU backend (1 and 4
threads, same bits), each type's bytes the relayout of its base type's; through our ggml-rpc-server the
weights go up in uneven pieces, come back byte for byte and give the local CPU's bits. The same runs hold the
codebook types CB2 / CB3 (own ids, no stock twin) over batches 1 .. 512 and odd row counts to the exact
product of their dequantized weights (NMSE 1e-4) and, through RPC, to the local CPU's bits. On CUDA:
tests/cuda/test_types_cuda.py."""
from __future__ import annotations


def test_interleaved_types_on_the_cpu_backend(types_backends):
    proc = types_backends()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "OK: 72 mul_mat runs, 6 types x 6 shapes on CPU (1, 4 threads)" in proc.stdout, proc.stdout[-2000:]
    assert "codebooks: 16 mul_mat runs, 2 types x 8 shapes" in proc.stdout, proc.stdout[-2000:]


def test_interleaved_types_through_rpc(types_backends, rpc_server):
    port, log = rpc_server
    proc = types_backends("--rpc", f"127.0.0.1:{port}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "OK: 108 mul_mat runs" in proc.stdout and "+ RPC" in proc.stdout, proc.stdout[-2000:]
    assert "codebooks: 32 mul_mat runs, 2 types x 8 shapes" in proc.stdout, proc.stdout[-2000:]
