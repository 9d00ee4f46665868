"""Atomic file writes: a reader sees the old file or the whole new one, never half.

The data goes to a temporary file in the target's own folder (so that
:func:`os.replace` stays on one file system), is flushed and fsynced, then replaces
the target in one step.  A write that fails leaves the target as it was and removes
its temporary file.  Temporary files are named ``.<target name>.tmp-<random>``, so a
clean-up after a crash can find them.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["json_bytes", "plain_mode", "write_bytes", "write_json", "write_text"]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain_mode(file: Path) -> None:
    """rw for the owner, r for the rest as the umask allows (mkstemp makes 0600)."""
    with contextlib.suppress(OSError):
        os.chmod(file, 0o666 & ~_umask())


def write_bytes(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically (its folder is created if need be)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        plain_mode(Path(tmp))
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(target: Path, text: str) -> None:
    """Write ``text`` as UTF-8 atomically; newlines are written as they are, on every OS."""
    write_bytes(target, text.encode("utf-8"))


def json_bytes(obj: Any) -> bytes:
    """``obj`` as the JSON the writers here produce: indented, UTF-8, final newline."""
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_json(target: Path, obj: Any) -> None:
    """Write ``obj`` as JSON (see :func:`json_bytes`) atomically."""
    write_bytes(target, json_bytes(obj))
