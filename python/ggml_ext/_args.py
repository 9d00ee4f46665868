"""argparse value types whose errors name what the flag takes.

argparse names the flag itself ("argument --apq-bits: ..."); these add the allowed values, so that
``--apq-bits abc`` says ``'abc' is not an integer; use 1..8`` rather than ``invalid int value``, and a list
flag (``--bits 2,x``) fails in argparse, before any work, instead of as a traceback later.
"""
from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["int_range", "int_list", "ranges"]


def _int(s: str, lo: int, hi: int, what: str = "an integer") -> int:
    try:
        v = int(s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not {what}; use {lo}..{hi}") from None
    if not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"{v} is out of range; use {lo}..{hi}")
    return v


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """One integer lo..hi."""
    def parse(s: str) -> int:
        return _int(s, lo, hi)
    parse.__name__ = f"integer {lo}..{hi}"
    return parse


def int_list(lo: int, hi: int, empty: bool = False) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers, each lo..hi (``empty``: "" is no values)."""
    def parse(s: str) -> tuple[int, ...]:
        parts = [p for p in s.split(",") if p.strip()]
        if not parts and not empty:
            raise argparse.ArgumentTypeError(f"'{s}' lists no values; use integers {lo}..{hi}, e.g. {lo},{hi}")
        try:
            return tuple(_int(p, lo, hi) for p in parts)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"in '{s}': {e}") from None
    parse.__name__ = f"list of integers {lo}..{hi}"
    return parse


def ranges(lo: int = 0, hi: int = 1 << 20) -> Callable[[str], set[int]]:
    """Integers and ranges, "0-3,8": a set of integers lo..hi."""
    def parse(s: str) -> set[int]:
        out: set[int] = set()
        for part in s.split(","):
            a, dash, b = part.partition("-")
            try:
                x, y = _int(a, lo, hi), _int(b, lo, hi) if dash else None
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"in '{s}': {e} (a list like 0-3,8)") from None
            y = x if y is None else y
            if y < x:
                raise argparse.ArgumentTypeError(f"in '{s}': the range {part} is empty (a list like 0-3,8)")
            out.update(range(x, y + 1))
        return out
    parse.__name__ = "list of integers and ranges"
    return parse
