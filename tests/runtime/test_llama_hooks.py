"""The llama.cpp hooks of patch 0300 (ggml_ext/src/llama) on the real default model through llama-cpp-python:
every weight matmul of the graph passes through ggml_ext_llama_linear, every KV cache asks
ggml_ext_llama_kv_type for its types; with nothing registered, or a pass-through callback, the logits are
the same bits, and what a callback returns is what llama.cpp uses."""
from __future__ import annotations

import ctypes
from collections import Counter

import numpy as np
import pytest

from ggml_ext import _locate
from ggml_ext.llama_cpp_glue import Llama, load_llama_cpp

GGML_TYPE_F16, GGML_TYPE_Q8_0 = 1, 8
LINEAR_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p)
KV_TYPE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_bool, ctypes.c_uint32,
                              ctypes.c_char_p)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def libs():
    """(libllama as llama_cpp loaded it, libggml-base): the hooks' setters and ggml's tensor functions."""
    llama = load_llama_cpp().llama_cpp._lib
    llama.ggml_ext_llama_set_linear_hook.argtypes = [LINEAR_FN, ctypes.c_void_p]
    llama.ggml_ext_llama_set_linear_hook.restype = None
    llama.ggml_ext_llama_set_kv_type_hook.argtypes = [KV_TYPE_FN, ctypes.c_void_p]
    llama.ggml_ext_llama_set_kv_type_hook.restype = None
    base = ctypes.CDLL(str(_locate.library("ggml-base")))
    base.ggml_get_name.argtypes = [ctypes.c_void_p]
    base.ggml_get_name.restype = ctypes.c_char_p
    base.ggml_scale.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float]
    base.ggml_scale.restype = ctypes.c_void_p
    yield llama, base
    llama.ggml_ext_llama_set_linear_hook(LINEAR_FN(), None)
    llama.ggml_ext_llama_set_kv_type_hook(KV_TYPE_FN(), None)


def _logits(model, threads, **kw) -> tuple[np.ndarray, int]:
    """Logits of the prompt and of two greedy steps after it, and the context's state size (KV cache)."""
    llm = Llama(model, n_ctx=256, n_threads=threads, seed=0, logits_all=True, **kw)
    try:
        llm.eval(llm.tokenize(PROMPT.encode()))
        for _ in range(2):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        return np.array(llm.scores[:llm.n_tokens]), int(load_llama_cpp().llama_state_get_size(llm.ctx))
    finally:
        llm.close()


@pytest.fixture(scope="module")
def plain(default_gguf, threads, libs):
    """The logits with no hook registered (the patched build's default path)."""
    return _logits(default_gguf, threads)


def test_linear_hook_sees_every_weight_matmul_and_passes_through_bit_identical(default_gguf, threads, libs, plain):
    llama, base = libs
    calls: Counter[str] = Counter()
    during_decode: Counter[str] = Counter()
    state = {"decoding": False}

    @LINEAR_FN
    def count(user, ctx, w, cur, result):
        name = base.ggml_get_name(w).decode()
        calls[name] += 1
        if state["decoding"]:
            during_decode[name] += 1
        return result

    llama.ggml_ext_llama_set_linear_hook(count, None)
    try:
        llm = Llama(default_gguf, n_ctx=256, n_threads=threads, seed=0, logits_all=True)
        state["decoding"] = True
        llm.eval(llm.tokenize(PROMPT.encode()))
        for _ in range(2):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        got = np.array(llm.scores[:llm.n_tokens])
        n_layer = int(llm.metadata["llama.block_count"])
        llm.close()
    finally:
        llama.ggml_ext_llama_set_linear_hook(LINEAR_FN(), None)

    per_layer = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    expected = {f"blk.{i}.{w}.weight" for i in range(n_layer) for w in per_layer}
    # SmolLM2 ties the output projection to the token embedding: llama.cpp multiplies by token_embd.weight
    expected.add("token_embd.weight" if "output.weight" not in calls else "output.weight")
    assert n_layer == 30
    assert set(calls) == expected, sorted(set(calls) ^ expected)[:10]
    assert set(during_decode) == expected, "the decode graphs pass through the hook too"
    assert len(set(calls.values())) == 1, "each weight once per graph built"
    assert np.array_equal(got, plain[0]), "a pass-through hook changes no bit of the logits"


def test_what_the_linear_hook_returns_is_what_llama_uses(default_gguf, threads, libs, plain):
    llama, base = libs

    @LINEAR_FN
    def double_the_logits(user, ctx, w, cur, result):
        name = base.ggml_get_name(w).decode()
        return base.ggml_scale(ctx, result, 2.0) if name in ("output.weight", "token_embd.weight") else result

    llama.ggml_ext_llama_set_linear_hook(double_the_logits, None)
    try:
        got, _ = _logits(default_gguf, threads)
    finally:
        llama.ggml_ext_llama_set_linear_hook(LINEAR_FN(), None)
    assert np.array_equal(got, 2.0 * plain[0]), "the output projection's replacement (2x, exact in float) was used"


