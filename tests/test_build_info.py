"""Our build reports ggml-ext's identity from C, through Python and in llama.cpp's system info."""
from __future__ import annotations

import subprocess
import sys

import ggml_ext
from ggml_ext import build_info


def test_build_info_comes_from_the_compiled_library():
    b = build_info.get()
    assert b.ggml_ext == ggml_ext.__version__
    assert b.format_version == 1
    assert b.llama_cpp_commit == "0c1e57098"
    # llama_print_system_info() carries our hook's section next to the CPU backend's features
    assert "GGML_EXT : VERSION = " + ggml_ext.__version__ in b.system_info
    assert b.backends["GGML_EXT"]["LLAMA_CPP"] == "0c1e57098"
    assert "CPU" in b.backends
    for t in ("llama-server", "llama-cli", "llama-bench", "llama-perplexity", "llama-quantize",
              "llama-imatrix", "ggml-rpc-server"):
        assert t in b.tools


def test_cli_info_build():
    proc = subprocess.run([sys.executable, "-m", "ggml_ext.cli", "info", "--build"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "0c1e57098" in proc.stdout and "CPU features" in proc.stdout
