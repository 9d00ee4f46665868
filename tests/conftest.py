"""Shared fixtures: the real default model and texts (fetched by `make test`), our tools."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Tests run against the installed package; fall back to the source tree for pure-Python modules.
try:
    import ggml_ext  # noqa: F401
except ImportError:  # pragma: no cover - only when running without `make install`
    sys.path.insert(0, str(REPO / "python"))


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 blocks, Q8_0 embedding), the project's default model."""
    from ggml_ext import assets
    return assets.path("smollm2-gguf")


@pytest.fixture(scope="session")
def wiki_test() -> Path:
    from ggml_ext import assets
    return assets.path("wiki-test")


@pytest.fixture(scope="session")
def tool_env() -> dict[str, str]:
    from ggml_ext import tools
    return tools.tool_env()


@pytest.fixture(scope="session")
def threads() -> int:
    return max(1, min(2, os.cpu_count() or 1))
