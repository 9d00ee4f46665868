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


# The implementations ggml_ext_dispatched_kernel can name (ggml_ext/src/*/q4_0_interleaved*.c).
KERNELS = {"generic", "avx2", "avx512-vnni", "neon-dotprod", "neon-i8mm", "sve256-i8mm", "neon"}


def test_dispatched_kernels_agree_with_the_build_features():
    """Every interleaved type reports a GEMV and a GEMM kernel, consistent with the SIMD features
    ggml's own CPU backend says this build was compiled with (the same compiler macros decide ours;
    tests/c/test_interleaved4.c checks that each report names the kernel that runs)."""
    b = build_info.get()
    assert set(b.kernels) == set(build_info.INTERLEAVED_TYPES.values())
    used = {k for pair in b.kernels.values() for k in pair}
    assert used <= KERNELS, used
    cpu = b.backends["CPU"]
    simd = ({"avx2", "avx512-vnni"} if all(cpu.get(f) == "1" for f in ("AVX2", "FMA", "F16C"))
            else {"neon-dotprod", "neon-i8mm", "sve256-i8mm"} if cpu.get("DOTPROD") == "1" else set())
    if cpu.get("AVX512_VNNI") != "1":
        simd.discard("avx512-vnni")
    if cpu.get("MATMUL_INT8") != "1":
        simd -= {"neon-i8mm", "sve256-i8mm"}
    if simd:  # each family has a SIMD GEMV and GEMM for every layout on x86 and with dotprod
        assert used <= simd, (used, cpu)
    else:     # no SIMD kernel compiled in: everything on the scalar reference
        assert used == {"generic"}, (used, cpu)


def test_cli_info_build_names_the_kernels_and_the_scalar_fallback():
    proc = subprocess.run([sys.executable, "-m", "ggml_ext.cli", "info", "--build"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    kernels = build_info.get().kernels
    assert set(kernels) == set(build_info.INTERLEAVED_TYPES.values())
    for name, (gemv, gemm) in kernels.items():
        show = {k: f"{k} (scalar fallback)" if k == "generic" else k for k in (gemv, gemm)}
        assert f"\n{name:<18}kernels: gemv {show[gemv]}, gemm {show[gemm]}\n" in proc.stdout, proc.stdout
