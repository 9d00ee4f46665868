"""ggml-ext's ops (ggml_ext/include/ggml-ext-ops.def) run through ggml's backend API with real GGML_OP ids:
on the CPU backend against a double-precision reference and through our ggml-rpc-server bit for bit
(tests/c/test_ext_ops.cpp, conftest's ext_ops). On CUDA: tests/cuda/test_ext_ops_cuda.py."""
from __future__ import annotations


def test_ext_ops_on_the_cpu_backend(ext_ops):
    proc = ext_ops()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "OK: 24 runs of 6 cases on CPU (1-4 threads)" in proc.stdout
    # APQ_MUL_MAT: the GEMV (up to 8 tokens) and the dequantized blocks against a double reference, the
    # same bits for 1-4 threads: 5 cases and the sweep of precisions 3..8 x 1, 2, 5, 8, 9, 33 tokens
    assert "APQ: 164 runs of 41 cases" in proc.stdout
    assert "APQ GPU: skipped (no GPU device" in proc.stdout or "APQ GPU: 41 runs of 41 cases" in proc.stdout
    # DEC_MUL_MAT: the channel selection against an independent one, the op against a double reference,
    # the same bits for 1-4 threads
    assert "DEC: 24 runs of 6 cases" in proc.stdout


def test_ext_ops_through_rpc_equal_the_cpu_backend(ext_ops, rpc_server):
    """The op travels by its id to our ggml-rpc-server, whose CPU backend computes the same bits."""
    port, log = rpc_server
    proc = ext_ops("--rpc", f"127.0.0.1:{port}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "+ RPC" in proc.stdout and f"backend: RPC0[127.0.0.1:{port}]" in proc.stdout, proc.stdout[-2000:]
    assert "OK: 30 runs of 6 cases" in proc.stdout
    assert "APQ: 205 runs of 41 cases" in proc.stdout  # and through RPC, the same bits
    assert "DEC: 30 runs of 6 cases" in proc.stdout
    log.seek(0)
    assert "Accepted client connection" in log.read()
