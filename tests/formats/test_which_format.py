"""README's "Which format?" table is the one ggml_ext.guide makes from the format registry, and what
the guide adds to the registry (kernels per architecture, links into docs/RESULTS.md) is true of the
C sources and of what this CPU dispatches."""
from __future__ import annotations

import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ggml_ext import formats, guide

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
RESULTS = REPO / "docs" / "RESULTS.md"
SRC = REPO / "ggml_ext" / "src"


def test_readme_table_is_the_generated_one():
    current = guide.readme_table(README.read_text())
    assert current == guide.markdown(), (
        "README's \"Which format?\" table differs from the registry's: run "
        "`python -m ggml_ext.guide --write README.md` and commit README.md")


def test_info_types_markdown_prints_the_table():
    r = subprocess.run([sys.executable, "-m", "ggml_ext.cli", "info", "--types", "--markdown"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == guide.markdown()


def test_guide_check_mode_sees_a_stale_table(tmp_path):
    stale = README.read_text().replace("| `Q8_0` |", "| `Q8_1` |", 1)
    p = tmp_path / "README.md"
    p.write_text(stale)
    assert guide.main(["--check", str(p)]) == 1
    assert guide.main(["--write", str(p)]) == 0
    assert guide.main(["--check", str(p)]) == 0
    assert p.read_text() == README.read_text()


def test_every_ggml_ext_type_has_a_row():
    listed = {e.name for e in guide.ENTRIES}
    missing = [t.name for t in formats.ext_types() if t.name not in listed]
    assert not missing, f"add a row to ggml_ext/guide.py ENTRIES for {missing}"


def test_the_columns_taken_from_the_registry():
    table = {r["name"]: r for r in formats.table()}
    for r in guide.rows():
        t = table[r["name"]]
        assert r["bits_per_weight"] == t["bits_per_weight"] and r["stock_readable"] == t["stock_readable"]


def _string_literals(arch: str, family: str) -> set[str]:
    """Quoted strings of the family's kernel sources for one arch (src/<arch>/<family>_*.c) and of
    its dispatcher (src/formats/<family>/), where the implementation tables name the kernels."""
    files = [*(SRC / arch).glob(f"{family}_*"), *(SRC / "formats" / family).glob("*")]
    return {m for f in files if f.is_file() for m in re.findall(r'"([a-z0-9-]+)"', f.read_text())}


@pytest.mark.parametrize("arch", ["x86", "arm"])
def test_kernel_names_are_the_sources_names(arch):
    for e in guide.ENTRIES:
        names = getattr(e, arch)
        if not names:
            continue
        t = formats.by_name(e.name)
        # a stock type with our kernels: plain Q4_0, which the runtime repack runs as interleaved Q4_0
        family = t.family if t is not None else "interleaved4"
        known = _string_literals(arch, family)
        assert set(names) <= known, f"{e.name}: {sorted(set(names) - known)} not among {family}'s {arch} kernels"


def test_this_cpu_dispatches_a_listed_kernel():
    arch = {"x86_64": "x86", "AMD64": "x86", "aarch64": "arm", "arm64": "arm"}.get(platform.machine())
    if arch is None:
        pytest.skip(f"no kernel column for {platform.machine()}")
    for e in guide.ENTRIES:
        t = formats.by_name(e.name)
        if t is None:
            continue
        for gemm in (False, True):
            k = formats.dispatched_kernel(t.id, gemm)
            assert k is None or k == "generic" or k in getattr(e, arch), (e.name, gemm, k)


def test_links_go_to_results_sections():
    headings = set(re.findall(r"^## (.+?)\s*$", RESULTS.read_text(), re.M))
    for e in guide.ENTRIES:
        assert e.results in headings, f"{e.name}: docs/RESULTS.md has no section '## {e.results}'"
