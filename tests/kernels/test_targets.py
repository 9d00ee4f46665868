"""The CPU target table (python/ggml_ext/targets.py, explained in docs/ARM.md): every flag
set it documents compiles our interleaved Q4_0 kernel library (aarch64-linux-gnu-gcc for
Arm targets, gcc for x86), and compiles in exactly the implementations the table says, so
each target's chosen layout has its SIMD kernels. Compile only (a few seconds per flag
set); tests/kernels/test_interleaved4_kernels.py runs the kernels under qemu.
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ggml_ext import targets

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from kernel_sources import INTERLEAVED4 as SOURCES, SRC  # noqa: E402

# implementation name -> the symbol of its table (formats/interleaved4/interleaved4_impl.h)
SYMBOL = {"neon-dotprod": "neon_dotprod", "neon-i8mm": "neon_i8mm", "sve256-i8mm": "sve256_i8mm",
          "avx2": "avx2", "avx512-vnni": "avx512vnni", "generic": "generic"}
# the implementation that must be there for each layout's kernels to be SIMD
LAYOUT_NEEDS = {"4x4": {"neon-dotprod", "avx2"}, "4x8": {"neon-i8mm", "avx2"}, "8x8": {"neon-i8mm", "sve256-i8mm", "avx2"}}


def _compiled_impls(cc: str, flags: list[str], tmp: Path) -> set[str]:
    """Implementations defined by the kernel library compiled with flags."""
    tmp.mkdir(parents=True, exist_ok=True)
    # one compiler run; links with distinct names, since generic/, x86/ and arm/ share file names
    # (their own includes resolve through -I of each folder)
    links = []
    for src in SOURCES:
        links.append(tmp / f"{src.parent.name}_{src.name}")
        links[-1].symlink_to(src)
    dirs = sorted({src.parent for src in SOURCES} | {SRC})
    cmd = [cc, "-std=gnu11", "-O2", "-Wall", "-Werror", *flags, f"-I{REPO / 'ggml_ext' / 'include'}",
           *(f"-I{d}" for d in dirs), "-c", *(ln.name for ln in links)]
    r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    nm = shutil.which(cc.replace("gcc", "nm")) or "nm"
    out = subprocess.run([nm, "--defined-only", *sorted(map(str, tmp.glob("*.o")))], capture_output=True, text=True,
                         check=True).stdout
    syms = set(re.findall(r"\bggml_ext_interleaved4_impl_(\w+)$", out, re.M))
    return {name for name, sym in SYMBOL.items() if sym in syms}


def _flag_sets():
    for t in targets.TARGETS.values():
        yield pytest.param(t.name, list(t.cflags), True, id=f"{t.name}:{' '.join(t.cflags)}")
        if t.mcpu:
            yield pytest.param(t.name, [f"-mcpu={t.mcpu}"], False, id=f"{t.name}:-mcpu={t.mcpu}")


@pytest.mark.parametrize("name,flags,exact", list(_flag_sets()))
def test_documented_flags_compile_the_kernels(tmp_path, name, flags, exact):
    t = targets.target(name)
    if t.arm:
        cc = "aarch64-linux-gnu-gcc"
        if shutil.which(cc) is None:
            pytest.skip(f"{cc} not installed (Debian: gcc-aarch64-linux-gnu)")
    else:
        cc = "gcc"
        if platform.machine() not in ("x86_64", "AMD64") or shutil.which(cc) is None:
            pytest.skip("x86 flag sets are compiled by an x86 gcc")
    got = _compiled_impls(cc, flags, tmp_path)
    if exact:  # the -march flags of the table: exactly its kernels
        assert got == set(t.kernels), f"{flags}: {sorted(got)} vs the table's {sorted(t.kernels)}"
    else:  # -mcpu may enable more (cortex-a710: SVE2, whose 128-bit vectors leave SVE-256 unused)
        assert set(t.kernels) <= got, f"{flags}: {sorted(got)} lacks some of {sorted(t.kernels)}"
    assert got & LAYOUT_NEEDS[t.layout], f"{name}: layout {t.layout} would run the scalar reference"


def test_docs_list_every_target():
    doc = (REPO / "docs" / "ARM.md").read_text()
    for t in targets.TARGETS.values():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{t.name}`")), None)
        assert row, f"docs/ARM.md has no table row for {t.name}"
        assert f"`{t.layout}`" in row and f"`{' '.join(t.cflags)}`" in row, row
        if t.mcpu:
            assert f"-mcpu={t.mcpu}" in row, row
        for d in t.cmake_defines:
            assert d in doc, d


def test_unknown_target():
    with pytest.raises(ValueError, match="unknown target 'pentium'.*graviton2"):
        targets.target("pentium")
