"""Bad input: a clear error naming what is wrong, exit status 1, no traceback, no output file."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import convert_support as cs


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ggml_ext.cli", "convert", *map(str, args), "-q"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def _copy(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(cs.tiny("qwen2"), d)
    return d


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _rewrite_tensor(d, name, fn):
    """Rewrite model.safetensors with tensor ``name`` replaced by fn(array) (safetensors' own writer)."""
    from safetensors.numpy import load_file, save_file
    state = load_file(str(d / "model.safetensors"))
    state[name] = fn(state[name])
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})


def _missing_config(d):
    (d / "config.json").unlink()


def _unknown_arch(d):
    _edit_config(d, architectures=["FalconForCausalLM"])


def _multimodal(d):
    _edit_config(d, architectures=["Gemma3ForConditionalGeneration"])


def _truncated(d):
    p = d / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 1000])


def _truncated_header(d):
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[:100])


def _garbage_header(d):
    p = d / "model.safetensors"
    data = bytearray(p.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    data[8:8 + n] = b"{" * n
    p.write_bytes(bytes(data))


def _shape_mismatch(d):
    _edit_config(d, intermediate_size=cs.FF * 2)


def _wrong_layer_count(d):
    _edit_config(d, num_hidden_layers=1)


def _missing_tensor(d):
    from safetensors.numpy import load_file, save_file
    state = load_file(str(d / "model.safetensors"))
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})


def _unknown_tensor(d):
    from safetensors.numpy import load_file, save_file
    state = load_file(str(d / "model.safetensors"))
    state["model.layers.0.mlp.extra_proj.weight"] = np.zeros((4, 4), np.float32)
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})


def _nan(d):
    def poison(a):
        a = a.copy()
        a[3, 5] = np.nan
        return a
    _rewrite_tensor(d, "model.layers.1.self_attn.v_proj.weight", poison)


def _inf(d):
    def poison(a):
        a = a.copy()
        a[-1] = np.inf
        return a
    _rewrite_tensor(d, "model.norm.weight", poison)


def _f16_overflow(d):
    _rewrite_tensor(d, "model.layers.0.mlp.up_proj.weight", lambda a: a * 1e6)


def _int_dtype(d):
    _rewrite_tensor(d, "model.layers.0.mlp.up_proj.weight", lambda a: a.astype(np.int32))


def _no_weights(d):
    (d / "model.safetensors").unlink()


def _missing_shard(d):
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    (d / "model.safetensors").unlink()


def _no_tokenizer(d):
    (d / "tokenizer.json").unlink()


def _bad_json(d):
    (d / "config.json").write_text("{ not json")


def _untied_without_lm_head(d):
    from safetensors.numpy import load_file, save_file
    state = load_file(str(d / "model.safetensors"))
    del state["lm_head.weight"]
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})


def _bin_with_code(d):
    # a pickle that would run code on load: weights_only=True must refuse it
    import pickle
    (d / "model.safetensors").unlink()

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    import torch
    torch.save({"x": Evil()}, d / "pytorch_model.bin", pickle_protocol=pickle.HIGHEST_PROTOCOL)


CASES = {
    "missing config": (_missing_config, "no config.json"),
    "bad json": (_bad_json, "not valid JSON"),
    "unknown architecture": (_unknown_arch, "unsupported architecture FalconForCausalLM; supported: LlamaForCausalLM"),
    "multimodal": (_multimodal, "unsupported architecture Gemma3ForConditionalGeneration"),
    "truncated safetensors": (_truncated, "truncated safetensors file: tensor"),
    "truncated header": (_truncated_header, "truncated or corrupt safetensors file"),
    "garbage header": (_garbage_header, "corrupt safetensors header"),
    "shape mismatch": (_shape_mismatch, "has shape [64, 128], but config.json implies [64, 256]"),
    "layer count": (_wrong_layer_count, "belongs to layer 1, but config.json says num_hidden_layers=1"),
    "missing tensor": (_missing_tensor, "missing tensors model.layers.1.mlp.down_proj.weight"),
    "unknown tensor": (_unknown_tensor, "does not know where to put: model.layers.0.mlp.extra_proj.weight"),
    "nan": (_nan, "model.layers.1.self_attn.v_proj.weight (blk.1.attn_v.weight) holds 1 NaN or infinite"),
    "inf": (_inf, "model.norm.weight (output_norm.weight) holds 1 NaN or infinite"),
    "f16 overflow": (_f16_overflow, "beyond float16's range"),
    "integer dtype": (_int_dtype, "has dtype I32; only F32, F16, BF16"),
    "no weights": (_no_weights, "holds no weights"),
    "missing shard": (_missing_shard, "names shard model-00001-of-00002.safetensors, which is missing"),
    "no tokenizer": (_no_tokenizer, "has no tokenizer"),
    "untied without lm_head": (_untied_without_lm_head, "missing tensors lm_head.weight"),
    "pickle with code": (_bin_with_code, "cannot be loaded as a weights-only PyTorch checkpoint"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case, tmp_path):
    d = _copy(tmp_path)
    breaker, message = CASES[case]
    breaker(d)
    out = tmp_path / "out" / "m.gguf"
    out.parent.mkdir()
    r = _cli(d, "-o", out, "--type", "f16")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error:" in r.stderr and "Traceback" not in r.stderr
    assert message in r.stderr, r.stderr
    assert "pwned" not in r.stdout + r.stderr
    assert list(out.parent.iterdir()) == [], "no output, no temp file"


def test_bad_arguments(tmp_path):
    r = _cli(cs.tiny("qwen2"), "-o", tmp_path / "no" / "such" / "dir.gguf")
    assert r.returncode == 1 and "output folder does not exist" in r.stderr
    r = _cli(tmp_path / "nothing-here", "-o", tmp_path / "x.gguf")
    assert r.returncode == 1 and "not a folder" in r.stderr
    r = _cli(cs.tiny("qwen2"), "-o", tmp_path / "x.gguf", "--keep", "no-equals-sign")
    assert r.returncode == 1 and "PATTERN=TYPE" in r.stderr
    r = _cli(cs.tiny("qwen2"), "-o", tmp_path / "x.gguf", "--type", "q7_k")   # no such ggml type
    assert r.returncode == 2 and "invalid choice" in r.stderr
    assert not (tmp_path / "x.gguf").exists()
