"""Tokenizer export: a Hugging Face tokenizer as llama.cpp's ``tokenizer.ggml.*`` keys.

Two kinds are exported:

**SentencePiece** (``tokenizer.model``; Llama 2, Mistral 7B, Gemma, Phi-3):
``tokenizer.ggml.model = "llama"``, ``pre = "default"``; every piece with its score
and type (normal, unknown, control, unused, byte), then the added tokens of
``added_tokens.json`` and ``tokenizer_config.json``'s ``added_tokens_decoder``
(special ones become control tokens, others user-defined). Whether a space is
put before the text (``add_space_prefix``) follows what the Hugging Face
tokenizer does: its ``tokenizer.json`` (a ``Prepend("▁")`` normalizer or a
``Metaspace`` pre-tokenizer that prepends), else ``tokenizer_config.json``'s
``add_prefix_space``, else the SentencePiece model's ``add_dummy_prefix``.

**Byte-level BPE** (``tokenizer.json`` with a BPE model and a ByteLevel
pre-tokenizer or decoder; SmolLM, Llama 3, Qwen 2/3, Mistral Nemo):
``tokenizer.ggml.model = "gpt2"``, tokens, merges and token types. The
pre-tokenizer llama.cpp must apply, ``tokenizer.ggml.pre``, is identified:

1. from the structure of ``tokenizer.json``'s pre-tokenizer, where it is one
   llama.cpp implements exactly: the Llama 3 regex (``llama-bpe``), the Qwen2
   regex (``qwen2``), individual digits + ByteLevel (``smollm``, or ``starcoder``
   when the tokenizer cleans up spaces), plain ByteLevel (``gpt-2``);
2. else the way ``convert_hf_to_gguf.py`` does it: the tokenizer encodes
   llama.cpp's check text and the sha256 of the token ids is looked up in a table
   of known tokenizers (:data:`KNOWN_PRE_HASHES`; needs the ``tokenizers`` package);
3. anything else is refused with a :class:`ConversionError`, as
   ``convert_hf_to_gguf.py`` refuses it: llama.cpp would split text differently
   from transformers. ``pre_tokenizer=NAME`` (``ggml-ext convert --pre-tokenizer
   NAME``) writes NAME instead, for a tokenizer whose pre-tokenization you know
   matches one of llama.cpp's (:data:`LLAMA_CPP_PRE_NAMES`); a warning says when
   it differs from the one detected.

Structure comes first because the check text can collide: the default model's
folder (a tokenizer.json transformers rebuilt from a GGUF) has plain ByteLevel
pre-tokenization but hashes like SmolLM's digit-splitting one, and the two split
"\n\n2000" differently.

Token ids missing from the vocabulary become ``[PAD<id>]`` unused tokens, and the
list is padded to the model's embedding rows. Special token ids come from
``tokenizer_config.json`` (``bos_token``...), then ``config.json``
(``bos_token_id``...). ``add_bos_token``/``add_eos_token`` are written
explicitly: ``tokenizer_config.json``'s flags, else the post-processor template
of ``tokenizer.json``. The chat template comes from ``tokenizer_config.json``,
``chat_template.jinja`` or ``chat_template.json``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import ConversionError

__all__ = ["Vocab", "load_vocab", "KNOWN_PRE_HASHES", "LLAMA_CPP_PRE_NAMES", "CHECK_TEXT", "TokenType"]


class TokenType:
    NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


# llama.cpp's pre-tokenizer check text (convert_hf_to_gguf.py, get_vocab_base_pre).
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 "
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

#: sha256 of str(token ids of CHECK_TEXT) -> tokenizer.ggml.pre, for the tokenizers of our architectures
#: (values from llama.cpp's table; the pre types are the ones its llama-vocab.cpp implements).
KNOWN_PRE_HASHES = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",        # SmolLM / SmolLM2
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",     # Llama 3.x
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": "smaug-bpe",     # Llama 3 fine-tunes
    "9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e": "falcon3",       # Falcon3 (llama)
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",         # Qwen 1.5 / 2 / 2.5 / 3
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",         # Qwen3 embedding
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",        # Mistral Nemo
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
    "fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085": "phi-2",
    "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e": "gpt-4o",        # Phi-4
}

#: every tokenizer.ggml.pre the pinned llama.cpp's llama-vocab.cpp accepts for a BPE vocabulary (it refuses a
#: file with any other); tests/convert/test_convert_tokenizer.py checks this list against the pinned source.
LLAMA_CPP_PRE_NAMES = frozenset("""
    a.x-4.0 afmoe bailingmoe bailingmoe2 bloom chameleon chatglm-bpe codeshell cohere2moe command-r dbrx
    deepseek-coder deepseek-llm deepseek-r1-qwen deepseek-v3 default exaone exaone-moe exaone4 f2llmv2 falcon
    falcon-h1 falcon3 gemma4 gigachat glm4 glm5 gpt-2 gpt-4o gpt3-finnish granite-docling granite-embed-multi-311m
    granite-embed-multi-97m grok-2 hunyuan hunyuan-dense hy_v4 jais jais-2 jina-de jina-es jina-v1-en jina-v2-code
    jina-v2-de jina-v2-es jina-v5-nano joyai-llm kanana2 kimi-k2 kormo laguna lfm2 llada-moe llama-bpe llama-v3
    llama3 llama4 megrez mellum mellum2 midm-2.0 minerva-7b minicpm5 minimax-m2 modern-bert mpt olmo phi-2
    pixtral poro-chat qwen2 qwen35 refact roberta-bpe sarvam-moe seed-coder smaug-bpe smollm solar-open spark2_5
    stablelm2 starcoder superbpe talkie tekken tiny_aya trillion ufakzeka viking whitespace youtu
