#!/usr/bin/env python3
"""Fetch the pinned llama.cpp source (vendored in the llama-cpp-python sdist).

The sdist comes from PyPI, is checked against a fixed sha256 and unpacked once
into the cache; later builds reuse it. Prints the path of the pristine tree.

Environment:
  GGML_EXT_LLAMA_CPP_SRC  use this unpacked llama.cpp tree instead (not checked)
  GGML_EXT_CACHE          cache root (default: $XDG_CACHE_HOME/ggml-ext or ~/.cache/ggml-ext)
"""
from __future__ import annotations

import gzip
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
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
COMMIT = "0c1e57098"
# The pinned sdist has no prebuilt web UI (upstream now downloads it from a model hub at
# build time). The last sdist that vendored llama.cpp's single-file UI is 0.3.16.
WEBUI_VERSION = "0.3.16"
WEBUI_SHA256 = "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
WEBUI_MEMBER = f"llama_cpp_python-{WEBUI_VERSION}/vendor/llama.cpp/tools/server/public/index.html.gz"


def sdist_name(version: str) -> str:
    return f"llama_cpp_python-{version}.tar.gz"


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


def download_sdist(dest_dir: Path, version: str = VERSION, sha256: str = SHA256) -> Path:
    """Download a llama-cpp-python sdist with pip (falling back to the PyPI file URL); check its digest."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    name = sdist_name(version)
    target = dest_dir / name
    if target.exists() and sha256_of(target) == sha256:
        return target
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
               "--no-binary", PACKAGE, "--no-build-isolation", "-q",
               "-d", tmp, f"{PACKAGE}=={version}"]
        log(f"downloading {name} from PyPI")
        got = Path(tmp) / name
        if subprocess.run(cmd).returncode != 0 or not got.exists():
            url = f"https://files.pythonhosted.org/packages/source/l/llama_cpp_python/{name}"
            log("pip download failed; trying " + url)
            with urllib.request.urlopen(url, timeout=300) as r, open(got, "wb") as f:
                shutil.copyfileobj(r, f)
        digest = sha256_of(got)
        if digest != sha256:
            raise SystemExit(f"error: {name} has sha256 {digest}, expected {sha256}; refusing to use it")
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


def webui() -> Path:
    """llama.cpp's single-file web UI (index.html), unpacked into the cache."""
    dest = cache_root() / f"webui-{WEBUI_VERSION}"
    if (dest / "index.html").is_file():
        return dest
    sdist = download_sdist(cache_root() / "sdist", WEBUI_VERSION, WEBUI_SHA256)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        data = gzip.decompress(tar.extractfile(WEBUI_MEMBER).read())
    tmp = dest / "index.html.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, dest / "index.html")
    return dest


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
    elif what == "webui":
        print(webui())
    else:
        raise SystemExit("usage: fetch_llama_cpp.py [tree|sdist|webui]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
