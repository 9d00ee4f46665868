#!/usr/bin/env python3
"""A tiny randomly initialised Hugging Face model with the default model's tokenizer.

For runs where the real model cannot go (the GPU machine takes at most 64 MiB),
and for checking conversions without pretrained weights. Seeded: same bytes every run.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def make(tokenizer_dir: Path, out: Path, arch: str = "llama", hidden: int = 128, layers: int = 4,
         heads: int = 4, kv_heads: int = 2, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    base = AutoConfig.from_pretrained(tokenizer_dir)
    config = AutoConfig.for_model(arch, vocab_size=base.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                  max_position_embeddings=2048, tie_word_embeddings=True,
                                  bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokenizer", type=Path, required=True, help="HF folder whose tokenizer to use")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arch", default="llama")
    a = ap.parse_args()
    print(make(a.tokenizer, a.out, a.arch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
