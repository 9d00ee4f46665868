"""Interleaved Q4_0 and IQ4_NL kernels (ggml_ext/src/q4_0_interleaved*, iq4_nl_interleaved.h,
one library: the IQ4_NL kernels are the Q4_0 ones with a table-lookup weight decode): the C test program
tests/c/test_interleaved4.c built natively (every SIMD kernel of this CPU against the
scalar reference, plus builds without AVX-512 and without AVX2 to prove the fallbacks) and
cross-built for aarch64 and run under qemu (NEON dotprod, i8mm, and plain armv8-a; and a
Neoverse V1 build with SVE run at 256-bit vectors, where the SVE-256 Q4_0_8_8 kernels are
tested and dispatched, and at 128 and 512 bits, where the dispatcher must keep NEON).

Every run also compares our Q4_0 and Q8_0 reference quantizers (and each SIMD Q8_0
quantizer) with ggml's own, byte for byte: libggml-base's ggml_quantize_chunk and
dequantize_row_q4_0 make a fixture through ctypes, which the C program checks.

Byte compatibility with llama.cpp's interleaved files: tests/c/test_interleaved4_upstream_compat.c
links the pinned tree's own arch/{x86,arm}/repack.cpp (compiled as is) and runs upstream's
SIMD kernels on our repacked weights (x86: Q4_0_8_8, IQ4_NL_8_8; Arm: Q4_0_4_4, Q4_0_4_8 with i8mm,
IQ4_NL_4_4, and with SVE at 256 bits also Q4_0_8_8).
Builds go to pytest's tmp dir.
"""
from __future__ import annotations

import ctypes
import platform
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qemu_support as qs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from kernel_sources import INTERLEAVED4 as SOURCES, SRC, cpu_flags  # noqa: E402

