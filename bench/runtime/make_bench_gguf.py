#!/usr/bin/env python3
# Random-weight 7B-shaped GGUF files for the speed rows of Codebooks, Any-precision and GPU path.
"""A Llama-2-7B-shaped GGUF with random 4-bit blocks, for speed benchmarks only.

Decode speed on a GPU is bound by how fast the weights stream from memory, which the
default model (135M parameters, ~90 MB) is far too small to show: its tokens/s measure
kernel launches. The device machine takes at most 64 MiB of files a call, so a model of
the size users run is made there instead, in seconds: the template GGUF (the default
model) gives the tokenizer and chat template, the shapes are Llama-2-7B's (32 layers,
d=4096, 32 heads, FFN 11008; the template's 49152-token vocabulary), and every weight
matrix is TYPE (Q4_0 or IQ4_NL: 18-byte blocks of 32; Q2_K, Q3_K, Q4_K, IQ2_S, CB2, CB3: blocks of
256) filled with seeded random codes and small fp16 scales in every block's fp16 fields, so
activations stay finite. Norms are ones. Tokens/s do not depend on the values; perplexity of
such a file means nothing and is never reported.

``--type apq`` writes an any-precision file (docs/formats/anyprec.md) as ``convert --method anyprec``
lays it out: every decoder-layer matrix as APQ bitplanes (parent 8, random codes) with its
``<name>.apq_tables`` (seed 3: fp16 tables of 2^3..2^8 entries per row, random, ~1/sqrt(fan-in)), the
``ggml_ext.anyprec.*`` keys; the token embedding and output matrices as Q4_K (``--apq-rest`` to choose),
so at a precision b it compares with a Q4_K file of the same shape in the decoder layers only.

    python3 bench/runtime/make_bench_gguf.py TEMPLATE.gguf OUT.gguf --type q4_0 [--layers 32]

Repack OUT.gguf with ``ggml-ext repack`` for the interleaved twins.

``--shape`` picks other shapes (``8b-gqa``: Llama-3-8B, head dim 128 with 8 KV heads; ``smollm2``: head dim 64;
``hd256``: Gemma-3-270M's attention, head dim 256 with one KV head, in the llama architecture), and
``--kv-calib FILE`` writes a KV calibration of the shape (docs/KVQUANT.md) for ``-ctk/-ctv nuq*``: every table of
every width with levels spread like a standard normal's quantiles in [-1, 1], channel thresholds +-3, so the cache
binds as a real calibration's does (block-scaled keys, outlier slots, the sink); its values mean nothing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from ggml_ext import formats  # noqa: E402
from ggml_ext.gguf.reader import read_gguf  # noqa: E402
from ggml_ext.gguf.writer import GGUFWriter  # noqa: E402

SHAPE_7B = dict(n_embd=4096, n_ff=11008, n_head=32, n_head_kv=32, n_layer=32)
# --shape: the attention shapes of the KVQuant decode rows (head dims 64, 128, 256; llama architecture throughout)
SHAPES = {
    "7b": SHAPE_7B,
    "8b-gqa": dict(n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8, n_layer=32),           # Llama-3-8B: hd 128
    "smollm2": dict(n_embd=576, n_ff=1536, n_head=9, n_head_kv=3, n_layer=30),             # SmolLM2-135M: hd 64
    "hd256": dict(n_embd=640, n_ff=2048, n_head=4, n_head_kv=1, n_layer=18, head_dim=256),  # Gemma-3-270M's attention
}
# name: (ggml name, weights per block, bytes per block, byte offsets of the block's fp16 scales, scale factor:
# the fp16 scales are factor x 0.25 / sqrt(fan-in), the factor roughly 8 / the largest |code x sub-scale|)
TYPES = {
    "q4_0": ("Q4_0", 32, 18, (0,), 1.0),
    "iq4_nl": ("IQ4_NL", 32, 18, (0,), 1.0),
    "q2_k": ("Q2_K", 256, 84, (80, 82), 0.2),       # scales[16] qs[64] d dmin
    "q3_k": ("Q3_K", 256, 110, (108,), 0.1),        # hmask[32] qs[64] scales[12] d
    "q4_k": ("Q4_K", 256, 144, (0, 2), 0.01),       # d dmin scales[12] qs[128]
    "iq2_s": ("IQ2_S", 256, 82, (0,), 0.05),        # d qs[64] (grid low bits + signs) qh[8] scales[8]
    "cb2": ("CB2", 256, 78, (0,), 0.005),           # d scales[8] cb[4] qs[64] (docs/formats/codebooks.md)
    "cb3": ("CB3", 256, 110, (0,), 0.005),          # CB2's fields, hmask[32]
}


def random_blocks(rng: np.random.Generator, n_weights: int, scale: float, block: int, block_bytes: int,
                  fp16_offsets: tuple[int, ...]) -> np.ndarray:
    """n_weights / block blocks of random code bytes whose fp16 fields hold ``scale`` (±10 %)."""
    n = n_weights // block
    out = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    for off in fp16_offsets:
        d = (scale * rng.uniform(0.9, 1.1, n)).astype("<f2")
        out[:, off:off + 2] = d.view(np.uint8).reshape(n, 2)
    return out.reshape(-1)


APQ_SEED, APQ_PARENT = 3, 8  # the APQ type's planes (parent 8); tables of precisions 3..8


def apq_tables_len(n_rows: int) -> int:
    """Entries of a matrix's tables: n (2^(P+1) - 2^S) (docs/formats/anyprec.md)."""
    return n_rows * ((2 << APQ_PARENT) - (1 << APQ_SEED))



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("template", type=Path, help="GGUF of a llama-architecture model (tokenizer, chat template)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", choices=sorted(TYPES) + ["apq"], default="q4_0",
                    help="block type of every weight matrix (apq: bitplanes in the decoder layers)")
    ap.add_argument("--apq-rest", choices=sorted(TYPES), default="q4_k",
                    help="with --type apq: the type of the token embedding and output matrices")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    ap.add_argument("--kv-calib", type=Path, default=None, help="also write a KV calibration of the shape here")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    tpl = read_gguf(a.template)
    if tpl.kv.get("general.architecture") != "llama":
        ap.error(f"{a.template}: template must be a llama-architecture GGUF")
    # the model's embedding rows, or (a vocab-only GGUF: llama.cpp's models/ggml-vocab-llama-spm.gguf) its tokens
    has_embd = any(t.name == "token_embd.weight" for t in tpl.tensors)
    n_vocab = tpl.tensor("token_embd.weight").shape[1] if has_embd else len(tpl.kv["tokenizer.ggml.tokens"])
    sh = SHAPES[a.shape]
    e, f, L = sh["n_embd"], sh["n_ff"], a.layers or sh["n_layer"]
    hd = sh.get("head_dim", e // sh["n_head"])
    eq, ekv = sh["n_head"] * hd, sh["n_head_kv"] * hd  # q and k / v projection widths
    apq = a.type == "apq"
    tname, block, block_bytes, fp16_offsets, factor = TYPES[a.apq_rest if apq else a.type]
    qtype = formats.type_by_name(tname).id
    f32 = formats.type_by_name("F32").id
    f16 = formats.type_by_name("F16").id
    apq_id = formats.type_by_name("APQ").id if apq else -1

    w = GGUFWriter(a.out, force=True)
    for key, value in tpl.kv.items():
        if key.startswith("tokenizer.") or key in ("general.architecture",):
            w.add(key, tpl.kv_types[key], value)
    w.add("general.name", "str", f"random {'APQ' if apq else tname} {a.shape} shape, speed benchmarks only")
    if apq:
        w.add("ggml_ext.anyprec.version", "u32", 1)
        w.add("ggml_ext.anyprec.seed_bits", "u32", APQ_SEED)
        w.add("ggml_ext.anyprec.parent_bits", "u32", APQ_PARENT)
        w.add("ggml_ext.anyprec.fisher", "bool", False)
    hp = {"context_length": 4096, "embedding_length": e, "feed_forward_length": f, "block_count": L,
          "attention.head_count": sh["n_head"], "attention.head_count_kv": sh["n_head_kv"],
          "attention.key_length": hd, "attention.value_length": hd, "rope.dimension_count": hd,
          "vocab_size": n_vocab}
    for k, v in hp.items():
        w.add(f"llama.{k}", "u32", v)
    w.add("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5)
    w.add("llama.rope.freq_base", "f32", 10000.0)

    mats = [("token_embd.weight", (e, n_vocab)), ("output.weight", (e, n_vocab))]
    for i in range(L):
        mats += [(f"blk.{i}.attn_q.weight", (e, eq)), (f"blk.{i}.attn_k.weight", (e, ekv)),
                 (f"blk.{i}.attn_v.weight", (e, ekv)), (f"blk.{i}.attn_output.weight", (eq, e))]
        mats += [(f"blk.{i}.ffn_gate.weight", (e, f)), (f"blk.{i}.ffn_up.weight", (e, f)),
                 (f"blk.{i}.ffn_down.weight", (f, e))]
    norms = ["output_norm.weight"] + [f"blk.{i}.{n}_norm.weight" for i in range(L) for n in ("attn", "ffn")]
    def is_apq(name: str) -> bool:
        return apq and name.startswith("blk.")

    for name, shape in mats:
        if is_apq(name):  # planes: P bits per weight; tables right after (the loader finds them by name)
            w.add_tensor_info(name, shape, apq_id, shape[0] * shape[1] * APQ_PARENT // 8)
            w.add_tensor_info(name + ".apq_tables", (apq_tables_len(shape[1]),), f16, 2 * apq_tables_len(shape[1]))
        else:
            w.add_tensor_info(name, shape, qtype, shape[0] * shape[1] // block * block_bytes)
    for name in norms:
        w.add_tensor_info(name, (e,), f32, 4 * e)

    rng = np.random.default_rng(a.seed)
    with w:
        for name, shape in mats:  # scale ~ 1/sqrt(fan-in) over the codes' spread
            if is_apq(name):
                w.write_tensor(rng.integers(0, 256, shape[0] * shape[1] * APQ_PARENT // 8, dtype=np.uint8))
                t = rng.standard_normal(apq_tables_len(shape[1]), dtype=np.float32) * (0.25 / np.sqrt(shape[0]))
                w.write_tensor(t.astype("<f2"))
                continue
            w.write_tensor(random_blocks(rng, shape[0] * shape[1], factor * 0.25 / np.sqrt(shape[0]), block,
                                         block_bytes, fp16_offsets))
        for _ in norms:
            w.write_tensor(np.ones(e, np.float32))
    what = f"{7 * L} APQ matrices (+ tables), 2 {tname}" if apq else f"{len(mats)} {tname} matrices"
    print(f"{a.out}: {w.total_size / 2**30:.2f} GiB, {what}, {L} layers")
    if a.kv_calib:
        write_kv_calib(a.kv_calib, L, sh["n_head_kv"], hd)
        print(f"{a.kv_calib}: KV calibration, {L} layers x {sh['n_head_kv']} KV heads x head dim {hd}")
    return 0


def write_kv_calib(path: Path, n_layers: int, n_kv_heads: int, head_dim: int) -> None:
    """A KV calibration of the shape with made-up tables (see the module's doc): speed rows only."""
    from statistics import NormalDist

    from ggml_ext.kvquant.calibration import K_TABLE_TAGS, V_TABLE_TAGS, KVCalibration
    bits, d = [2, 3, 4], n_kv_heads * head_dim
    layer: dict[str, np.ndarray] = {n: np.full(d, v, np.float32) for n, v in
                                    (("k_lo0", -3.0), ("k_hi0", 3.0), ("k_lo", -3.0), ("k_hi", 3.0),
                                     ("k_fisher", 1.0), ("v_fisher", 1.0))}
    for b in bits:
        q = np.array([NormalDist().inv_cdf((i + 0.5) / 2 ** b) for i in range(2 ** b)], np.float32)
        q /= np.abs(q).max()
        tags = {"k": ("", "_o", *K_TABLE_TAGS), "v": ("", "_o", *V_TABLE_TAGS)}
        for kv, ts in tags.items():
            for t in ts:
                layer[f"{kv}_nuq{b}{t}"] = layer[f"{kv}_deq{b}{t}"] = q
    meta = {"model_id": "random", "model_sha256": "0" * 64, "architecture": "llama", "n_layers": n_layers,
            "n_kv_heads": n_kv_heads, "head_dim": head_dim, "bits": bits, "outlier_fraction": 0.01, "qnorm_bits": []}
    KVCalibration(meta, [dict(layer) for _ in range(n_layers)]).save(path, force=True)


if __name__ == "__main__":
    raise SystemExit(main())
