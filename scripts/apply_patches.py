#!/usr/bin/env python3
"""Make a patched copy of the pristine llama.cpp tree.

Copies the pristine tree to DEST and applies ggml_ext/patches/NNNN-*.patch in
order. A patch that does not apply stops with its file name and the hunk that
failed; nothing half-patched is left behind. The copy is redone only when the
pristine tree or a patch changes (a stamp file records both).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Parts of the pristine tree the build never reads (large, or docs only).
SKIP = {"models", "docs", "media", ".git", ".github", "benches", "pocs"}
STAMP = ".ggml-ext-patched"


def patch_files(patch_dir: Path) -> list[Path]:
    return sorted(p for p in patch_dir.glob("*.patch") if p.is_file())


def stamp_for(pristine: Path, patches: list[Path]) -> str:
    h = hashlib.sha256()
    marker = pristine / ".ggml-ext-pristine"
    h.update(marker.read_bytes() if marker.exists() else str(pristine).encode())
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def apply_one(tree: Path, patch: Path) -> None:
    # --fuzz=0: a hunk applies only where all its context matches; never guess a place.
    args = ["patch", "-p1", "--forward", "--fuzz=0", "--batch", "--no-backup-if-mismatch",
            "-d", str(tree), "-i", str(patch.resolve())]
    # the dry run's messages name the file and the hunk that failed
    dry = subprocess.run(args + ["--dry-run"], capture_output=True, text=True)
    if dry.returncode != 0:
        detail = (dry.stdout + dry.stderr).strip()
        raise SystemExit(f"error: patch {patch.name} does not apply to the pinned llama.cpp tree:\n{detail}")
    subprocess.run(args + ["--silent"], check=True)


def patched_tree(pristine: Path, dest: Path, patch_dir: Path, force: bool = False) -> Path:
    patches = patch_files(patch_dir)
    stamp = stamp_for(pristine, patches)
    if not force and (dest / STAMP).is_file() and (dest / STAMP).read_text().strip() == stamp:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".patching-"))
    try:
        work = tmp / "tree"
        shutil.copytree(pristine, work, symlinks=True,
                        ignore=lambda d, names: SKIP & set(names) if Path(d) == pristine else set())
        for p in patches:
            print(f"[ggml-ext] applying {p.name}", file=sys.stderr)
            apply_one(work, p)
        (work / STAMP).write_text(stamp + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pristine", required=True, type=Path)
    ap.add_argument("--dest", required=True, type=Path)
    ap.add_argument("--patches", required=True, type=Path)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    print(patched_tree(a.pristine.resolve(), a.dest.resolve(), a.patches, a.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
