"""Atomic file writes: a reader sees the old file or the whole new one, never half.

The data goes to a temporary file in the target's own folder (so that
:func:`os.replace` stays on one file system), is flushed and fsynced, then replaces
the target in one step.  A write that fails leaves the target as it was and removes
its temporary file.

A process killed mid-write (SIGKILL, power loss) cannot clean up, so temporary files
say who made them: ``.<target name>.<host>.<pid>.<random>.tmp``.  The next write to the
same target (:func:`temp_file`) removes those whose owner is gone: made on this host by a
process id that no longer exists.  A live owner's file (a concurrent write) is never
touched, nor a name that does not have this form.  (A dead owner's id reused by an
unrelated process only delays the clean-up until that process ends.)  A writer handed a temporary
path (:func:`output_path`) names its own temporary file after that path; those go with it.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["json_bytes", "output_path", "plain_mode", "remove_stale_temps", "temp_file", "write_bytes", "write_json",
           "write_text"]

# No dots, so that a temporary file's name splits back into its parts.
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "localhost"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain_mode(file: Path) -> None:
    """rw for the owner, r for the rest as the umask allows (mkstemp makes 0600)."""
    with contextlib.suppress(OSError):
        os.chmod(file, 0o666 & ~_umask())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # exists, owned by someone else
        return True
    return True


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the temporary files of ``target`` left by dead processes of this host; returns them."""
    removed = []
    prefix = f".{target.name}."
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        parts = name[len(prefix):-len(".tmp")].split(".")
        if len(parts) != 3 or parts[0] != _HOST or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid() or _alive(pid):
            continue
        path = target.parent / name
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
        # a writer given this temporary path as its target (output_path: e.g. the converter inside compare)
        # made its own temporary file beside it, named after it; no later write targets that name
        removed += remove_stale_temps(path)
    return removed


def temp_file(target: Path) -> tuple[int, Path]:
    """A new temporary file beside ``target`` (open fd, mode 0600) named for its owner;
    stale ones of dead processes are removed first."""
    remove_stale_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{_HOST}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
    return fd, Path(tmp)


def write_bytes(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically (its folder is created if need be)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(target)
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


@contextlib.contextmanager
def output_path(target: Path):
    """A temporary path beside ``target`` for another program to write (e.g. llama-quantize's
    output); on success it is fsynced and replaces ``target`` in one step, on failure removed."""
    fd, tmp = temp_file(target)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        plain_mode(tmp)
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
