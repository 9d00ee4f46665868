"""The NUQ4/3/2 cache types' block decode (formats/kvquant/nuq_decode.h: the value path's to_float per
head and the pre-RoPE key path's dequantization): the C test program tests/c/test_nuq_decode.c, built
natively (the AVX2 decoder where this CPU has it, bit for bit against the scalar reference, and a build
without AVX2) and cross-built for aarch64 and run under qemu (NEON). The reference is also checked
against the kvquant row kernel's dequantization. Compiled outside CMake from scripts/kernel_sources.py's
NUQ_DECODE list, as tests/kernels/test_kvquant_c_kernels.py does; a second each, qemu a few."""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from kernel_sources import NUQ_DECODE as SOURCES, SRC, cpu_flags  # noqa: E402

TEST_C = REPO / "tests" / "c" / "test_nuq_decode.c"
# -ffp-contract=off: the reference's own product-then-sum is not fused into an FMA by the compiler
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
          f"-I{REPO / 'ggml_ext' / 'include'}", f"-I{SRC}"]
IS_X86 = platform.machine() in ("x86_64", "AMD64")


def _build(cc: str, march: str, out: Path, static: bool = False) -> Path:
    cmd = [cc, *CFLAGS, f"-march={march}", str(TEST_C), *map(str, SOURCES), "-lm", "-o", str(out)]
    if static:
        cmd.insert(1, "-static")
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


def _run(cmd: list[str], impls: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    m = re.search(r"^(\d+) passed, (\d+) failed$", r.stdout, re.M)
    assert m and r.returncode == 0 and int(m.group(2)) == 0 and int(m.group(1)) >= 900, out
    assert f"implementations: {impls}\n" in r.stdout, out


@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
def test_native_simd_against_scalar(tmp_path):
    impls = "generic avx2" if {"avx2", "fma", "f16c"} <= cpu_flags() else "generic"
    _run([str(_build("gcc", "native", tmp_path / "t_native"))], impls)


@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
def test_native_without_avx2(tmp_path):
    _run([str(_build("gcc", "x86-64", tmp_path / "t_x86_64"))], "generic")


@pytest.mark.qemu
def test_aarch64_neon_under_qemu(tmp_path):
    missing = [t for t in ("aarch64-linux-gnu-gcc", "qemu-aarch64-static") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: gcc-aarch64-linux-gnu, qemu-user-static)")
    exe = _build("aarch64-linux-gnu-gcc", "armv8-a", tmp_path / "t_arm", static=True)
    _run(["qemu-aarch64-static", "-cpu", "max", str(exe)], "generic neon")
