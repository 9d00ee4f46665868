"""Calibration tokens: samples of a fixed length cut from a text, the same every run.

The text is tokenized once with the model's own tokenizer (``AutoTokenizer`` of the Hugging Face folder,
offline); ``n_samples`` windows of ``seq_len`` tokens are taken at evenly spaced offsets across it, so
the samples cover the whole text and depend on nothing but the text, the tokenizer and the two numbers.
The default text is the Wikipedia train split of the assets (``wiki-train``), never the evaluation text
(``wiki-test``) that perplexity figures are measured on.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_SAMPLES", "DEFAULT_SEQ_LEN", "DEFAULT_TEXT", "Tokens", "leading_bos", "tokenize"]

DEFAULT_SAMPLES = 64
DEFAULT_SEQ_LEN = 512
DEFAULT_TEXT = "wiki-train"   # an asset name (ggml_ext.assets), or a file path


@dataclass
class Tokens:
    ids: "object"            # torch.LongTensor, n_samples x seq_len
    text_sha256: str
    text_path: str

    @property
    def n_samples(self) -> int:
        return int(self.ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.ids.shape[1])


def _text_path(text: str | os.PathLike | None) -> Path:
    if text is None:
        text = DEFAULT_TEXT
    p = Path(text)
    if p.is_file():
        return p
    if isinstance(text, str) and "/" not in text:
        from ggml_ext import assets
        try:
            return Path(assets.path(text))
        except Exception as e:  # noqa: BLE001 - an unknown asset name reads as a missing file
            raise FileNotFoundError(f"calibration text {text!r}: not a file, and not a fetched asset ({e})") from None
    raise FileNotFoundError(f"calibration text not found: {p}")


def leading_bos(tok) -> int | None:
    """The BOS id when the tokenizer starts text with it (as the model saw text in training), else None.

    Asked of the tokenizer's own output rather than its ``add_bos_token`` attribute: transformers 5
    reports ``add_bos_token`` False for Gemma-3's tokenizer, which still puts ``<bos>`` first, and Gemma
    without BOS at long context is another model (perplexity 678 at 32K tokens instead of ~11).
    """
    bos = tok.bos_token_id
    if bos is None:
        return None
    probe = tok("a", add_special_tokens=True).input_ids
    return bos if len(probe) > 0 and probe[0] == bos else None


def tokenize(model_dir: str | os.PathLike, text: str | os.PathLike | None = None,
             n_samples: int = DEFAULT_SAMPLES, seq_len: int = DEFAULT_SEQ_LEN) -> Tokens:
    """``n_samples`` x ``seq_len`` token ids of ``text`` (a file, or an asset name; default wiki-train)."""
    import torch
    from transformers import AutoTokenizer

    if n_samples < 1 or seq_len < 2:
        raise ValueError(f"need at least one sample of two tokens (got {n_samples} x {seq_len})")
    path = _text_path(text)
    raw = path.read_bytes()
    body = raw.decode("utf-8")
    try:
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        ids = tok(body, return_tensors="pt", add_special_tokens=False).input_ids[0]
        bos = leading_bos(tok)
    except BaseException as e:  # noqa: BLE001 - transformers raises anything, the Rust tokenizers panic
        if isinstance(e, (KeyboardInterrupt, SystemExit, MemoryError)):
            raise
        raise ValueError(f"the model's tokenizer cannot tokenize the text ({type(e).__name__}: "
                         f"{str(e)[:200] or 'no message'}); check tokenizer.json / tokenizer_config.json") from None
    need = seq_len * n_samples
    if ids.numel() < seq_len:
        raise ValueError(f"{path}: {ids.numel()} tokens, fewer than one sample of {seq_len}")
    if ids.numel() < need:
        raise ValueError(f"{path}: {ids.numel()} tokens, fewer than {n_samples} samples of {seq_len} "
                         f"without overlap; use fewer samples or a longer text")
    starts = torch.linspace(0, ids.numel() - seq_len, n_samples).round().to(torch.int64)
    rows = []
    for s in starts.tolist():
        row = ids[s:s + seq_len].clone()
        if bos is not None:
            row = torch.cat([torch.tensor([bos]), row[:-1]])  # as the model sees text: BOS first
        rows.append(row)
    return Tokens(torch.stack(rows), hashlib.sha256(raw).hexdigest(), str(path))
