"""The patch series applies to a pristine copy of the pinned tree, and a bad patch fails loudly."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import apply_patches  # noqa: E402
import fetch_llama_cpp  # noqa: E402

PATCHES = REPO / "ggml_ext" / "patches"


@pytest.fixture(scope="module")
def pristine() -> Path:
    return fetch_llama_cpp.pristine_tree()


def test_pristine_tree_is_the_pinned_commit(pristine):
    marker = (pristine / ".ggml-ext-pristine").read_text()
    assert fetch_llama_cpp.SHA256 in marker and fetch_llama_cpp.COMMIT in marker
    # the pristine tree carries none of our hooks
    assert "ggml_ext" not in (pristine / "src" / "llama.cpp").read_text()


def test_series_applies_in_order_to_a_fresh_copy(pristine, tmp_path):
    patches = apply_patches.patch_files(PATCHES)
    assert patches and [p.name for p in patches] == sorted(p.name for p in patches)
    assert all(p.name[:4].isdigit() for p in patches), "patches are named NNNN-name.patch"
    tree = apply_patches.patched_tree(pristine, tmp_path / "tree", PATCHES)
    assert "ggml_ext_system_info()" in (tree / "src" / "llama.cpp").read_text()
    # a second call with nothing changed reuses the copy (stamp), does not re-patch
    stamp = (tree / apply_patches.STAMP).stat().st_mtime_ns
    apply_patches.patched_tree(pristine, tree, PATCHES)
    assert (tree / apply_patches.STAMP).stat().st_mtime_ns == stamp


def test_a_patch_that_does_not_apply_names_file_and_hunk(pristine, tmp_path):
    bad = tmp_path / "patches"
    bad.mkdir()
    (bad / "0001-bad.patch").write_text(
        "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -1,3 +1,4 @@\n"
        " this line is not in llama.cpp\n+added\n another missing line\n yet another\n")
    dest = tmp_path / "tree"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "apply_patches.py"), "--pristine", str(pristine),
                           "--dest", str(dest), "--patches", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "0001-bad.patch does not apply" in proc.stderr
    assert "Hunk #1 FAILED" in proc.stderr
    assert not dest.exists(), "no half-patched tree is left behind"