def _kv_hook(libs, answer):
    llama, _ = libs
    seen = []

    @KV_TYPE_FN
    def hook(user, type_, is_v, n_layer, name_tag):
        seen.append((type_, bool(is_v), n_layer, name_tag.decode()))
        return answer(type_, bool(is_v))

    llama.ggml_ext_llama_set_kv_type_hook(hook, None)
    return hook, seen


def test_kv_type_hook_sees_the_requested_types_and_the_default_is_unchanged(default_gguf, threads, libs, plain):
    llama, _ = libs
    hook, seen = _kv_hook(libs, lambda t, is_v: -1)  # keep what was asked for
    try:
        got, size = _logits(default_gguf, threads)
        got_q8, size_q8 = _logits(default_gguf, threads, type_k=GGML_TYPE_Q8_0)
    finally:
        llama.ggml_ext_llama_set_kv_type_hook(KV_TYPE_FN(), None)
    assert seen == [(GGML_TYPE_F16, False, 30, ""), (GGML_TYPE_F16, True, 30, ""),
                    (GGML_TYPE_Q8_0, False, 30, ""), (GGML_TYPE_F16, True, 30, "")]
    assert np.array_equal(got, plain[0]) and size == plain[1]
    assert size_q8 < size, "a Q8_0 K cache is smaller than an F16 one"
    assert not np.array_equal(got_q8, plain[0])


def test_kv_type_hook_chooses_the_cache_type(default_gguf, threads, libs):
    """The hook turning a requested F16 K cache into Q8_0 gives exactly the run that asked for Q8_0."""
    llama, _ = libs
    direct, direct_size = _logits(default_gguf, threads, type_k=GGML_TYPE_Q8_0)
    hook, seen = _kv_hook(libs, lambda t, is_v: GGML_TYPE_Q8_0 if not is_v else -1)
    try:
        swapped, swapped_size = _logits(default_gguf, threads)
    finally:
        llama.ggml_ext_llama_set_kv_type_hook(KV_TYPE_FN(), None)
    assert seen == [(GGML_TYPE_F16, False, 30, ""), (GGML_TYPE_F16, True, 30, "")]
    assert swapped_size == direct_size
    assert np.array_equal(swapped, direct)


def test_file_type_names_of_our_types(libs):
    """Patch 0301's answers: every registered type maps to the file type its files carry (interleaved Q4_0:
    the 2024 values 33-35 in layout order, as the converter's policy writes them; interleaved IQ4_NL: 25),
    and each of those has a name, "(guessed) "-prefixed when llama.cpp guessed it; stock types and unknown
    values are left to llama.cpp (NULL / -1)."""
    from ggml_ext import formats
    from ggml_ext.converters.policy import FILE_TYPES

    llama, _ = libs
    llama.ggml_ext_llama_ftype_name.argtypes = [ctypes.c_int, ctypes.c_bool]
    llama.ggml_ext_llama_ftype_name.restype = ctypes.c_char_p
    llama.ggml_ext_llama_ftype_of_type.argtypes = [ctypes.c_int]
    llama.ggml_ext_llama_ftype_of_type.restype = ctypes.c_int
    for t in formats.ext_types():
        ftype = llama.ggml_ext_llama_ftype_of_type(t.id)
        if t.family == "kvquant":  # KV cache types: no file type
            assert ftype == -1
            continue
        if t.family == "anyprec":  # its own id; the converter writes its --type's file type (default Q8_0)
            assert ftype == t.id
            assert llama.ggml_ext_llama_ftype_name(ftype, False) == f"{t.name} - any-precision bitplanes".encode()
            continue
        assert ftype == FILE_TYPES[t.name.lower()], t.name
        if t.base_name == "Q4_0":
            assert llama.ggml_ext_llama_ftype_name(ftype, False) == t.name.encode()
            assert llama.ggml_ext_llama_ftype_name(ftype, True) == b"(guessed) " + t.name.encode()
        elif t.family == "codebooks":  # its own id as file type: "CB2 - 2.4375 bpw"
            assert ftype == t.id
            bpw = f"{t.type_size * 8 / t.blck_size:g}"
            assert llama.ggml_ext_llama_ftype_name(ftype, False) == f"{t.name} - {bpw} bpw".encode()
            assert llama.ggml_ext_llama_ftype_name(ftype, True) == f"(guessed) {t.name} - {bpw} bpw".encode()
        else:  # MOSTLY_IQ4_NL is llama.cpp's own
            assert llama.ggml_ext_llama_ftype_name(ftype, False) is None
    for stock in (0, 1, 2, 8, 20):  # F32, F16, Q4_0, Q8_0, IQ4_NL
        assert llama.ggml_ext_llama_ftype_of_type(stock) == -1
    for value in (2, 25, 32, 36, 1024, -1):
        assert llama.ggml_ext_llama_ftype_name(value, False) is None
