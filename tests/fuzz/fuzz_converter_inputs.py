#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Reliability": atheris fuzzing of the converter's inputs.
"""Coverage-guided fuzzing of the converter's inputs (ggml_ext.converters), with atheris.

    make install                                      # installs atheris into .venv (a PyPI wheel, or built)
    python tests/fuzz/fuzz_converter_inputs.py --make-seeds tests/fuzz/converter_seeds   # (re)build the seeds
    mkdir -p /tmp/ccorpus && cp tests/fuzz/converter_seeds/* /tmp/ccorpus/
    python tests/fuzz/fuzz_converter_inputs.py /tmp/ccorpus -max_total_time=600 -timeout=20 -rss_limit_mb=2048 \\
        -artifact_prefix=/tmp/ccrash-
    python tests/fuzz/fuzz_converter_inputs.py /tmp/ccrash-XXXX       # replay one input
    python tests/fuzz/fuzz_converter_inputs.py --unpack INPUT DIR     # an input as the model folder it stands for
    python tests/fuzz/fuzz_converter_inputs.py --minimize CRASH OUT   # a smaller input with the same exception type

One input is one Hugging Face model folder: a first byte choosing the output
type, then the files of SLOTS in order, separated by SEP (an empty slot: no
such file; the last slot is the `--pre-tokenizer` name, if any).  Each input
is written to a fresh folder on tmpfs (removed after it) and converted by
`ggml_ext.converters.convert` into a GGUF file there.
The property: convert() raises ConversionError with a message and leaves no
file, or it writes a file that round-trips: our reader parses it, its metadata
and its tensors' names, shapes and types are the converter's plan, every
tensor's data passes ggml's row validation (no NaN/inf values or scales), F32,
F16 and BF16 data equals the source tensor in that type bit for bit, and Q8_0 /
Q4_0 (interleaved too) data dequantizes to the source within one quantization
step.  Any other exception (KeyError, TypeError, struct.error, MemoryError,
RecursionError, an AssertionError of these checks...) is a crash, and so is a
hang (libFuzzer's -timeout).  A crash found here belongs in
tests/fuzz/converter_regressions/ (replayed by tests/reliability/test_reliability_fuzz_convert.py).

Only the fuzz run needs atheris: imported as a module (the tests' replay of the
committed inputs through `check_one`) or with --make-seeds, --unpack or
--minimize, this file does not import it.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

FUZZING = __name__ == "__main__" and sys.argv[1:2] not in (["--make-seeds"], ["--unpack"], ["--minimize"])
if FUZZING:
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: `make install` installs it into .venv (or `.venv/bin/pip install "
                 "atheris`); replaying inputs needs no atheris: tests/reliability/test_reliability_fuzz_convert.py")
    # coverage instrumentation of the converters: they must be first imported here
    _instrumented = atheris.instrument_imports(include=["ggml_ext.converters"])
else:
    _instrumented = contextlib.nullcontext()
with _instrumented:
    from ggml_ext.converters import OUTPUT_TYPES, ConversionError, ConversionResult, convert, plan
    from ggml_ext.gguf.writer import _encode_value
    from ggml_ext.converters.pipeline import _transform
    from ggml_ext.converters.policy import CODEBOOK_RECIPES
from ggml_ext import quants
from ggml_ext.gguf import GGUFFile, TensorInfo, read_gguf

SEP = b"\n@@ggml-ext-fuzz-file@@\n"
# PRE_SLOT is no model file: the harness passes its text as convert(pre_tokenizer=...) (`--pre-tokenizer`).
PRE_SLOT = "pre_tokenizer.txt"
SLOTS = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
         "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
         PRE_SLOT)
TYPES = tuple(OUTPUT_TYPES)


def split(data: bytes) -> tuple[str, dict[str, bytes]]:
    """(output type, {file name: bytes}) of one input."""
    out_type = TYPES[data[0] % len(TYPES)] if data else "f16"
    parts = data[1:].split(SEP)
    return out_type, {name: b for name, b in zip(SLOTS, parts) if b}


def join(out_type: str, files: dict[str, bytes]) -> bytes:
    assert set(files) <= set(SLOTS), set(files) - set(SLOTS)
    parts = [files.get(n, b"") for n in SLOTS]
    while parts and not parts[-1]:  # trailing empty slots are left out (not rstrip(SEP): it strips characters)
        parts.pop()
    return bytes([TYPES.index(out_type)]) + SEP.join(parts)


# What the types that calibrate (the codebooks' activation importance) tokenize: short, so one input stays
# well inside libFuzzer's -timeout however slow the fuzzed tokenizer and model are (wiki-train, the default,
# is 4 MB); two windows of 32 tokens.
CALIB_TEXT = " ".join(f"The {w} of the river rose {i} feet in the night, and the town woke to water."
                      for i, w in enumerate(("level", "colour", "sound", "speed", "width", "smell") * 8))
_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def unpack(data: bytes, folder: Path) -> str:
    """Write the model folder of `data` into `folder` (only the slots' files); the output type."""
    out_type, files = split(data)
    folder.mkdir(parents=True, exist_ok=True)
    for name in SLOTS:
        p = folder / name
        if name in files:
            p.write_bytes(files[name])
        elif p.exists():
            p.unlink()
    return out_type


def check_one(data: bytes) -> GGUFFile | None:
    """Convert the input's folder; the output as our reader reads it, None if refused with ConversionError."""
    work = Path(tempfile.mkdtemp(prefix="ggml-ext-fuzz-convert-", dir=_TMP))  # tmpfs: about 0.1 ms
    try:
        out_type = unpack(data, work / "model")
        pre = split(data)[1].get(PRE_SLOT)
        options = {"pre_tokenizer": None if pre is None else pre.decode("utf-8", "replace")}  # plan() takes them too
        out = work / "out.gguf"
        calibration = {}
        if out_type in CODEBOOK_RECIPES:      # the types that calibrate (cb2, cb3...): a short text, two windows
            text = work / "calib.txt"
            text.write_text(CALIB_TEXT)
            calibration = {"calib": text, "calib_samples": 2, "calib_seq_len": 32, "calib_progress": False}
        try:
            result = convert(work / "model", out, out_type, force=True, threads=1, warn=lambda msg: None,
                             **calibration, **options)
        except ConversionError as e:
            assert str(e), "ConversionError without a message"
            assert not out.exists(), "a refused conversion left an output file"
            return None
        g = read_gguf(out)                     # what we write, our reader reads
        check_round_trip(work / "model", out_type, out, g, result, **options)
        return g
    finally:
        shutil.rmtree(work, ignore_errors=True)   # libFuzzer ends with exit(): no atexit clean-up


def check_round_trip(model: Path, out_type: str, out: Path, g: GGUFFile, result: ConversionResult,
                     **options) -> None:
    """`out` (read as `g`) holds what convert(model, out, out_type, **options) planned: metadata, tensor infos
    and data."""
    pl = plan(model, out_type, warn=lambda msg: None, **options)  # headers only: what convert() wrote (deterministic)
    try:
        assert g.kv["general.architecture"] == result.gguf_architecture
        want_kv = {key: (vtype, value) for key, vtype, value in pl.metadata}
        want_kv["ggml_ext.source_hash"] = ("str", result.source_hash)     # set after the tensors were written
        assert list(g.kv) == list(want_kv), set(g.kv) ^ set(want_kv)
        for key, (vtype, value) in want_kv.items():
            assert g.kv_types[key] == vtype, (key, g.kv_types[key], vtype)
            # the writer's own encoding of both sides: lists, arrays and numpy values compare alike
            assert _encode_value(vtype, g.kv[key]) == _encode_value(vtype, value), f"metadata {key} changed"
        assert len(g.tensors) == len(pl.tensors) == result.n_tensors
        assert dict(result.type_counts) == {n: s.count for n, s in g.type_histogram().items()}
        raw = out.read_bytes()                 # tiny models on tmpfs
        for p, t in zip(pl.tensors, g.tensors):
            assert (t.name, t.shape, t.type_name) == (p.gguf_name, tuple(reversed(p.shape)), p.type_name), (t, p)
            data = np.frombuffer(raw, np.uint8, t.nbytes, t.file_offset)
            assert quants.validate(t.type_id, data), f"{t.name}: NaN or inf in its {t.type_name} data"
            x = p.data if p.data is not None else pl.checkpoint.load(p.hf_name)
            _check_values(t, data, _transform(pl.arch, pl.hparams, p, np.asarray(x, dtype=np.float32)))
    finally:
        pl.checkpoint.close()


_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18}   # 32 values: an f16 scale, then 32 int8 / 32 nibbles


