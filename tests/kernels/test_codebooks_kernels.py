"""Codebooks kernels (CB2 / CB3 x Q8_K, ggml_ext/src/{generic,x86,arm}/codebooks*.c): the C program
tests/c/test_codebooks_kernels.c checks every compiled-in, usable implementation against the scalar
twin (and the twin against a double-precision dot of the dequantized bytes). Built natively, for
plain x86-64 (the scalar path alone: what any x86-64 without AVX2 runs), and cross-built for aarch64
under qemu (NEON dotprod; plain armv8-a: the scalar fallback)."""
from __future__ import annotations

import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

import qemu_support as qs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from kernel_sources import CODEBOOKS as SOURCES, SRC  # noqa: E402

TEST_C = REPO / "tests" / "c" / "test_codebooks_kernels.c"
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", f"-I{REPO / 'ggml_ext' / 'include'}", f"-I{SRC}"]
QEMU = ["qemu-aarch64-static", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu"]
IS_X86 = platform.machine() in ("x86_64", "AMD64")


def _build(cc: str, march: str, out: Path) -> Path:
    cmd = [cc, *CFLAGS, f"-march={march}", str(TEST_C), *map(str, SOURCES), "-lm", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def _run(cmd: list[str], impls: str, dispatched: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    m = re.search(r"^(\d+) passed, (\d+) failed$", r.stdout, re.M)
    assert m and r.returncode == 0 and int(m.group(2)) == 0, out
    assert f"implementations: {impls}\n" in r.stdout, out
    assert f"dispatched: cb2 {dispatched}, cb3 {dispatched}\n" in r.stdout, out
    # every SIMD implementation adds 2 x 6 x 3 kernel comparisons to the 5 reference checks
    assert int(m.group(1)) == 5 + 36 * (len(impls.split()) - 1), out
    return out


@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
def test_x86_scalar_only(tmp_path):
    """-march=x86-64: no AVX2 compiled in, the scalar reference runs everything."""
    _run([str(_build("gcc", "x86-64", tmp_path / "t_x86_64"))], "generic", "generic")


@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
def test_x86_avx2(tmp_path):
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if not all(f in flags.split() for f in ("avx2", "fma", "f16c")):
        pytest.skip("this CPU has no AVX2")
    _run([str(_build("gcc", "x86-64-v3", tmp_path / "t_v3"))], "generic avx2", "avx2")


@pytest.mark.qemu
@pytest.mark.parametrize("march,impls,dispatched", [
    ("armv8.2-a+dotprod", "generic neon-dotprod", "neon-dotprod"),
    ("armv8-a", "generic", "generic"),
])
def test_aarch64_under_qemu(tmp_path, march, impls, dispatched):
    cc, runner = qs.arm_target(march, QEMU)  # on an aarch64 host: built and run natively
    exe = _build(cc, march, tmp_path / f"t_{march.replace('+', '_')}")
    _run([*runner, str(exe)], impls, dispatched)