TEST_C = REPO / "tests" / "c" / "test_interleaved4.c"
COMPAT_C = REPO / "tests" / "c" / "test_interleaved4_upstream_compat.c"
# gnu11 as ggml's CMake build (C_EXTENSIONS): GCC then contracts a * b + c into fma
# (-ffp-contract=fast), which the reference quantizers must be immune to.
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", f"-I{REPO / 'ggml_ext' / 'include'}", f"-I{SRC}"]
QEMU = ["qemu-aarch64-static", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu"]
GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 = 2, 8

IS_X86 = platform.machine() in ("x86_64", "AMD64")


def _build(cc: str, march: str, out: Path, main: Path = TEST_C, extra: tuple[Path, ...] = ()) -> Path:
    """march: an -march value, or a whole target flag such as -mcpu=neoverse-v1."""
    cmd = [cc, *CFLAGS, march if march.startswith("-m") else f"-march={march}", str(main), *map(str, SOURCES), *map(str, extra), "-lm", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


def _build_upstream_repack(cxx: str, arch: str, march: str, out: Path) -> Path:
    """The pinned tree's ggml/src/ggml-cpu/arch/<arch>/repack.cpp, compiled unmodified."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_llama_cpp.py"), "tree"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"the pinned llama.cpp tree is not available: {r.stderr.strip()[-300:]}")
    ggml = Path(r.stdout.strip().splitlines()[-1]) / "ggml"
    cmd = [cxx, "-std=c++17", "-O2", "-DNDEBUG", f"-march={march}", f"-I{ggml / 'include'}", f"-I{ggml / 'src'}",
           f"-I{ggml / 'src' / 'ggml-cpu'}", "-c", str(ggml / "src" / "ggml-cpu" / "arch" / arch / "repack.cpp"),
           "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


def _run_summary(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    m = re.search(r"^(\d+) passed, (\d+) failed$", r.stdout, re.M)
    assert m and r.returncode == 0 and int(m.group(2)) == 0 and int(m.group(1)) > 0, out
    return out


def _run(cmd: list[str], expect_impls: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", last)
    assert m, f"no summary line:\n{out}"
    assert r.returncode == 0 and int(m.group(2)) == 0 and int(m.group(1)) > 0, out
    assert f"implementations: {expect_impls}\n" in r.stdout, out
    return out


def _same(name: str) -> dict[str, tuple[str, str]]:
    """One implementation for the GEMV and GEMM of every layout."""
    return {lay: (name, name) for lay in ("4x4", "4x8", "8x8")}


# neon-i8mm has only the B = 8 GEMMs; the GEMVs and the 4x4 GEMM stay on SDOT
NEON_I8MM = {"4x4": ("neon-dotprod", "neon-dotprod"), "4x8": ("neon-dotprod", "neon-i8mm"),
             "8x8": ("neon-dotprod", "neon-i8mm")}


def _assert_dispatched(out: str, q4_0: dict[str, tuple[str, str]], iq4_nl: dict[str, tuple[str, str]]) -> None:
    """The program's "dispatched FAMILY LAYOUT: gemv X, gemm Y" lines are these, for both families
    (the program itself checks that each named kernel is the one its entry points run)."""
    for fam, table in (("q4_0", q4_0), ("iq4_nl", iq4_nl)):
        for lay, (gemv, gemm) in table.items():
            assert f"dispatched {fam} {lay}: gemv {gemv}, gemm {gemm}\n" in out, out


def _fixture_floats(rng: np.random.Generator) -> np.ndarray:
    """Blocks that exercise every rounding decision of the Q4_0 and Q8_0 references."""
    blocks = [
        rng.standard_normal((1024, 32)) * rng.choice([1e-3, 1.0, 30.0], size=(1024, 1)),
        rng.uniform(-1, 1, (256, 32)),
        np.zeros((4, 32)),
        np.full((4, 32), -2.5),
        rng.standard_normal((64, 32)) * 1e-6,     # deltas in the fp16 subnormal range
        rng.standard_normal((16, 32)) * 1e-9,     # deltas that flush to zero in fp16
        rng.standard_normal((16, 32)) * 2e6,      # deltas that overflow to inf in fp16
    ]
    ties = rng.standard_normal((256, 32))  # largest magnitude twice, opposite signs
    ties[:, 5] = np.abs(ties).max(axis=1) * 1.5
    ties[:, 20] = -ties[:, 5]
    ties[128:, [5, 20]] = ties[128:, [20, 5]]
    blocks.append(ties)
    # values whose x / d lands within two ulps of a rounding edge k + 0.5, for the Q4_0
    # scale (d = max / -8, even rows) and the Q8_0 scale (d = amax / 127, odd rows)
    edge = np.empty((4096, 32), dtype=np.float32)
    for i in range(edge.shape[0]):
        m = np.float32(rng.uniform(0.1, 10.0) * rng.choice([-1.0, 1.0]))
        d, kmax = (m / np.float32(-8.0), 8) if i % 2 == 0 else (abs(m) / np.float32(127.0), 127)
        k = rng.integers(-kmax, kmax, size=31).astype(np.float32) + np.float32(0.5)
        x = (k / (np.float32(1.0) / d)).astype(np.float32)
        x = (x.view(np.int32) + rng.integers(-2, 3, size=31).astype(np.int32)).view(np.float32)
        edge[i, 0] = m
        edge[i, 1:] = np.clip(x, -abs(m), abs(m))
    blocks.append(edge)
    return np.concatenate([np.asarray(b, dtype=np.float32).reshape(-1, 32) for b in blocks]).reshape(-1)


@pytest.fixture(scope="module")
def ggml_fixture(tmp_path_factory) -> Path:
    """floats + ggml's Q4_0 bytes, ggml's dequantized Q4_0 and ggml's Q8_0 bytes."""
    from ggml_ext import _locate

    try:
        lib = ctypes.CDLL(str(_locate.library("ggml-base")))
    except (_locate.NotBuiltError, OSError) as e:
        pytest.skip(f"libggml-base of the installed package is needed for the ggml comparison: {e}")
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.dequantize_row_q4_0.restype = None
    lib.dequantize_row_q4_0.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    x = np.ascontiguousarray(_fixture_floats(np.random.default_rng(4)))
    n = x.size
    q4 = np.zeros(n // 32 * 18, dtype=np.uint8)
    q8 = np.zeros(n // 32 * 34, dtype=np.uint8)
    dq = np.zeros(n, dtype=np.float32)
    assert lib.ggml_quantize_chunk(GGML_TYPE_Q4_0, x.ctypes.data, q4.ctypes.data, 0, n // 32, 32, None) == q4.size
    assert lib.ggml_quantize_chunk(GGML_TYPE_Q8_0, x.ctypes.data, q8.ctypes.data, 0, n // 32, 32, None) == q8.size
    lib.dequantize_row_q4_0(q4.ctypes.data, dq.ctypes.data, n)
    path = tmp_path_factory.mktemp("q4_0_fixture") / "ggml_q4_0_q8_0.bin"
    path.write_bytes(struct.pack("<q", n) + x.tobytes() + q4.tobytes() + dq.tobytes() + q8.tobytes())
    return path


@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
def test_native_every_simd_kernel(tmp_path, ggml_fixture):
    flags = cpu_flags()
    impls = "generic"
    if {"avx2", "fma", "f16c"} <= flags:
        impls += " avx2"
        if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
            impls += " avx512-vnni"
    exe = _build("gcc", "native", tmp_path / "t_native")
    out = _run([str(exe), "--ggml-fixture", str(ggml_fixture)], impls)
    assert re.search(r"ggml fixture: \d+ blocks compared", out), out
    best = _same(impls.split()[-1])  # every x86 implementation has all twelve kernels
    _assert_dispatched(out, best, best)


@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
@pytest.mark.parametrize("march,impls", [("x86-64-v3", "generic avx2"), ("x86-64", "generic")])
def test_native_fallbacks(tmp_path, ggml_fixture, march, impls):
    if "avx2" in impls and "avx2" not in cpu_flags():
        pytest.skip("this CPU has no AVX2")
    exe = _build("gcc", march, tmp_path / f"t_{march}")
    out = _run([str(exe), "--ggml-fixture", str(ggml_fixture)], impls)
    best = _same(impls.split()[-1])  # x86-64: the scalar fallback for everything
    _assert_dispatched(out, best, best)


@pytest.mark.qemu
@pytest.mark.parametrize(
    "march,impls,dispatched",
    [
        ("armv8.6-a+dotprod+i8mm", "generic neon-dotprod neon-i8mm", NEON_I8MM),
        ("armv8.2-a+dotprod", "generic neon-dotprod", _same("neon-dotprod")),  # B = 8 GEMM without i8mm
        ("armv8-a", "generic", _same("generic")),                              # scalar fallback for every layout
    ],
)
def test_aarch64_under_qemu(tmp_path, ggml_fixture, march, impls, dispatched):
    cc, runner = qs.arm_target(march, QEMU)  # on an aarch64 host: built and run natively
    exe = _build(cc, march, tmp_path / f"t_{march.replace('+', '_')}")
    out = _run([*runner, str(exe), "--ggml-fixture", str(ggml_fixture)], impls)
    assert re.search(r"ggml fixture: \d+ blocks compared", out), out
    _assert_dispatched(out, dispatched, dispatched)


# SVE-256 Q4_0_8_8 kernels (arm/q4_0_interleaved_sve.c): built for Neoverse V1, run by qemu
# with 32-byte vectors they are tested against the scalar reference and dispatched for Q4_0_8_8
# (IQ4_NL_8_8 has no SVE kernel: it stays on NEON); with 16- and 64-byte vectors (Neoverse V2,
# A64FX) the same binary must not use them.
@pytest.mark.qemu
@pytest.mark.parametrize(
    "vl_bytes,impls,q4_0_8x8",
    [
        (32, "generic neon-dotprod neon-i8mm sve256-i8mm", ("sve256-i8mm", "sve256-i8mm")),
        (16, "generic neon-dotprod neon-i8mm", NEON_I8MM["8x8"]),
        (64, "generic neon-dotprod neon-i8mm", NEON_I8MM["8x8"]),
    ],
)
def test_aarch64_sve_under_qemu(tmp_path_factory, ggml_fixture, vl_bytes, impls, q4_0_8x8):
    if qs.AARCH64_HOST:
        pytest.skip("sets the SVE vector length through qemu, which an aarch64 host's build does not use")
    qemu = ["qemu-aarch64-static", "-cpu", f"max,sve-default-vector-length={vl_bytes}", "-L", qs.SYSROOT]
    cc, runner = qs.arm_target("armv8-a", qemu)  # the cross compiler and qemu, or skip
    exe = tmp_path_factory.getbasetemp() / "t_neoverse_v1"
    if not exe.exists():
        exe = _build(cc, "-mcpu=neoverse-v1", exe.with_suffix(".tmp"))
        exe = exe.rename(exe.with_suffix(""))
    out = _run([*runner, str(exe), "--ggml-fixture", str(ggml_fixture)], impls)
    _assert_dispatched(out, {**NEON_I8MM, "8x8": q4_0_8x8}, NEON_I8MM)
    assert ("not usable here: sve256-i8mm\n" in out) == (vl_bytes != 32), out


@pytest.mark.skipif(not IS_X86, reason="x86 builds run on x86 hosts")
def test_upstream_x86_kernels_read_our_bytes(tmp_path):
    if not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("upstream's x86 Q4_0_8_8 kernels need AVX2")
    up = _build_upstream_repack("g++", "x86", "native", tmp_path / "upstream_x86_repack.o")
    exe = _build("gcc", "native", tmp_path / "t_compat", COMPAT_C, (up,))
    _run_summary([str(exe), "8x8,iq4_nl_8x8"])


@pytest.mark.qemu
def test_upstream_arm_kernels_read_our_bytes(tmp_path):
    missing = [t for t in ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++", "qemu-aarch64-static")
               if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: gcc-aarch64-linux-gnu, "
                    "g++-aarch64-linux-gnu, qemu-user-static)")
    march = "armv8.6-a+dotprod+i8mm"
    up = _build_upstream_repack("aarch64-linux-gnu-g++", "arm", march, tmp_path / "upstream_arm_repack.o")
    exe = _build("aarch64-linux-gnu-gcc", march, tmp_path / "t_compat", COMPAT_C, (up,))
    _run_summary([*QEMU, str(exe), "4x4,4x8,iq4_nl_4x4"])
    # with SVE at 256-bit vectors upstream's Q4_0_8_8 kernels are SIMD too (its SVE code)
    march += "+sve"
    up = _build_upstream_repack("aarch64-linux-gnu-g++", "arm", march, tmp_path / "upstream_arm_repack_sve.o")
    exe = _build("aarch64-linux-gnu-gcc", march, tmp_path / "t_compat_sve", COMPAT_C, (up,))
    qemu = ["qemu-aarch64-static", "-cpu", "max,sve-default-vector-length=32", "-L", "/usr/aarch64-linux-gnu"]
    out = _run_summary([*qemu, str(exe), "4x4,4x8,8x8"])
    assert "upstream 8x8 scalar fallback calls: 0\n" in out, out
