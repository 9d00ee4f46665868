"""KVQuant's C kernels, each program built natively (every SIMD implementation of this CPU against the scalar
reference, and a build without AVX2 where the scalar code runs) and cross-built for aarch64 and run under qemu
(NEON); compiled outside CMake from scripts/kernel_sources.py's lists, like the interleaved kernels' test. A
second of run time each; qemu a few.

- tests/c/test_kvquant.c (KVQUANT): the KV-cache row kernels of ggml_ext/src/formats/kvquant and
  generic/x86/arm kvquant*.c (append, q . RoPE(K), attention . V).
- tests/c/test_nuq_decode.c (NUQ_DECODE): the NUQ4/3/2 cache types' block decode (formats/kvquant/kvquant_decode.h:
  the value path's to_float per head and the pre-RoPE key path's dequantization), bit for bit against the
  scalar reference, which is also checked against the row kernel's dequantization."""
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
from kernel_sources import KVQUANT, NUQ_DECODE, SRC, cpu_flags  # noqa: E402

CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{REPO / 'ggml_ext' / 'include'}", f"-I{SRC}"]
IS_X86 = platform.machine() in ("x86_64", "AMD64")

# program -> (test source, kernel sources, extra flags, the fewest checks a run makes)
PROGRAMS = {
    "kvquant": (REPO / "tests" / "c" / "test_kvquant.c", KVQUANT, [], 1001),
    # -ffp-contract=off: the reference's own product-then-sum is not fused into an FMA by the compiler
    "nuq_decode": (REPO / "tests" / "c" / "test_nuq_decode.c", NUQ_DECODE, ["-ffp-contract=off"], 900),
}


def _build(program: str, cc: str, march: str, out: Path, static: bool = False) -> Path:
    test_c, sources, extra, _ = PROGRAMS[program]
    cmd = [cc, *CFLAGS, *extra, f"-march={march}", str(test_c), *map(str, sources), "-lm", "-o", str(out)]
    if static:
        cmd.insert(1, "-static")
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


def _run(program: str, cmd: list[str], impls: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    m = re.search(r"^(\d+) passed, (\d+) failed$", r.stdout, re.M)
    assert m and r.returncode == 0 and int(m.group(2)) == 0 and int(m.group(1)) >= PROGRAMS[program][3], out
    assert f"implementations: {impls}\n" in r.stdout, out
    return out


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
def test_native_simd_against_scalar(program, tmp_path):
    impls = "generic avx2" if {"avx2", "fma", "f16c"} <= cpu_flags() else "generic"
    _run(program, [str(_build(program, "gcc", "native", tmp_path / "t_native"))], impls)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
def test_native_without_avx2(program, tmp_path):
    _run(program, [str(_build(program, "gcc", "x86-64", tmp_path / "t_x86_64"))], "generic")


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.qemu
def test_aarch64_neon_under_qemu(program, tmp_path):
    cc, runner = qs.arm_target("armv8-a", ["qemu-aarch64-static", "-cpu", "max"])  # aarch64 host: natively
    exe = _build(program, cc, "armv8-a", tmp_path / "t_arm", static=True)
    _run(program, [*runner, str(exe)], "generic neon")
