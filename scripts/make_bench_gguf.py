#!/usr/bin/env python3
"""A Llama-2-7B-shaped GGUF with random 4-bit blocks, for speed benchmarks only.

Decode speed on a GPU is bound by how fast the weights stream from memory, which the
default model (135M parameters, ~90 MB) is far too small to show: its tokens/s measure
kernel launches. The device machine takes at most 64 MiB of files a call, so a model of
the size users run is made there instead, in seconds: the template GGUF (the default
model) gives the tokenizer and chat template, the shapes are Llama-2-7B's (32 layers,
d=4096, 32 heads, FFN 11008; the template's 49152-token vocabulary), and every weight
matrix is TYPE (Q4_0 or IQ4_NL: 18-byte blocks of 32) filled with seeded random codes and
one small fp16 scale per block, so activations stay finite. Norms are ones. Tokens/s do not
depend on the values; perplexity of such a file means nothing and is never reported.

    python3 scripts/make_bench_gguf.py TEMPLATE.gguf OUT.gguf --type q4_0 [--layers 32]

Repack OUT.gguf with ``ggml-ext repack`` for the interleaved twins.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ggml_ext import ggml_types  # noqa: E402
from ggml_ext.gguf.reader import read_gguf  # noqa: E402
from ggml_ext.gguf.writer import GGUFWriter  # noqa: E402

SHAPE_7B = dict(n_embd=4096, n_ff=11008, n_head=32, n_head_kv=32, n_layer=32)
BLOCK, BLOCK_BYTES = 32, 18
TYPES = {"q4_0": "Q4_0", "iq4_nl": "IQ4_NL"}


def random_blocks(rng: np.random.Generator, n_weights: int, scale: float) -> np.ndarray:
    """n_weights / 32 blocks: fp16 scale ``scale`` (±10 %), then 16 random code bytes."""
    n = n_weights // BLOCK
    out = np.empty((n, BLOCK_BYTES), np.uint8)
    d = (scale * rng.uniform(0.9, 1.1, n)).astype("<f2")
    out[:, :2] = d.view(np.uint8).reshape(n, 2)
    out[:, 2:] = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    return out.reshape(-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("template", type=Path, help="GGUF of a llama-architecture model (tokenizer, chat template)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", choices=sorted(TYPES), default="q4_0", help="block type of every weight matrix")
    ap.add_argument("--layers", type=int, default=SHAPE_7B["n_layer"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    tpl = read_gguf(a.template)
    if tpl.kv.get("general.architecture") != "llama":
        ap.error(f"{a.template}: template must be a llama-architecture GGUF")
    n_vocab = tpl.tensor("token_embd.weight").shape[1]
    e, f, L = SHAPE_7B["n_embd"], SHAPE_7B["n_ff"], a.layers
    qtype = ggml_types.type_by_name(TYPES[a.type]).id
    f32 = ggml_types.type_by_name("F32").id

    w = GGUFWriter(a.out, force=True)
    for key, value in tpl.kv.items():
        if key.startswith("tokenizer.") or key in ("general.architecture",):
            w.add(key, tpl.kv_types[key], value)
    w.add("general.name", "str", f"random {TYPES[a.type]} Llama-2-7B shape, speed benchmarks only")
    hp = {"context_length": 4096, "embedding_length": e, "feed_forward_length": f, "block_count": L,
          "attention.head_count": SHAPE_7B["n_head"], "attention.head_count_kv": SHAPE_7B["n_head_kv"],
          "rope.dimension_count": e // SHAPE_7B["n_head"], "vocab_size": n_vocab}
    for k, v in hp.items():
        w.add(f"llama.{k}", "u32", v)
    w.add("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5)
    w.add("llama.rope.freq_base", "f32", 10000.0)

    mats = [("token_embd.weight", (e, n_vocab)), ("output.weight", (e, n_vocab))]
    for i in range(L):
        mats += [(f"blk.{i}.attn_{x}.weight", (e, e)) for x in ("q", "k", "v", "output")]
        mats += [(f"blk.{i}.ffn_gate.weight", (e, f)), (f"blk.{i}.ffn_up.weight", (e, f)),
                 (f"blk.{i}.ffn_down.weight", (f, e))]
    norms = ["output_norm.weight"] + [f"blk.{i}.{n}_norm.weight" for i in range(L) for n in ("attn", "ffn")]
    for name, shape in mats:
        w.add_tensor_info(name, shape, qtype, shape[0] * shape[1] // BLOCK * BLOCK_BYTES)
    for name in norms:
        w.add_tensor_info(name, (e,), f32, 4 * e)

    rng = np.random.default_rng(a.seed)
    with w:
        for name, shape in mats:  # scale ~ 1/sqrt(fan-in) over the codes' spread
            w.write_tensor(random_blocks(rng, shape[0] * shape[1], 0.25 / np.sqrt(shape[0])))
        for _ in norms:
            w.write_tensor(np.ones(e, np.float32))
    print(f"{a.out}: {w.total_size / 2**30:.2f} GiB, {len(mats)} {TYPES[a.type]} matrices, {L} layers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
