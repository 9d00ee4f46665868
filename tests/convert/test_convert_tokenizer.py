"""The written tokenizer splits text exactly as the Hugging Face tokenizer does.

Checked through our llama.cpp (llama-cpp-python, ``vocab_only``) on a broad text
set (scripts, digits, whitespace runs, emoji, code, special tokens in text) for:
the default model's byte-level BPE, the same vocabulary under the Llama 3 and
Qwen2 pre-tokenizer regexes and under SmolLM's digit-splitting one, and two
SentencePiece models trained here (Gemma style, Llama style with added tokens).

Known differences are asserted rather than hidden: for a SentencePiece model that
adds a dummy prefix (Llama 2 style), transformers' ``Metaspace`` does not prepend
"▁" to text that already starts with a space, nor to text after a special token,
while llama.cpp does both (SentencePiece's own, "legacy" behaviour); plain text is
checked against SentencePiece itself as well.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import convert_support as cs
from ggml_ext.converters import ConversionError, convert
from ggml_ext.converters import vocab as V

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
PRE_TOKENIZERS = {
    "llama-bpe": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": V._LLAMA3_RE}, "behavior": "Isolated", "invert": False}, _BYTE_LEVEL]},
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": V._QWEN2_RE}, "behavior": "Isolated", "invert": False}, _BYTE_LEVEL]},
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
}


def _vocab_gguf(folder, out, **kw):
    r = convert(folder, out, vocab_only=True, name="tokenizer-test", **kw)
    from ggml_ext.llama_cpp_glue import Llama
    return r, Llama(str(out), vocab_only=True, verbose=False)


def _hf(folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(folder)


def _assert_same(hf, llm, texts, prefix_space=False):
    for text in texts:
        want = hf.encode(text, add_special_tokens=False)
        got = llm.tokenize(text.encode(), add_bos=False, special=True)
        assert got == want, f"{text!r}: llama.cpp {got[:20]} vs transformers {want[:20]}"
        decoded = llm.detokenize(got, special=True)
        if prefix_space and decoded.startswith(b" "):
            decoded = decoded[1:]  # llama-cpp-python pieces tokens together and keeps the dummy prefix
        assert decoded == hf.decode(want).encode(), f"{text!r}: decoded differently"


def test_default_model_tokenizer(tmp_path):
    r, llm = _vocab_gguf(cs.default_hf(), tmp_path / "v.gguf")
    assert r.tokenizer_pre == "gpt-2"
    hf = _hf(cs.default_hf())
    _assert_same(hf, llm, cs.TEXTS + ["a.\n\n2000 and 12345", "x\n\n\ny"])
    assert llm.tokenize(b"hi", add_bos=True) == hf.encode("hi"), "no BOS added, as transformers"


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_bpe_pre_tokenizers(pre, tmp_path):
    d = tmp_path / pre
    d.mkdir()
    cs.default_tokenizer_files(d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = PRE_TOKENIZERS[pre]
    (d / "tokenizer.json").write_text(json.dumps(tj))
    shutil.copy(cs.default_hf() / "config.json", d / "config.json")
    r, llm = _vocab_gguf(d, tmp_path / f"{pre}.gguf")
    assert r.tokenizer_pre == pre
    _assert_same(_hf(d), llm, cs.TEXTS)


def test_gemma_style_sentencepiece(tmp_path):
    folder = cs.tiny("gemma3")
    r, llm = _vocab_gguf(folder, tmp_path / "g.gguf")
    assert r.tokenizer_pre == "default"
    _assert_same(_hf(folder), llm, cs.TEXTS)
    from ggml_ext.gguf import read_gguf
    kv = read_gguf(tmp_path / "g.gguf").kv
    i = kv["tokenizer.ggml.tokens"].index("<start_of_turn>")
    special = _hf(folder).added_tokens_decoder[i].special
    assert kv["tokenizer.ggml.token_type"][i] == (V.TokenType.CONTROL if special else V.TokenType.USER_DEFINED)
    assert kv["tokenizer.ggml.token_type"][kv["tokenizer.ggml.tokens"].index("<0x0A>")] == V.TokenType.BYTE
    assert kv["tokenizer.ggml.add_space_prefix"] is False


def test_llama_style_sentencepiece_with_added_tokens(tmp_path):
    import sentencepiece as spm
    folder = cs.tiny("phi3")
    r, llm = _vocab_gguf(folder, tmp_path / "l.gguf")
    hf = _hf(folder)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    leading_space = [t for t in cs.TEXTS if t[:1].isspace()]
    _assert_same(hf, llm, [t for t in cs.TEXTS if t not in leading_space] +
                 ["hello there<|end|>", "<|endoftext|>", "<|user|>"], prefix_space=True)
    for t in cs.TEXTS:
        if "<" not in t:
            assert llm.tokenize(t.encode(), add_bos=False, special=False) == sp.encode(t), t
    for t in leading_space:  # the transformers quirk described above
        assert hf.encode(t, add_special_tokens=False) != sp.encode(t)
    # llama.cpp also puts the prefix after a special token (SentencePiece's legacy behaviour), transformers not
    mid = "<|user|> there"
    assert llm.tokenize(mid.encode(), add_bos=False, special=True) == hf.encode("<|user|>") + sp.encode(" there")


def test_chat_template_and_specials_from_tokenizer_config(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(cs.tiny("qwen3"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    tmpl = cfg.pop("chat_template")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "chat_template.jinja").write_text(tmpl)
    convert(d, tmp_path / "x.gguf", vocab_only=True)
    from ggml_ext.gguf import read_gguf
    kv = read_gguf(tmp_path / "x.gguf").kv
    assert kv["tokenizer.chat_template"] == tmpl
    assert kv["tokenizer.ggml.eos_token_id"] == 2 and kv["tokenizer.ggml.bos_token_id"] == 1


def _odd_pre_tokenizer_folder(tmp_path):
    """The default model's vocabulary under a pre-tokenizer regex llama.cpp does not implement."""
    d = tmp_path / "odd"
    d.mkdir()
    cs.default_tokenizer_files(d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "[0-9]+|[a-z]+"}, "behavior": "Isolated", "invert": False},
        _BYTE_LEVEL]}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    shutil.copy(cs.default_hf() / "config.json", d / "config.json")
    return d


