"""Every supported architecture: a tiny random model built from its transformers class,
converted, run by our llama.cpp, logits compared with transformers.

Every parameter is random (norm weights included), so a wrong name map, a missing
Q/K permutation, a forgotten Gemma ``+1`` or a wrong soft-cap shows as a large
difference. Written as f32 with an f32 KV cache, the logits (standard deviation
about 1) must agree within 5e-3; measured: about 5e-6, and about 1.4e-3 for Gemma,
whose GELU llama.cpp computes with a lookup table. The prompt (24 tokens) is longer
than Gemma's sliding window (6), so the window is exercised too.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import convert_support as cs
from ggml_ext.converters import ConversionError, convert

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"]
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
             "gemma3": "gemma3", "phi3": "phi3"}


def _prompt(folder, n=24, seed=1):
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    return [int(x) for x in np.random.default_rng(seed).integers(3, min(vocab, 2000), n)]


def _compare(folder, gguf, tol=5e-3):
    ids = _prompt(folder)
    ref = cs.hf_logits(folder, ids)
    got = cs.gguf_logits(gguf, ids)
    assert got.shape == ref.shape
    diff = float(np.abs(ref - got).max())
    assert diff < tol, f"max |logit difference| {diff:.2e}"
    assert (ref.argmax(-1) == got.argmax(-1)).all()
    return diff


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_logits_match_transformers(arch, tmp_path):
    folder = cs.tiny(arch)
    out = tmp_path / f"{arch}.gguf"
    r = convert(folder, out, "f32")
    assert r.architecture == cs.ARCH_CLASSES[arch] and r.gguf_architecture == GGUF_ARCH[arch]
    _compare(folder, out)


def test_transforms_are_the_ones_claimed(tmp_path):
    """The tables' transforms, checked on the written bytes: llama Q/K permutation, gemma +1."""
    from ggml_ext.converters.source import Checkpoint
    llama = cs.read_tensor_bytes(_f32(cs.tiny("llama"), tmp_path / "l.gguf"))
    src = Checkpoint(cs.tiny("llama"))
    q = src.load("model.layers.0.self_attn.q_proj.weight")
    k = src.load("model.layers.0.self_attn.k_proj.weight")
    got_q = np.frombuffer(llama["blk.0.attn_q.weight"][2], dtype=np.float32).reshape(q.shape)
    got_k = np.frombuffer(llama["blk.0.attn_k.weight"][2], dtype=np.float32).reshape(k.shape)
    hd = cs.HIDDEN // cs.HEADS
    # row 2*i of a head is HF's row i (first half), row 2*i+1 is HF's row i + hd/2
    assert np.array_equal(got_q[0], q[0]) and np.array_equal(got_q[1], q[hd // 2]) and np.array_equal(got_q[2], q[1])
    assert np.array_equal(got_k[hd + 1], k[hd + hd // 2])
    gemma = cs.read_tensor_bytes(_f32(cs.tiny("gemma3"), tmp_path / "g.gguf"))
    g = Checkpoint(cs.tiny("gemma3"))
    for hf, gg in (("model.layers.1.self_attn.q_norm.weight", "blk.1.attn_q_norm.weight"),
                   ("model.layers.0.pre_feedforward_layernorm.weight", "blk.0.ffn_norm.weight"),
                   ("model.norm.weight", "output_norm.weight")):
        assert np.array_equal(np.frombuffer(gemma[gg][2], dtype=np.float32), g.load(hf) + np.float32(1))
    assert "output.weight" not in gemma, "tied"


def _f32(folder, out):
    convert(folder, out, "f32")
    return out


def test_gemma_metadata(tmp_path):
    from ggml_ext.gguf import read_gguf
    for arch in ("gemma2", "gemma3"):
        g = read_gguf(_f32(cs.tiny(arch), tmp_path / f"{arch}.gguf")).kv
        assert g[f"{arch}.attention.sliding_window"] == 6
        assert g[f"{arch}.attention.sliding_window_pattern"] == [True, False]
        assert g["tokenizer.ggml.model"] == "llama" and g["tokenizer.ggml.add_space_prefix"] is False
    g = read_gguf(tmp_path / "gemma2.gguf").kv
    assert g["gemma2.attn_logit_softcapping"] == 50.0 and g["gemma2.final_logit_softcapping"] == 30.0
    g = read_gguf(tmp_path / "gemma3.gguf").kv
    assert g["gemma3.rope.freq_base"] == 1_000_000.0 and g["gemma3.rope.freq_base_swa"] == 10_000.0


def test_phi3_fused_tensors_and_padded_vocab(tmp_path):
    t = cs.read_tensor_bytes(_f32(cs.tiny("phi3"), tmp_path / "p.gguf"))
    d, ff, hd = cs.HIDDEN, cs.FF, cs.HIDDEN // cs.HEADS
    assert t["blk.0.attn_qkv.weight"][1] == (d, d + 2 * cs.KV_HEADS * hd)
    assert t["blk.0.ffn_up.weight"][1] == (d, 2 * ff)
    assert "blk.0.ffn_gate.weight" not in t
    from ggml_ext.gguf import read_gguf
    kv = read_gguf(tmp_path / "p.gguf").kv
    tokens = kv["tokenizer.ggml.tokens"]
    assert len(tokens) == 2048 and tokens[2047] == "[PAD2047]" and kv["tokenizer.ggml.token_type"][2047] == 5


def test_rope_scaling_llama3_and_linear(tmp_path):
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    folder = cs.tiny("llama", rope_parameters=llama3)
    out = _f32(folder, tmp_path / "l3.gguf")
    t = cs.read_tensor_bytes(out)
    freqs = np.frombuffer(t["rope_freqs.weight"][2], dtype=np.float32)
    assert freqs.shape == (cs.HIDDEN // cs.HEADS // 2,) and freqs[0] == 1.0 and freqs[-1] == 8.0
    _compare(folder, out)
    folder = cs.tiny("qwen2", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})
    out = _f32(folder, tmp_path / "lin.gguf")
    from ggml_ext.gguf import read_gguf
    kv = read_gguf(out).kv
    assert kv["qwen2.rope.scaling.type"] == "linear" and kv["qwen2.rope.scaling.factor"] == 4.0
    _compare(folder, out)


def test_input_formats_bf16_f16_sharded_and_pytorch_bin(tmp_path):
    import torch
    from safetensors.torch import load_file
    base = cs.tiny("qwen2")
    ref = cs.read_tensor_bytes(_f32(base, tmp_path / "ref.gguf"))
    state = load_file(str(base / "model.safetensors"))

    def folder(name):
        d = tmp_path / name
        d.mkdir()
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(base / f, d / f)
        return d

    # sharded safetensors, with its index, from transformers' own writer
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    sharded = folder("sharded")
    m.save_pretrained(sharded, max_shard_size="300KB")
    assert (sharded / "model.safetensors.index.json").is_file() and len(list(sharded.glob("*.safetensors"))) > 2
    assert cs.read_tensor_bytes(_f32(sharded, tmp_path / "sh.gguf")) == ref

    # PyTorch .bin, single and sharded (torch.save; read back with weights_only=True)
    single = folder("bin")
    torch.save(state, single / "pytorch_model.bin")
    assert cs.read_tensor_bytes(_f32(single, tmp_path / "bin.gguf")) == ref
    shards = folder("bin-sharded")
    names = sorted(state)
    half = {n: state[n] for n in names[: len(names) // 2]}, {n: state[n] for n in names[len(names) // 2:]}
    wmap = {}
    for i, part in enumerate(half):
        fname = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save(part, shards / fname)
        wmap.update({n: fname for n in part})
    (shards / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": wmap}))
    assert cs.read_tensor_bytes(_f32(shards, tmp_path / "binsh.gguf")) == ref

    # bf16 and f16 checkpoints: converted exactly (both are subsets of float32)
    for dtype in ("bfloat16", "float16"):
        d = folder(dtype)
        AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype)).save_pretrained(d)
        got = cs.read_tensor_bytes(_f32(d, tmp_path / f"{dtype}.gguf"))
        exact = {k: v.to(getattr(torch, dtype)).float().numpy().tobytes() for k, v in state.items()}
        assert got["blk.0.attn_q.weight"][2] == exact["model.layers.0.self_attn.q_proj.weight"]
        _compare(d, tmp_path / f"{dtype}.gguf")


def test_unsupported_features_are_refused(tmp_path):
    folder = tmp_path / "dyn"
    shutil.copytree(cs.tiny("qwen2"), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="RoPE scaling 'dynamic' is not supported"):
        convert(folder, tmp_path / "x.gguf")
    cfg = json.loads((cs.tiny("gemma2") / "config.json").read_text())
    folder = tmp_path / "g2"
    shutil.copytree(cs.tiny("gemma2"), folder)
    cfg["query_pre_attn_scalar"] = 100
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="query_pre_attn_scalar"):
        convert(folder, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
