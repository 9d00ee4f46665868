"""ggml-ext's ops (ggml_ext/include/ggml-ext-ops.def) run through ggml's backend API with real GGML_OP ids:
on the CPU backend against a double-precision reference, through our ggml-rpc-server bit for bit, and on
CUDA against the CPU (tests/c/test_ext_ops.cpp; the CUDA run needs GGML_EXT_CUDA=ON and a GPU)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ggml_ext import _locate, build_info

SRC = Path(__file__).resolve().parent / "c" / "test_ext_ops.cpp"
SKIP = 77  # the program's exit status when --require-gpu finds no GPU device


@pytest.fixture(scope="module")
def exe(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ext-ops") / "test_ext_ops"
    lib = _locate.lib_dir()
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{_locate.prefix() / 'include'}",
                    str(SRC), f"-L{lib}", "-lggml", "-lggml-base", "-lggml-cpu", "-lggml-rpc", f"-Wl,-rpath,{lib}",
                    "-o", str(out)], check=True)
    return out


def _run(exe: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
    return proc


def test_col_sidecar_on_the_cpu_backend(exe):
    proc = _run(exe)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "OK: 24 runs of 6 cases on CPU (1-4 threads)" in proc.stdout


def test_col_sidecar_through_rpc_equals_the_cpu_backend(exe, rpc_server):
    """The op travels by its id to our ggml-rpc-server, whose CPU backend computes the same bits."""
    port, log = rpc_server
    proc = _run(exe, "--rpc", f"127.0.0.1:{port}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "+ RPC" in proc.stdout and f"backend: RPC0[127.0.0.1:{port}]" in proc.stdout, proc.stdout[-2000:]
    assert "OK: 30 runs of 6 cases" in proc.stdout
    log.seek(0)
    assert "Accepted client connection" in log.read()


@pytest.mark.cuda
def test_col_sidecar_on_cuda_matches_the_cpu_backend(exe):
    if not build_info.get().cuda:
        pytest.skip("build without GGML_EXT_CUDA: no CUDA backend to compare")
    proc = _run(exe, "--require-gpu")
    if proc.returncode == SKIP:
        pytest.skip("no CUDA device")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "+ GPU" in proc.stdout and "backend: CUDA0" in proc.stdout, proc.stdout[-2000:]
