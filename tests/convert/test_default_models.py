"""scripts/default_models.py: cached files are keyed by their recipe (tool, arguments, build,
code, sources), so a changed recipe never reuses an older file, and each says what it is."""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import default_models as dm  # noqa: E402
from ggml_ext import _atomic  # noqa: E402


def _maker(calls: list[str], data: bytes):
    def make(out: Path) -> None:
        calls.append(out.name)
        with _atomic.output_path(out) as tmp:
            tmp.write_bytes(data)
    return make


def test_cached_file_is_keyed_by_recipe_and_reused_only_for_the_same_one(tmp_path):
    calls: list[str] = []
    src = tmp_path / "src.bin"
    src.write_bytes(b"weights v1")
    recipe = {"tool": "t", "args": ["a"], "source": dm.source(src)}
    first = dm.cached("M-Q4_0", "t a of src.bin", recipe, _maker(calls, b"one"), tmp_path)
    assert first.name == f"M-Q4_0-{dm.recipe_key(recipe)}.gguf" and first.read_bytes() == b"one"
    side = json.loads(first.with_suffix(".json").read_text())
    assert side["what"] == "t a of src.bin" and side["recipe"] == recipe and side["sha256"] == dm.sha256_file(first)
    # the same recipe: the cached file, nothing made
    assert dm.cached("M-Q4_0", "t a of src.bin", recipe, _maker(calls, b"two"), tmp_path) == first
    assert len(calls) == 1
    # other arguments, or a changed source file: a new file, and the superseded one is gone
    for changed in ({**recipe, "args": ["b"]}, None):
        if changed is None:
            src.write_bytes(b"weights, version 2")
            changed = {**recipe, "source": dm.source(src)}
        new = dm.cached("M-Q4_0", "t of src.bin", changed, _maker(calls, b"new"), tmp_path)
        assert new != first and new.read_bytes() == b"new" and not first.exists()
        assert not first.with_suffix(".json").exists()
        first = new
    assert len(calls) == 3
    # other stems (another type, a repack of this one) are left alone
    other = dm.cached("M-Q4_0-repack-8x8", "r", recipe, _maker(calls, b"r"), tmp_path)
    dm.cached("M-Q4_0", "t", {**recipe, "args": ["c"]}, _maker(calls, b"c"), tmp_path)
    assert other.exists()


def test_a_file_without_its_sidecar_or_with_another_recipe_in_it_is_made_again(tmp_path):
    calls: list[str] = []
    recipe = {"tool": "t"}
    out = dm.cached("M-F16", "t", recipe, _maker(calls, b"x"), tmp_path)
    out.with_suffix(".json").unlink()
    assert dm.cached("M-F16", "t", recipe, _maker(calls, b"y"), tmp_path).read_bytes() == b"y"
    side = out.with_suffix(".json")
    side.write_text(json.dumps({**json.loads(side.read_text()), "recipe": {"tool": "other"}}))
    assert dm.cached("M-F16", "t", recipe, _maker(calls, b"z"), tmp_path).read_bytes() == b"z"
    assert len(calls) == 3


def test_the_name_only_file_of_older_versions_is_superseded(tmp_path):
    old = tmp_path / "M-IQ4_NL.gguf"
    old.write_bytes(b"maybe our converter's output")
    new = dm.cached("M-IQ4_NL", "llama-quantize", {"tool": "llama-quantize"}, _maker([], b"stock"), tmp_path)
    assert not old.exists() and new.read_bytes() == b"stock"


def test_label_strips_model_and_key():
    assert dm.label(Path(f"{dm.NAME}-Q4_0-0123456789ab.gguf")) == "Q4_0"
    assert dm.label(Path(f"{dm.NAME}-Q4_0-repack-8x8-0123456789ab.gguf")) == "Q4_0-repack-8x8"


def test_stock_iq4_nl_is_our_llama_quantize_of_the_f16_file():
    """default_model("IQ4_NL") is the stock reference: llama-quantize (ggml's quantizer) of the
    f16 file, whose recipe is ggml-ext convert; both recipes name the build they came from."""
    ref = dm.default_model("IQ4_NL")
    r = dm.describe(ref)["recipe"]
    f16 = dm.default_model("f16")
    assert r["tool"] == "llama-quantize" and r["args"] == ["IQ4_NL"] and r["imatrix"] is None
    assert r["source"] == {"file": f16.name, "sha256": dm.sha256_file(f16)}
    r16 = dm.describe(f16)["recipe"]
    assert r16["tool"] == "ggml-ext convert" and r16["args"] == ["--type", "f16"]
    assert "model.safetensors" in r16["source"]["files"]
    for x in (r, r16):
        assert x["llama_cpp_commit"] == "0c1e57098" and x["ggml_ext"] and len(x["code_sha256"]) == 64
    assert ref.name == f"{dm.NAME}-IQ4_NL-{dm.recipe_key(r)}.gguf"
