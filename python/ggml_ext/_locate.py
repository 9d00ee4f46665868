"""Where the compiled libraries and tools of this installation live."""
from __future__ import annotations

import os
import sysconfig
from functools import lru_cache
from pathlib import Path


class NotBuiltError(RuntimeError):
    """The compiled part of ggml-ext is missing (package imported from a source tree?)."""


def _candidates() -> list[Path]:
    roots = []
    env = os.environ.get("GGML_EXT_PREFIX")
    if env:
        roots.append(Path(env))
    roots.append(Path(__file__).resolve().parent)
    # Editable installs keep Python files in the source tree and compiled files in site-packages.
    for key in ("platlib", "purelib"):
        roots.append(Path(sysconfig.get_paths()[key]) / "ggml_ext")
    return roots


@lru_cache(maxsize=None)
def prefix() -> Path:
    """The folder holding lib/ and bin/ of our llama.cpp build."""
    for root in _candidates():
        if (root / "lib").is_dir() and any((root / "lib").glob("libllama.*")):
            return root
    raise NotBuiltError(
        "ggml-ext's compiled libraries were not found (looked in "
        + ", ".join(str(c) for c in _candidates())
        + "). Install the package with `pip install .` (or `make install`), "
        "or point GGML_EXT_PREFIX at a folder with lib/ and bin/."
    )


def lib_dir() -> Path:
    return prefix() / "lib"


def bin_dir() -> Path:
    return prefix() / "bin"


def webui_dir() -> Path | None:
    """llama.cpp's web UI (index.html) installed for llama-server's --path, if present."""
    d = prefix() / "share" / "webui"
    return d if (d / "index.html").is_file() else None


def library(name: str) -> Path:
    """Path of lib<name>.so (or .dylib/.dll) in our build."""
    for pattern in (f"lib{name}.so", f"lib{name}.dylib", f"{name}.dll"):
        p = lib_dir() / pattern
        if p.exists():
            return p
    raise NotBuiltError(f"library {name} not found in {lib_dir()}")


def tool(name: str) -> Path:
    """Path of one of our llama.cpp tools (llama-server, llama-cli, ...)."""
    p = bin_dir() / name
    if p.exists() and os.access(p, os.X_OK):
        return p
    have = sorted(x.name for x in bin_dir().iterdir()) if bin_dir().is_dir() else []
    raise NotBuiltError(f"tool {name} not found in {bin_dir()} (have: {', '.join(have) or 'nothing'})")