""".split())

# Pre-tokenizer regexes as they appear in tokenizer.json, for the structural fallback.
_LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN2_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

_SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_GGUF_SPECIAL_KEY = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                     "sep": "seperator_token_id", "pad": "padding_token_id", "cls": "cls_token_id",
                     "mask": "mask_token_id"}


@dataclass
class Vocab:
    model: str  # "gpt2" or "llama"
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    merges: list[str] | None = None
    special: dict[str, int] = field(default_factory=dict)
    add_bos: bool | None = None
    add_eos: bool | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None
    named_templates: dict[str, str] = field(default_factory=dict)
    pre_source: str = ""  # how `pre` was found: "hash", "structure", "override", "sentencepiece"

    def metadata(self) -> list[tuple[str, str, Any]]:
        meta: list[tuple[str, str, Any]] = [
            ("tokenizer.ggml.model", "str", self.model),
            ("tokenizer.ggml.pre", "str", self.pre),
            ("tokenizer.ggml.tokens", "array[str]", self.tokens),
        ]
        if self.scores is not None:
            meta.append(("tokenizer.ggml.scores", "array[f32]", self.scores))
        meta.append(("tokenizer.ggml.token_type", "array[i32]", self.types))
        if self.merges is not None:
            meta.append(("tokenizer.ggml.merges", "array[str]", self.merges))
        for kind in _SPECIAL_KINDS:
            if kind in self.special:
                meta.append((f"tokenizer.ggml.{_GGUF_SPECIAL_KEY[kind]}", "u32", int(self.special[kind])))
        if self.add_bos is not None:
            meta.append(("tokenizer.ggml.add_bos_token", "bool", self.add_bos))
        if self.add_eos is not None:
            meta.append(("tokenizer.ggml.add_eos_token", "bool", self.add_eos))
        if self.add_space_prefix is not None:
            meta.append(("tokenizer.ggml.add_space_prefix", "bool", self.add_space_prefix))
        if self.chat_template is not None:
            meta.append(("tokenizer.chat_template", "str", self.chat_template))
        for name, tmpl in self.named_templates.items():
            meta.append((f"tokenizer.chat_template.{name}", "str", tmpl))
        return meta


def _json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path}: not valid JSON ({e})") from None


def _looks_special(text: str) -> bool:
    """Added tokens some models forget to mark special (llama.cpp's converter treats them as control)."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _check_json_shape(path: Path, obj: Any, shape: Any, where: str = "") -> None:
    """Raise ConversionError unless ``obj`` fits ``shape``: a type, a tuple of types, a dict of key -> shape
    (keys optional; None always allowed), or a one-element list (a list of that shape)."""
    if isinstance(shape, dict):
        if not isinstance(obj, dict):
            raise ConversionError(f"{path}: {where or 'the file'} is not a JSON object")
        for k, sub in shape.items():
            if obj.get(k) is not None:
                _check_json_shape(path, obj[k], sub, f"{where}.{k}" if where else k)
    elif isinstance(shape, list):
        if not isinstance(obj, list):
            raise ConversionError(f"{path}: {where} is not a JSON list")
        for i, e in enumerate(obj):
            _check_json_shape(path, e, shape[0], f"{where}[{i}]")
    elif not isinstance(obj, shape) or (isinstance(obj, bool) and shape is int):
        raise ConversionError(f"{path}: {where} has the wrong type ({type(obj).__name__})")


# What the code below reads of tokenizer.json and tokenizer_config.json, and of what type.
_NODE = {"type": str, "pretokenizers": [dict], "normalizers": [dict], "decoders": [dict], "processors": [dict],
         "pattern": dict, "single": [dict]}
_TOK_JSON_SHAPE = {
    "model": {"type": str, "vocab": dict, "merges": list, "unk_token": str},
    "added_tokens": [{"id": int, "content": str}],
    "normalizer": _NODE, "pre_tokenizer": _NODE, "post_processor": _NODE, "decoder": _NODE,
}
_TOK_CFG_SHAPE = {"added_tokens_decoder": dict}


def _check_tokenizer_json(path: Path, tok_json: Any) -> None:
    _check_json_shape(path, tok_json, _TOK_JSON_SHAPE)
    for t, i in ((tok_json.get("model") or {}).get("vocab") or {}).items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise ConversionError(f"{path}: token {t!r} has id {i!r}, not a non-negative integer")
    for a in tok_json.get("added_tokens") or []:
        if a.get("id") is None or a["id"] < 0 or a.get("content") is None:
            raise ConversionError(f"{path}: added token {a!r} needs a non-negative id and a content string")


def load_vocab(folder: Path, config: dict[str, Any], n_vocab: int, warn: Callable[[str], None],
               pre_tokenizer: str | None = None) -> Vocab:
    """The tokenizer of ``folder`` for a model with ``n_vocab`` embedding rows; ``pre_tokenizer``: the
    tokenizer.ggml.pre to write for a byte-level BPE tokenizer instead of detecting it."""
    if pre_tokenizer is not None and pre_tokenizer not in LLAMA_CPP_PRE_NAMES:
        raise ConversionError(f"--pre-tokenizer {pre_tokenizer!r} is not one llama.cpp knows; choose from "
                              f"{', '.join(sorted(LLAMA_CPP_PRE_NAMES))}")
    tok_cfg_path = folder / "tokenizer_config.json"
    tok_cfg = _json(tok_cfg_path) if tok_cfg_path.is_file() else {}
    _check_json_shape(tok_cfg_path, tok_cfg, _TOK_CFG_SHAPE)
    tok_json_path = folder / "tokenizer.json"
    tok_json = _json(tok_json_path) if tok_json_path.is_file() else None
    if tok_json is not None:
        _check_tokenizer_json(tok_json_path, tok_json)
    if (folder / "tokenizer.model").is_file():
        v = _sentencepiece(folder, tok_cfg, tok_json, n_vocab, warn)
    elif tok_json is not None and _is_sentencepiece_json(tok_json):
        v = _sentencepiece_json(folder, tok_cfg, tok_json, n_vocab, warn)
    elif tok_json is not None:
        v = _bpe(folder, tok_cfg, tok_json, n_vocab, warn, pre_tokenizer)
    else:
        raise ConversionError(f"{folder} has no tokenizer: expected tokenizer.json or tokenizer.model")
    if pre_tokenizer is not None and v.model != "gpt2":
        raise ConversionError(f"--pre-tokenizer applies to byte-level BPE tokenizers; {folder} has a "
                              "SentencePiece one (llama.cpp always pre-tokenizes it the same way)")
    _special_ids(v, tok_cfg, config, warn)
    _add_flags(v, tok_cfg, tok_json)
    _chat_template(v, folder, tok_cfg)
    return v


# --------------------------------------------------------------------------- BPE


def _is_byte_level(tok_json: dict) -> bool:
    def has_bytelevel(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if node.get("type") == "ByteLevel":
            return True
        return any(has_bytelevel(p) for p in node.get("pretokenizers", []) + node.get("decoders", []))
    return has_bytelevel(tok_json.get("pre_tokenizer")) or has_bytelevel(tok_json.get("decoder"))


def _bpe(folder: Path, tok_cfg: dict, tok_json: dict, n_vocab: int, warn, pre_tokenizer: str | None) -> Vocab:
    model = tok_json.get("model") or {}
    if model.get("type") != "BPE" or not _is_byte_level(tok_json):
        raise ConversionError(f"{folder / 'tokenizer.json'}: only byte-level BPE and SentencePiece-style BPE "
                              f"tokenizers can be read from tokenizer.json (this one is {model.get('type')!r}"
                              f"{'' if _is_byte_level(tok_json) else ', not byte-level'}); a SentencePiece "
                              "model needs its tokenizer.model")
    vocab: dict[str, int] = model.get("vocab") or {}
    by_id: dict[int, str] = {i: t for t, i in vocab.items()}
    added = {int(a["id"]): a for a in tok_json.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    size = max(n_vocab, max(by_id) + 1 if by_id else 0)
    if size > n_vocab:
        raise ConversionError(f"the tokenizer has token id {max(by_id)} but the model has only {n_vocab} "
                              "embedding rows")
    tokens, types = [], []
    for i in range(size):
        t = by_id.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added:
            special = bool(added[i].get("special")) or _looks_special(t)
            tokens.append(t)
            types.append(TokenType.CONTROL if special else TokenType.USER_DEFINED)
        else:
            tokens.append(t)
            types.append(TokenType.NORMAL)
    merges = [f"{a} {b}" for a, b in _merges(folder, model)]
    pre, how = _detect_pre(folder, tok_cfg, tok_json)
    if pre_tokenizer is not None:
        if pre is not None and pre != pre_tokenizer:
            warn(f"--pre-tokenizer {pre_tokenizer}: this tokenizer.json's pre-tokenizer is {pre!r} (found by {how}); "
                 f"writing {pre_tokenizer!r} as asked")
        pre, how = pre_tokenizer, "override"
    elif pre is None:
        raise ConversionError(f"{folder / 'tokenizer.json'}: the BPE pre-tokenizer is not one ggml-ext recognises "
                              f"({how}). If you know which of llama.cpp's pre-tokenizers splits text as this one does, "
                              "name it: `ggml-ext convert ... --pre-tokenizer NAME` (Python: pre_tokenizer=NAME), "
                              f"e.g. llama-bpe, qwen2, smollm, gpt-2: any of the {len(LLAMA_CPP_PRE_NAMES)} names "
                              "llama.cpp accepts (ggml_ext.converters.vocab.LLAMA_CPP_PRE_NAMES)")
    return Vocab("gpt2", pre, tokens, types, merges=merges, pre_source=how)


def _merges(folder: Path, model: dict) -> list[tuple[str, str]]:
    out = []
    for m in model.get("merges") or []:
        if isinstance(m, str) and " " in m:
            a, b = m.split(" ", 1)
        elif isinstance(m, (list, tuple)) and len(m) == 2 and all(isinstance(x, str) for x in m):
            a, b = m
        else:
            raise ConversionError(f"{folder / 'tokenizer.json'}: malformed merge {m!r}")
        out.append((a, b))
    return out


def _is_sentencepiece_json(tok_json: dict) -> bool:
    """A SentencePiece model expressed as tokenizer.json: BPE with byte fallback, "▁" for spaces."""
    model = tok_json.get("model") or {}
    if model.get("type") != "BPE" or _is_byte_level(tok_json) or not model.get("byte_fallback"):
        return False
    text = json.dumps([tok_json.get("normalizer"), tok_json.get("pre_tokenizer")], ensure_ascii=False)
    return "\u2581" in text


def _sentencepiece_json(folder: Path, tok_cfg: dict, tok_json: dict, n_vocab: int, warn) -> Vocab:
    """SentencePiece-style tokenizer.json without tokenizer.model (e.g. a folder saved from a GGUF).

    llama.cpp's SentencePiece tokenizer merges the adjacent pair whose concatenation has
    the highest score; transformers merges by merge rank. Each token gets the score
    -(rank of the first merge producing it), so both pick the same pairs in the same order.
    """
    model = tok_json["model"]
    vocab: dict[str, int] = model.get("vocab") or {}
    size = max(n_vocab, max(vocab.values(), default=-1) + 1)
    if size > n_vocab:
        raise ConversionError(f"the tokenizer has token id {size - 1} but the model has only {n_vocab} embedding rows")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    scores = [-10000.0] * n_vocab
    types = [TokenType.UNUSED] * n_vocab
    for t, i in vocab.items():
        tokens[i], scores[i] = t, 0.0
        types[i] = TokenType.BYTE if len(t) == 6 and t.startswith("<0x") and t.endswith(">") else TokenType.NORMAL
    for rank, (a, b) in enumerate(_merges(folder, model)):
        i = vocab.get(a + b)
        if i is not None and scores[i] == 0.0:
            scores[i] = -float(rank + 1)
    unk = model.get("unk_token")
    if isinstance(unk, str) and unk in vocab:
        types[vocab[unk]] = TokenType.UNKNOWN
    for a in tok_json.get("added_tokens", []):
        i, text = int(a["id"]), a["content"]
        if i >= n_vocab:
            warn(f"added token {text!r} has id {i}, beyond the {n_vocab} embedding rows: left out")
            continue
        if types[i] == TokenType.UNKNOWN and tokens[i] == text:
            continue
        special = bool(a.get("special")) or _looks_special(text)
        tokens[i] = text if special else text.replace("\u2581", " ")
        types[i] = TokenType.CONTROL if special else TokenType.USER_DEFINED
        scores[i] = -1000.0
    v = Vocab("llama", "default", tokens, types, scores=scores, pre_source="sentencepiece (tokenizer.json)")
    v.add_space_prefix = _space_prefix(tok_cfg, tok_json, None)
    return v


def check_hash(folder: Path) -> str | None:
    """sha256 of the token ids of CHECK_TEXT under the folder's tokenizer.json (None without `tokenizers`)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        ids = tok.encode(CHECK_TEXT).ids
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception for a bad file
        raise ConversionError(f"{folder / 'tokenizer.json'}: the tokenizers library cannot use it ({e})") from None
    return hashlib.sha256(str(ids).encode()).hexdigest()


def _structural_pre(tok_cfg: dict, tok_json: dict) -> str | None:
    pre = tok_json.get("pre_tokenizer") or {}
    norm = tok_json.get("normalizer")
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True) and norm is None:
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True) \
            and norm is None:
        return "starcoder" if tok_cfg.get("clean_up_tokenization_spaces", False) else "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        regex = (parts[0].get("pattern") or {}).get("Regex")
        if regex == _LLAMA3_RE and norm is None:
            return "llama-bpe"
        if regex == _QWEN2_RE and (norm is None or norm.get("type") == "NFC"):
            return "qwen2"
    return None


def _detect_pre(folder: Path, tok_cfg: dict, tok_json: dict) -> tuple[str | None, str]:
    """(tokenizer.ggml.pre, "structure" or "hash"), or (None, why not) when it is not recognised: then
    the caller refuses, as convert_hf_to_gguf.py does (a guessed one splits text unlike transformers)."""
    s = _structural_pre(tok_cfg, tok_json)
    if s is not None:
        return s, "structure"
    h = check_hash(folder)
    if h is not None and h in KNOWN_PRE_HASHES:
        return KNOWN_PRE_HASHES[h], "hash"
    return None, (f"its check-text hash {h} is not in the table" if h else
                  "the check-text hash needs the `tokenizers` package, which is not installed")


# --------------------------------------------------------------------------- SentencePiece


def _sentencepiece(folder: Path, tok_cfg: dict, tok_json: dict | None, n_vocab: int, warn) -> Vocab:
    try:
        from sentencepiece import SentencePieceProcessor
    except ImportError:
        raise ConversionError("tokenizer.model needs the sentencepiece package "
                              "(pip install 'ggml-ext[convert]')") from None
    path = folder / "tokenizer.model"
    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(path))
    except (OSError, RuntimeError) as e:
        raise ConversionError(f"{path}: not a SentencePiece model ({e})") from None
    proto = _sp_proto(path)
    if proto is not None and proto.trainer_spec.model_type not in (0, 2):  # 0 unset, 1 unigram, 2 BPE
        warn(f"{path}: SentencePiece model type {proto.trainer_spec.model_type} (not BPE); llama.cpp's "
             "SentencePiece tokenizer merges by score, which matches BPE models")
    n_sp = sp.vocab_size()
    if n_sp > n_vocab:
        raise ConversionError(f"{path} has {n_sp} pieces but the model has only {n_vocab} embedding rows")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    scores = [-10000.0] * n_vocab
    types = [TokenType.UNUSED] * n_vocab
    user_defined = {i for i, p in enumerate(proto.pieces) if p.type == 4} if proto is not None else set()
    for i in range(n_sp):
        tokens[i] = sp.IdToPiece(i)
        scores[i] = float(sp.GetScore(i))
        types[i] = (TokenType.UNKNOWN if sp.IsUnknown(i) else TokenType.CONTROL if sp.IsControl(i)
                    else TokenType.UNUSED if sp.IsUnused(i) else TokenType.BYTE if sp.IsByte(i)
                    else TokenType.USER_DEFINED if i in user_defined else TokenType.NORMAL)

    def put_added(i: int, text: str, special: bool) -> None:
        if i >= n_vocab:
            warn(f"added token {text!r} has id {i}, beyond the {n_vocab} embedding rows: left out")
            return
        if not special:
            text = text.replace("\u2581", " ")  # llama.cpp expects user-defined tokens as plain text
        tokens[i], scores[i] = text, -1000.0
        types[i] = TokenType.CONTROL if special else TokenType.USER_DEFINED

    added_path = folder / "added_tokens.json"
    if added_path.is_file():
        for text, i in _json(added_path).items():
            put_added(int(i), text, _looks_special(text))
    for i, data in (tok_cfg.get("added_tokens_decoder") or {}).items():
        if not (isinstance(data, dict) and i.isdecimal()):
            raise ConversionError(f"{folder / 'tokenizer_config.json'}: added_tokens_decoder entry {i!r} is malformed")
        text = data.get("content")
        if isinstance(text, str):
            put_added(int(i), text, bool(data.get("special")) or _looks_special(text))
    if tok_json is not None:
        for a in tok_json.get("added_tokens", []):
            i, text = int(a["id"]), a["content"]
            if i < n_sp and tokens[i] == text and types[i] in (TokenType.UNKNOWN, TokenType.CONTROL, TokenType.BYTE):
                continue  # SentencePiece's own special pieces keep their type
            put_added(i, text, bool(a.get("special")) or _looks_special(text))

    v = Vocab("llama", "default", tokens, types, scores=scores, pre_source="sentencepiece")
    v.add_space_prefix = _space_prefix(tok_cfg, tok_json, proto)
    return v


def _sp_proto(path: Path):
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:
        return None
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(path.read_bytes())
    return m


def _space_prefix(tok_cfg: dict, tok_json: dict | None, proto) -> bool:
    if tok_json is not None:
        norm, pre = tok_json.get("normalizer") or {}, tok_json.get("pre_tokenizer") or {}
        norms = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
        pres = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
        if any(n.get("type") == "Prepend" and n.get("prepend") == "\u2581" for n in norms):
            return True
        for p in pres:
            if p.get("type") == "Metaspace":
                scheme = p.get("prepend_scheme")
                return scheme in ("first", "always") if scheme is not None else bool(p.get("add_prefix_space", True))
        if any(n.get("type") == "Replace" for n in norms):
            return False  # SentencePiece-style normalizer without a prefix (Gemma)
    if tok_cfg.get("add_prefix_space") is not None:
        return bool(tok_cfg["add_prefix_space"])
    if proto is not None:
        return bool(proto.normalizer_spec.add_dummy_prefix)
    return True


# --------------------------------------------------------------------------- specials, flags, template


def _special_ids(v: Vocab, tok_cfg: dict, config: dict, warn) -> None:
    index: dict[str, int] = {}
    for i, t in enumerate(v.tokens):
        index.setdefault(t, i)
    for kind in _SPECIAL_KINDS:
        text = _token_text(tok_cfg.get(f"{kind}_token"))
        if text is not None:
            if text in index:
                v.special[kind] = index[text]
                continue
            warn(f"tokenizer_config.json: {kind}_token {text!r} is not in the vocabulary")
        tid = config.get(f"{kind}_token_id")
        if isinstance(tid, list):
            tid = tid[0] if tid else None
        if isinstance(tid, int) and 0 <= tid < len(v.tokens):
            v.special[kind] = tid


def _template_flags(tok_json: dict | None) -> tuple[bool | None, bool | None]:
    if not tok_json:
        return None, None
    pp = tok_json.get("post_processor") or {}
    procs = pp.get("processors", [pp]) if pp.get("type") == "Sequence" else [pp]
    for p in procs:
        if p.get("type") == "TemplateProcessing":
            single = p.get("single") or []
            seq_at = next((k for k, e in enumerate(single) if "Sequence" in e), None)
            if seq_at is None:
                continue
            return (any("SpecialToken" in e for e in single[:seq_at]),
                    any("SpecialToken" in e for e in single[seq_at + 1:]))
    return False, False


def _add_flags(v: Vocab, tok_cfg: dict, tok_json: dict | None) -> None:
    bos_t, eos_t = _template_flags(tok_json)
    v.add_bos = tok_cfg.get("add_bos_token") if tok_cfg.get("add_bos_token") is not None else bos_t
    v.add_eos = tok_cfg.get("add_eos_token") if tok_cfg.get("add_eos_token") is not None else eos_t
    if v.model == "llama":  # SentencePiece tokenizers of transformers add BOS unless told otherwise
        v.add_bos = True if v.add_bos is None else v.add_bos
        v.add_eos = False if v.add_eos is None else v.add_eos
    else:
        v.add_bos = bool(v.add_bos)
        v.add_eos = bool(v.add_eos)
    if v.add_bos and "bos" not in v.special:
        v.add_bos = False


def _chat_template(v: Vocab, folder: Path, tok_cfg: dict) -> None:
    tmpl = tok_cfg.get("chat_template")
    if tmpl is None and (folder / "chat_template.jinja").is_file():
        tmpl = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if tmpl is None and (folder / "chat_template.json").is_file():
        data = _json(folder / "chat_template.json")
        tmpl = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(tmpl, list):
        for entry in tmpl:
            if not isinstance(entry, dict):
                continue
            name, text = entry.get("name"), entry.get("template")
            if not isinstance(name, str) or not isinstance(text, str):
                continue
            if name == "default":
                v.chat_template = text
            else:
                v.named_templates[name] = text
    elif isinstance(tmpl, str):
        v.chat_template = tmpl
