"""Shared fixtures: the real default model and texts (fetched by `make test`), our tools.

Tests are grouped by area (formats, kernels, convert, methods, runtime, reliability, cuda);
the helper modules they share (convert_support, q4_0_probe, atheris_smoke) sit here, in
tests/, which is put on sys.path below."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helper modules
# Tests run against the installed package; fall back to the source tree for pure-Python modules.
try:
    import ggml_ext  # noqa: F401
except ImportError:  # pragma: no cover - only when running without `make install`
    sys.path.insert(0, str(REPO / "python"))


def pytest_addoption(parser):
    """Where ggml-ext's asset store is not (the lent GPU machine, which reaches no PyPI), the default model's
    HF folder and the texts are given as files (scripts/test_cuda.sh passes them on)."""
    g = parser.getgroup("ggml-ext assets", "the default model and texts as files, instead of the asset store")
    g.addoption("--default-hf", metavar="DIR", help="the default model's HF folder (instead of the smollm2-hf asset)")
    g.addoption("--wiki-test", metavar="FILE", help="the perplexity text (instead of the wiki-test asset)")
    g.addoption("--wiki-train", metavar="FILE", help="the calibration text (instead of the wiki-train asset)")


def pytest_configure(config):
    if config.getoption("--default-hf"):
        import convert_support
        convert_support.DEFAULT_HF = Path(config.getoption("--default-hf")).absolute()


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 blocks, Q8_0 embedding), the project's default model."""
    from ggml_ext import assets
    return assets.path("smollm2-gguf")


@pytest.fixture(scope="session")
def wiki_test(request) -> Path:
    if request.config.getoption("--wiki-test"):
        return Path(request.config.getoption("--wiki-test")).absolute()
    from ggml_ext import assets
    return assets.path("wiki-test")


@pytest.fixture(scope="session")
def tool_env() -> dict[str, str]:
    from ggml_ext import tools
    return tools.tool_env()


@pytest.fixture(scope="session")
def threads() -> int:
    return max(1, min(2, os.cpu_count() or 1))


@contextlib.contextmanager
def _rpc_server(tool_env, threads, log_path):
    """Our ggml-rpc-server on a free loopback port, listening; yields (port, its log file)."""
    from ggml_ext import serve, tools
    port = serve.free_port()
    log = open(log_path, "w+")
    proc = subprocess.Popen(tools.command("ggml-rpc-server", "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)),
                            env=tool_env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120  # a hang guard: it listens within a second on any machine
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, "rpc-server exited early"
            assert time.monotonic() < deadline, "rpc-server did not start listening"
            time.sleep(0.2)
    try:
        yield port, log
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture()
def rpc_server(tool_env, threads, tmp_path):
    """Our ggml-rpc-server on a free loopback port, listening; yields (port, its log file)."""
    with _rpc_server(tool_env, threads, tmp_path / "rpc-server.log") as server:
        yield server


@pytest.fixture()
def two_rpc_servers(tool_env, threads, tmp_path):
    """Two of them (two devices for llama.cpp's split modes); yields their ports."""
    with _rpc_server(tool_env, 1, tmp_path / "rpc-server-0.log") as a, \
            _rpc_server(tool_env, 1, tmp_path / "rpc-server-1.log") as b:
        yield a[0], b[0]


@pytest.fixture(scope="session")
def q4_0_files(tmp_path_factory) -> dict:
    """The default model as Q4_0 (our converter) and `ggml-ext repack`-ed into each interleaved
    layout: {"q4_0": path, "Q4_0_4_4" | "Q4_0_4_8" | "Q4_0_8_8": path, ("converted", name): tensors}."""
    import ggml_ext
    from ggml_ext import assets, repack
    d = tmp_path_factory.mktemp("q4_0-files")
    out: dict = {"q4_0": d / "smollm2-q4_0.gguf"}
    ggml_ext.convert(assets.path("smollm2-hf"), out["q4_0"], "q4_0")
    for layout, name in repack.Q4_0_LAYOUTS.items():
        out[name] = d / f"smollm2-{name.lower()}.gguf"
        r = repack.repack(out["q4_0"], out[name], layout)
        assert r.converted and not r.kept
        out["converted", name] = r.converted
    return out


@pytest.fixture(scope="session")
def iq4_nl_files(tmp_path_factory) -> dict:
    """The default model as IQ4_NL (our converter: ggml-ext's quantizer, llama.cpp's IQ4_NL mix)
    and `ggml-ext repack`-ed into each interleaved layout: {"iq4_nl": path, "IQ4_NL_4_4" | ...: path}."""
    import ggml_ext
    from ggml_ext import assets, repack
    d = tmp_path_factory.mktemp("iq4_nl-files")
    out = {"iq4_nl": d / "smollm2-iq4_nl.gguf"}
    ggml_ext.convert(assets.path("smollm2-hf"), out["iq4_nl"], "iq4_nl")
    for layout, name in repack.IQ4_LAYOUTS.items():
        out[name] = d / f"smollm2-{name.lower()}.gguf"
        r = repack.repack(out["iq4_nl"], out[name], layout)
        assert r.converted and not r.kept
    return out


def _c_program(tmp_path_factory, name: str):
    """tests/c/<name>.cpp built once against the installed libraries; returns run(*args) -> CompletedProcess
    (printing the program's last line)."""
    from ggml_ext import _locate
    exe = tmp_path_factory.mktemp(name) / name
    lib = _locate.lib_dir()
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{_locate.prefix() / 'include'}",
                    str(REPO / "tests" / "c" / f"{name}.cpp"), f"-L{lib}", "-lggml", "-lggml-base", "-lggml-cpu",
                    "-lggml-rpc", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)

    def run(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
        print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
        return proc
    return run


@pytest.fixture(scope="session")
def ext_ops(tmp_path_factory):
    """Runs tests/c/test_ext_ops.cpp: ggml-ext's ops through ggml's backend API (CPU; RPC with --rpc
    HOST:PORT; each GPU with --require-gpu, exit 77 when there is none)."""
    return _c_program(tmp_path_factory, "test_ext_ops")


@pytest.fixture(scope="session")
def kvquant_cuda(tmp_path_factory):
    """Runs tests/c/test_kvquant_cuda.cpp: the KVQuant cache types NUQ4 / NUQ3 / NUQ2 on each GPU against the CPU
    (--require-gpu: exit 77 when there is none)."""
    return _c_program(tmp_path_factory, "test_kvquant_cuda")


@pytest.fixture(scope="session")
def kvattn_cuda(tmp_path_factory):
    """Runs tests/c/test_kvattn_cuda.cpp: the KVQuant decode op on each GPU against the CPU (--require-gpu: exit 77
    when there is none)."""
    return _c_program(tmp_path_factory, "test_kvattn_cuda")


@pytest.fixture(scope="session")
def types_backends(tmp_path_factory):
    """Runs tests/c/test_types_backends.cpp: ggml-ext's types with a stock twin (the interleaved layouts)
    in mul_mat on the CPU backend, through RPC (--rpc HOST:PORT) and on each GPU (--require-gpu)."""
    return _c_program(tmp_path_factory, "test_types_backends")
