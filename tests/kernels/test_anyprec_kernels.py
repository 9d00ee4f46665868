"""Any-precision bitplane GEMV kernels (ggml_ext/src/{generic,x86,arm}/anyprec*.c): the C program
tests/c/test_anyprec_kernels.c, which compares every compiled-in kernel and the dispatcher with the
scalar twin (and the twin with a double-precision dot product of the dequantized rows) for precisions
1..8, built natively for this CPU's best instruction set (-march=native), without SIMD (x86-64: the
dispatcher must run the scalar twin), and for aarch64 (NEON) under qemu. Builds go to pytest's tmp dir."""
from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import qemu_support as qs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from kernel_sources import ANYPREC as SOURCES, SRC  # noqa: E402

TEST_C = REPO / "tests" / "c" / "test_anyprec_kernels.c"
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{REPO / 'ggml_ext' / 'include'}", f"-I{SRC}"]
IS_X86 = platform.machine() in ("x86_64", "AMD64")


def _build_run(cc: str, march: str, out: Path, runner: list[str] = (), static: bool = False) -> str:
    cmd = [cc, *CFLAGS, f"-march={march}", str(TEST_C), *map(str, SOURCES), "-lm", "-o", str(out)]
    subprocess.run(cmd + (["-static"] if static else []), check=True, capture_output=True, text=True)
    r = subprocess.run([*runner, str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\nok " in "\n" + r.stdout, r.stdout
    return r.stdout


def test_native_kernels_match_the_scalar_twin(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = _build_run(cc, "native", tmp_path / "native")
    if IS_X86:
        flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        have = set(flags.split())
        if {"avx2", "fma", "f16c"} <= have:
            assert "kernel avx2" in out, out
            best = "avx512" if {"avx512f", "avx512bw"} <= have else "avx2"
            assert f"kernel {best}" in out and f"dispatch runs {best}" in out, out


@pytest.mark.skipif(not IS_X86, reason="the x86-64 baseline build is an x86 check")
def test_without_simd_the_dispatcher_runs_the_scalar_twin(tmp_path):
    out = _build_run(shutil.which("cc") or "gcc", "x86-64", tmp_path / "plain")
    assert "dispatch runs scalar" in out, out


@pytest.mark.qemu
def test_neon_kernel_under_qemu(tmp_path):
    cc, runner = qs.arm_target("armv8-a", ["qemu-aarch64-static", "-cpu", "max"])  # aarch64 host: natively
    out = _build_run(cc, "armv8-a", tmp_path / "arm", runner=runner, static=True)
    assert "kernel neon" in out and "dispatch runs neon" in out, out
