"""KVQuant pre-RoPE keys on the architectures beyond llama (issue 20: "every converter architecture"; phi3 too):
a K norm before RoPE (Qwen3, Gemma-3: the cache holds K before the norm, where `calibrate kv` measured it,
and the norm is applied to the dequantized keys; ggml_ext_llama_k_unroped / _k_rope) and the iSWA cache of
sliding-window models (Gemma-2/3, patch 0327: both of its caches take the positions input).

Tiny random models with 64-wide heads (NUQ blocks are 64 channels), calibrated on 2 x 48 tokens: llama.cpp
with ``-ctk nuq4`` (f16 values) runs a prompt longer than Gemma's sliding window (6) -- so the SWA cache's
cells are reused -- and its logits are nearer transformers' than with ``-ctk nuq2``; the f32 cache is the
reference of what the rest of the graph costs. The real-model check (Gemma-3-270M, perplexity with nuq4
keys near f16's) is in docs/RESULTS.md. Phi-3 (its K and V parts of the fused qkv output, the K a view
that the pre-RoPE cache takes before RoPE) runs the same check."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("llama_cpp")

import convert_support as cs  # noqa: E402


def _logits(gguf, ids, type_k):
    from ggml_ext.llama_cpp_glue import Llama
    llm = Llama(str(gguf), logits_all=True, n_ctx=64, n_batch=64, n_threads=2, type_k=type_k, type_v=1,
                flash_attn=True, verbose=False)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "gemma3", "phi3"])
def test_pre_rope_keys_on_k_norm_and_sliding_window_models(arch, tmp_path, monkeypatch):
    over = {"query_pre_attn_scalar": 64} if arch.startswith("gemma") else {}
    # phi3's head dim is hidden / heads (llama.cpp's phi3), and its K a view of the fused qkv output
    model = cs.tiny(arch, hidden_size=4 * 64) if arch == "phi3" else cs.tiny(arch, head_dim=64, **over)
    if arch in ("qwen3", "gemma3"):
        model = cs.k_proj_scaled(model, tmp_path / "scaled", 20.0)
    cal, gguf = cs.tiny_kv_setup(model, tmp_path, bits=(4, 2))
    ids = [int(x) for x in np.random.default_rng(1).integers(3, 200, 40)]
    ref = cs.hf_logits(model, ids)
    monkeypatch.setenv("GGML_EXT_KV_CALIB", str(cal))
    err = {name: float(np.linalg.norm(_logits(gguf, ids, t) - ref) / np.linalg.norm(ref))
           for name, t in (("f32", 0), ("nuq4", 103), ("nuq2", 105))}
    assert err["f32"] < 0.01, err
    assert err["f32"] < err["nuq4"] < err["nuq2"], err
    assert err["nuq4"] < 0.5, err


def test_head_dim_the_blocks_do_not_divide_is_refused(tmp_path, monkeypatch, wiki_test):
    """Phi-3-mini's head dim is 96: the 64-value NUQ blocks do not divide it, and llama.cpp's own check at context
    creation refuses the cache with a message (a clean error exit, no abort in a view of 96 values)."""
    from ggml_ext import tools
    model = cs.tiny("phi3", hidden_size=4 * 96)
    cal, gguf = cs.tiny_kv_setup(model, tmp_path, bits=(3,))
    monkeypatch.setenv("GGML_EXT_KV_CALIB", str(cal))
    msg = cs.tool_refused(lambda: tools.perplexity(gguf, wiki_test, n_ctx=64, chunks=1, threads=2,
                                                   extra=["-fa", "on", "-ctk", "nuq3"]))
    assert "does not divide n_embd_head_k=96" in msg, msg