def _cli_convert(*args):
    return subprocess.run([sys.executable, "-m", "ggml_ext.cli", "convert", *map(str, args), "-q"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_unknown_pre_tokenizer_is_refused_with_the_fix_named(tmp_path):
    # as convert_hf_to_gguf.py: a guessed pre-tokenizer would split text unlike transformers
    d = _odd_pre_tokenizer_folder(tmp_path)
    with pytest.raises(ConversionError, match="--pre-tokenizer NAME") as e:
        convert(d, tmp_path / "o.gguf", vocab_only=True)
    assert "tokenizer.json" in str(e.value) and "llama-bpe" in str(e.value)
    assert not (tmp_path / "o.gguf").exists()
    r = _cli_convert(d, "-o", tmp_path / "o.gguf", "--vocab-only")
    assert r.returncode == 1 and "error:" in r.stderr and "--pre-tokenizer NAME" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o.gguf").exists()


def test_pre_tokenizer_override_is_written(tmp_path):
    d = _odd_pre_tokenizer_folder(tmp_path)
    warnings = []
    r, llm = _vocab_gguf(d, tmp_path / "o.gguf", pre_tokenizer="llama-bpe", warn=warnings.append)
    assert r.tokenizer_pre == "llama-bpe" and not warnings
    from ggml_ext.gguf import read_gguf
    assert read_gguf(tmp_path / "o.gguf").kv["tokenizer.ggml.pre"] == "llama-bpe"
    assert llm.tokenize(b"abc 123", add_bos=False)  # llama.cpp loads and uses it
    # the verb, on a tokenizer that is recognised (gpt-2 by structure): the named one wins, with a warning
    r = _cli_convert(cs.default_hf(), "-o", tmp_path / "q.gguf", "--vocab-only", "--pre-tokenizer", "qwen2")
    assert r.returncode == 0, r.stderr
    assert "warning: --pre-tokenizer qwen2" in r.stderr and "'gpt-2'" in r.stderr
    assert read_gguf(tmp_path / "q.gguf").kv["tokenizer.ggml.pre"] == "qwen2"


def test_pre_tokenizer_override_must_be_a_name_llama_cpp_accepts(tmp_path):
    with pytest.raises(ConversionError, match="'no-such-pre' is not one llama.cpp knows"):
        convert(cs.default_hf(), tmp_path / "o.gguf", vocab_only=True, pre_tokenizer="no-such-pre")
    with pytest.raises(ConversionError, match="applies to byte-level BPE"):
        convert(cs.tiny("gemma3"), tmp_path / "g.gguf", vocab_only=True, pre_tokenizer="default")
    assert not list(tmp_path.iterdir())


def test_pre_tokenizer_names_are_the_pinned_llama_cpps():
    """LLAMA_CPP_PRE_NAMES is what llama-vocab.cpp of the pinned tree accepts for a BPE vocabulary."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import fetch_llama_cpp
    src = (fetch_llama_cpp.pristine_tree() / "src" / "llama-vocab.cpp").read_text()
    assert set(re.findall(r'tokenizer_pre == "([^"]+)"', src)) == V.LLAMA_CPP_PRE_NAMES


@pytest.mark.parametrize("arch", ["gemma3", "phi3"])
def test_sentencepiece_style_tokenizer_json_without_tokenizer_model(arch, tmp_path):
    """A folder with only tokenizer.json (e.g. saved by transformers from a GGUF): scores from merge ranks."""
    d = tmp_path / arch
    shutil.copytree(cs.tiny(arch), d)
    (d / "tokenizer.model").unlink()
    r, llm = _vocab_gguf(d, tmp_path / "j.gguf")
    assert r.tokenizer_pre == "default"
    texts = [t for t in cs.TEXTS if not t[:1].isspace()] if arch == "phi3" else cs.TEXTS  # see the module doc
    _assert_same(_hf(d), llm, texts, prefix_space=arch == "phi3")
    from ggml_ext.gguf import read_gguf
    kv = read_gguf(tmp_path / "j.gguf").kv
    assert kv["tokenizer.ggml.model"] == "llama"
    assert kv["tokenizer.ggml.token_type"][kv["tokenizer.ggml.tokens"].index("<0x41>")] == V.TokenType.BYTE