def _dequantize(type_name: str, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 / Q4_0 bytes as float32 values, and each value's |scale| (its quantization step)."""
    b = data.reshape(-1, _BLOCK_BYTES[type_name])
    d = b[:, :2].copy().view("<f2").astype(np.float32)
    if type_name == "Q8_0":
        q = b[:, 2:].view(np.int8).astype(np.float32)
    else:                                      # low nibbles are values 0..15 of the block, high ones 16..31
        q = np.concatenate([b[:, 2:] & 15, b[:, 2:] >> 4], axis=1).astype(np.float32) - 8
    return (d * q).ravel(), np.broadcast_to(np.abs(d), q.shape).ravel()


def _check_values(t: TensorInfo, data: np.ndarray, x: np.ndarray) -> None:
    """The tensor's data against `x`, the source tensor as convert() handed it to the quantizer."""
    x = x.astype(np.float32).ravel()           # rows of shape[0] values, as written
    name = t.type_name
    if name == "F32":
        assert np.array_equal(data.view("<u4"), x.view(np.uint32)), f"{t.name}: F32 data differs from the source"
    elif name == "F16":                        # ggml and numpy both round to nearest even
        assert np.array_equal(data.view("<u2"), x.astype(np.float16).view(np.uint16)), f"{t.name}: F16 data"
    elif name == "BF16":                       # ggml_compute_fp32_to_bf16 for finite values
        u = x.view(np.uint32)
        bf16 = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        assert np.array_equal(data.view("<u2"), bf16), f"{t.name}: BF16 data"
    else:
        if name in quants.INTERLEAVED:         # Q4_0 rows interleaved: back to plain Q4_0 (lossless)
            data, name = quants.unpack_q4_0(name, data, t.n_rows, t.shape[0]), "Q4_0"
        if name in _BLOCK_BYTES:
            # round to nearest: half a step; Q4_0 clamps the top value (one step); the f16 scale's rounding
            # adds < 1 %; 2**-16 covers scales that underflow f16 (tiny values)
            values, step = _dequantize(name, data)
            err = np.abs(values - x)
            assert np.all(err <= 1.01 * step + 2.0**-16), f"{t.name}: {name} data is off the source by {err.max():g}"


def test_one_input(data: bytes) -> None:
    check_one(data)


# --------------------------------------------------------------------------- minimizing


def _failure(data: bytes) -> str | None:
    """The crash of `data` as "ExceptionType" (None if it passes)."""
    try:
        test_one_input(data)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__
    return None


def _json_candidates(obj):
    """obj with one key or list element removed, or one nested value simplified, outermost first."""
    if isinstance(obj, dict):
        for k in list(obj):
            yield {kk: v for kk, v in obj.items() if kk != k}
        for k, v in obj.items():
            for c in _json_candidates(v):
                yield {**obj, k: c}
    elif isinstance(obj, list):
        for i in range(len(obj)):
            yield obj[:i] + obj[i + 1:]
        for i, v in enumerate(obj):
            for c in _json_candidates(v):
                yield obj[:i] + [c] + obj[i + 1:]
    elif isinstance(obj, int) and not isinstance(obj, bool) and obj > 1:
        yield 1


def _safetensors_candidates(data: bytes):
    """A well-formed safetensors file with one tensor fewer (its data dropped)."""
    import struct
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        body = data[8 + n:]
        entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
        for drop in range(len(entries)):
            new, chunks, at = {}, [], 0
            for i, (k, v) in enumerate(entries):
                if i == drop:
                    continue
                b, e = v["data_offsets"]
                chunks.append(body[b:e])
                new[k] = {**v, "data_offsets": [at, at + e - b]}
                at += e - b
            raw = json.dumps(new).encode()
            yield struct.pack("<Q", len(raw)) + raw + b"".join(chunks)
    except (ValueError, TypeError, KeyError, AttributeError, struct.error):
        return


def minimize(data: bytes) -> bytes:
    """A smaller input with the same kind of crash: slots dropped, JSON files pruned key by key.

    libFuzzer's -minimize_crash re-runs the script by its #! line, without atheris; this runs in-process.
    """
    want = _failure(data)
    assert want is not None, "the input does not crash"
    out_type, files = split(data)
    changed = True
    while changed:
        changed = False
        for name in list(files):
            trial = {n: b for n, b in files.items() if n != name}
            if _failure(join(out_type, trial)) == want:
                files, changed = trial, True
        for name in list(files):
            if name.endswith(".json"):
                try:
                    obj = json.loads(files[name])
                    cands = (json.dumps(c, ensure_ascii=False).encode() for c in _json_candidates(obj))
                except ValueError:
                    continue
            else:
                cands = _safetensors_candidates(files[name])
            for cand in cands:
                trial = {**files, name: cand}
                if _failure(join(out_type, trial)) == want:
                    files, changed = trial, True
                    break
    return join(out_type, files)


# --------------------------------------------------------------------------- seeds


def _safetensors(tensors: dict) -> bytes:
    from safetensors.numpy import save
    return save(tensors)


def _bpe_tokenizer(pre_tokenizer: dict, n: int) -> tuple[dict, list[str]]:
    """A byte-level BPE tokenizer.json of n tokens: byte characters, then merges of them."""
    byte_chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ċ", ".", ",", "!", "?"]
    vocab = {c: i for i, c in enumerate(byte_chars)}
    merges = []
    pairs = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("a", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n")]
    for a, b in pairs:
        if len(vocab) >= n - 3:
            break
        vocab[a + b] = len(vocab)
        merges.append([a, b])
    added = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": len(vocab) + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(added)],
        "normalizer": None, "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    return tok, list(vocab) + added


def _spm_tokenizer() -> tuple[dict, list[str]]:
    """A SentencePiece-style tokenizer.json (BPE with byte fallback, "▁" for spaces), as Gemma's."""
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(16)]
    pieces += ["▁", "a", "b", "c", "▁a", "▁b", "ab", "▁ab"]
    vocab = {p: i for i, p in enumerate(pieces)}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(pieces[:4])]
        + [{"id": len(pieces), "content": "<start_of_turn>", "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [["▁", "a"], ["▁", "b"], ["a", "b"], ["▁a", "b"]]},
    }
    return tok, pieces + ["<start_of_turn>"]


def _weights(rng, cfg: dict, dtype, fused: bool = False, qkv_bias: bool = False, qk_norm: bool = False,
             gemma_norms: bool = False, lm_head: bool = False) -> dict:
    import numpy as np
    d, v, ff = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim", d // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(dtype)

    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": np.ones(d, dtype)}
    if lm_head:
        t["lm_head.weight"] = w(v, d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(d, dtype)
        t[p + "post_attention_layernorm.weight"] = np.ones(d, dtype)
        if gemma_norms:
            t[p + "pre_feedforward_layernorm.weight"] = np.ones(d, dtype)
            t[p + "post_feedforward_layernorm.weight"] = np.ones(d, dtype)
        if fused:
            t[p + "self_attn.qkv_proj.weight"] = w(q + 2 * kv, d)
            t[p + "mlp.gate_up_proj.weight"] = w(2 * ff, d)
        else:
            t[p + "self_attn.q_proj.weight"] = w(q, d)
            t[p + "self_attn.k_proj.weight"] = w(kv, d)
            t[p + "self_attn.v_proj.weight"] = w(kv, d)
            t[p + "mlp.gate_proj.weight"] = w(ff, d)
            t[p + "mlp.up_proj.weight"] = w(ff, d)
        t[p + "self_attn.o_proj.weight"] = w(d, q)
        t[p + "mlp.down_proj.weight"] = w(d, ff)
        if qkv_bias:
            t[p + "self_attn.q_proj.bias"] = w(q)
            t[p + "self_attn.k_proj.bias"] = w(kv)
            t[p + "self_attn.v_proj.bias"] = w(kv)
        if qk_norm:
            t[p + "self_attn.q_norm.weight"] = np.ones(hd, dtype)
            t[p + "self_attn.k_norm.weight"] = np.ones(hd, dtype)
    return t


def _dumps(obj) -> bytes:
    return json.dumps(obj, indent=1, ensure_ascii=False).encode()


def seed_inputs() -> dict[str, bytes]:
    """Four small real model folders (llama, qwen2 sharded, gemma3, phi3), as fuzz inputs; reproducible."""
    import numpy as np
    rng = np.random.default_rng(0)
    small = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "max_position_embeddings": 256, "rms_norm_eps": 1e-5}
    seeds = {}

    # 1. Llama: byte-level BPE (plain ByteLevel pre-tokenizer: "gpt-2"), F16 to q8_0, untied, llama3 RoPE, chat template
    tok, toks = _bpe_tokenizer({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                "use_regex": True}, 44)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **small, "vocab_size": len(toks),
           "hidden_size": 32, "num_hidden_layers": 1,  # rows of 32: q8_0 blocks
           "tie_word_embeddings": False, "rope_theta": 500000.0, "bos_token_id": len(toks) - 3,
           "eos_token_id": [len(toks) - 1, len(toks) - 3],
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 128}}
    tcfg = {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"}
    seeds["llama-bpe-f16"] = join("q8_0", {
        "config.json": _dumps(cfg), "tokenizer.json": _dumps(tok), "tokenizer_config.json": _dumps(tcfg),
        "model.safetensors": _safetensors(_weights(rng, cfg, np.float16, lm_head=True))})

    # 2. Qwen2: two shards and an index, q/k/v biases, YaRN, a Llama 3-style Split + ByteLevel pre-tokenizer
    from ggml_ext.converters.vocab import _QWEN2_RE
    tok, toks = _bpe_tokenizer({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": _QWEN2_RE}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}, 40)
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **small, "vocab_size": len(toks),
           "tie_word_embeddings": True, "rope_theta": 1000000.0, "use_sliding_window": False,
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}
    w = _weights(rng, cfg, np.float32, qkv_bias=True)
    names = sorted(w)
    shard1, shard2 = {n: w[n] for n in names[: len(names) // 2]}, {n: w[n] for n in names[len(names) // 2:]}
    index = {"metadata": {"total_size": sum(a.nbytes for a in w.values())},
             "weight_map": {**{n: SLOTS[5] for n in shard1}, **{n: SLOTS[6] for n in shard2}}}
    seeds["qwen2-sharded-f32"] = join("q4_0", {
        "config.json": _dumps(cfg), "tokenizer.json": _dumps(tok),
        "tokenizer_config.json": _dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
        "model.safetensors.index.json": _dumps(index), SLOTS[5]: _safetensors(shard1), SLOTS[6]: _safetensors(shard2)})

    # 3. Gemma 3: SentencePiece-style tokenizer.json, sliding layers, q/k norms; BF16 (stored by torch)
    tok, toks = _spm_tokenizer()
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **small, "vocab_size": len(toks),
           "head_dim": 8, "query_pre_attn_scalar": 8, "hidden_activation": "gelu_pytorch_tanh",
           "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 1000000.0,
           "rope_local_base_freq": 10000.0, "final_logit_softcapping": None, "attn_logit_softcapping": None,
           "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    w = _weights(rng, cfg, np.float32, qk_norm=True, gemma_norms=True)
    import torch
    from safetensors.torch import save as save_torch
    st = save_torch({n: torch.from_numpy(a).to(torch.bfloat16) for n, a in w.items()})
    seeds["gemma3-spm-bf16"] = join("iq4_nl", {
        "config.json": _dumps(cfg), "tokenizer.json": _dumps(tok),
        "tokenizer_config.json": _dumps({"add_bos_token": True, "bos_token": "<bos>", "eos_token": "<eos>",
                                         "chat_template": [{"name": "default", "template": "{{ messages }}"},
                                                           {"name": "tool_use", "template": "{{ tools }}"}]}),
        "model.safetensors": st})

    # 4. Phi-3: fused qkv / gate_up, longrope factors, a pre-tokenizer llama.cpp does not know (hash lookup),
    #    named by --pre-tokenizer
    tok, toks = _bpe_tokenizer({"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                      "use_regex": False}]}, 40)
    cfg = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **small, "vocab_size": len(toks),
           "num_key_value_heads": 2, "max_position_embeddings": 512, "original_max_position_embeddings": 128,
           "partial_rotary_factor": 0.5, "sliding_window": 256, "tie_word_embeddings": False,
           "rope_scaling": {"type": "longrope", "long_factor": [1.0, 2.0], "short_factor": [1.0, 1.5]}}
    seeds["phi3-longrope-f32"] = join("f16", {
        "config.json": _dumps(cfg), "tokenizer.json": _dumps(tok),
        "model.safetensors": _safetensors(_weights(rng, cfg, np.float32, fused=True, lm_head=True)),
        PRE_SLOT: b"default"})
    return seeds


def make_seeds(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in seed_inputs().items():
        p = folder / f"{name}.bin"
        p.write_bytes(data)
        written.append(p)
    return written


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--make-seeds":
        for p in make_seeds(Path(sys.argv[2])):
            print(f"{p} ({p.stat().st_size} bytes)")
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--unpack":
        print(unpack(Path(sys.argv[2]).read_bytes(), Path(sys.argv[3])))
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--minimize":
        small = minimize(Path(sys.argv[2]).read_bytes())
        Path(sys.argv[3]).write_bytes(small)
        print(f"{sys.argv[3]}: {len(small)} bytes, {_failure(small)}")
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
