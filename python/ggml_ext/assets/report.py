"""How the assets code reports: :class:`AssetError` for failures, :class:`UI` for progress."""
from __future__ import annotations

import sys
from typing import Any

BIG = 64 << 20  # files above this get a progress bar when hashed or unpacked


class AssetError(RuntimeError):
    """An asset is unknown, not fetched, damaged, or could not be fetched."""


def mismatch(what: str, expected: str, actual: str, advice: str = "") -> AssetError:
    return AssetError(f"sha256 mismatch for {what}: expected {expected}, actual {actual}{advice}")


class UI:
    """Progress to stderr, or nothing."""

    def __init__(self, progress: bool) -> None:
        self.progress = progress

    def say(self, message: str) -> None:
        if self.progress:
            print(f"ggml-ext assets: {message}", file=sys.stderr, flush=True)

    def bar(self, total: int | None, desc: str, unit: str = "B") -> Any:
        from tqdm import tqdm

        scale = unit == "B"
        return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                    disable=not self.progress, file=sys.stderr, leave=False)
