"""Where ggml-ext keeps downloaded and generated files."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """The root of ggml-ext's cache; nothing is created.

    ``$GGML_EXT_CACHE`` if set, else ``$XDG_CACHE_HOME/ggml-ext`` (when that is an
    absolute path, as the XDG spec requires), else ``~/.cache/ggml-ext``.  Read on
    every call, so changing the environment takes effect at once.
    """
    explicit = os.environ.get("GGML_EXT_CACHE")
    if explicit:
        return Path(explicit).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "ggml-ext"
    return Path.home() / ".cache" / "ggml-ext"
