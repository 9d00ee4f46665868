"""KVQuant cache types inside llama.cpp (issue 20: values, then pre-RoPE keys; docs/KVQUANT.md "In llama.cpp's cache").

* The ggml types NUQ4/3/2 are the kvquant value rows of 64 channels: ggml's from_float on memory bound to
  a layer's calibrated table (ggml_ext_kvquant_bind) writes exactly the bytes of the kvquant row kernel
  (ggml_ext.kvquant.kernels, one head of 64 channels, the same table); unbound memory uses uniform
  levels; to_float reads them back as the kernel's dequantization does.
* llama-perplexity on the default model with ``-ctv nuq4 --kv-calib FILE`` (flash attention, f16 keys) is
  within a stated tolerance of the f16 V cache, and nuq2 (its calibration from GGML_EXT_KV_CALIB instead
  of the flag) is further away.
* Keys (patch 0322): memory bound with ggml_ext_kvquant_bind_keys rounds each channel with its own calibrated
  mid / half (the channel of a block follows from its place in the cache row) to the table's nearest
  level; llama-perplexity with ``-ctk nuq4`` (stored before RoPE, roped at attention at the cells'
  positions) is within a tolerance of the f16 cache that a key read with a wrong rotation or channel
  order would not meet, and nuq2 keys are further away.
* Bad input is refused with a clear message and an ordinary exit: no calibration (for V and for K), a
  file that is not a KV calibration, a file that does not exist.

The calibration is the shared 1 x 64-token one (convert_support.default_kv_calibration, cached).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import convert_support as cs  # noqa: E402
from ggml_ext import tools  # noqa: E402

CTX, CHUNKS = 256, 2
LAYER = 3


@pytest.fixture(scope="module")
def calib():
    return cs.default_kv_calibration()


def _ppl(model, text, threads, *extra, env=None, chunks=CHUNKS):
    return tools.perplexity(model, text, n_ctx=CTX, chunks=chunks, threads=threads, env=env,
                            extra=["-fa", "on", *extra]).ppl


def _base():
    from ggml_ext import _locate, quants
    quants.library()
    return ctypes.CDLL(str(_locate.library("ggml-base")), mode=ctypes.RTLD_GLOBAL)


@pytest.mark.parametrize("bits", [4, 3, 2])
def test_type_bytes_are_the_kvquant_value_rows(calib, bits):
    from ggml_ext.kvquant import KVCalibration
    from ggml_ext.kvquant.kernels import KVCacheLayer
    lib = _base()
    name = f"NUQ{bits}"
    tid = {4: 103, 3: 104, 2: 105}[bits]
    size = {4: 40, 3: 32, 2: 24}[bits]
    lib.ggml_type_name.restype, lib.ggml_type_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    lib.ggml_ext_kv_cache_type_by_name.restype, lib.ggml_ext_kv_cache_type_by_name.argtypes = ctypes.c_int, [ctypes.c_char_p]
    assert lib.ggml_type_name(tid) == name.lower().encode()
    assert lib.ggml_ext_kv_cache_type_by_name(name.lower().encode()) == tid
    assert lib.ggml_ext_kv_cache_type_by_name(b"q4_0") == -1
    to_f, from_f = getattr(lib, f"ggml_ext_to_float_{name}"), getattr(lib, f"ggml_ext_from_float_ref_{name}")
    to_f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    from_f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.ggml_ext_kvquant_bind.restype = ctypes.c_int
    lib.ggml_ext_kvquant_bind.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.ggml_ext_kvquant_unbind.argtypes = [ctypes.c_void_p]

    cal = KVCalibration.load(calib)
    levels, values = (np.ascontiguousarray(a, dtype=np.float32) for a in cal.levels(LAYER, "v", bits, False))
    ones = np.ones(64, np.float32)

    def kernel_rows(lv, vv, x):
        L = KVCacheLayer(bits=bits, n_kv_heads=1, head_dim=64, k_lo=-ones, k_hi=ones, k_levels=lv, k_values=vv,
                         v_levels=lv, v_values=vv)
        rows = L.quantize_v(x.reshape(-1, 64))
        return rows.reshape(-1), L.dequantize_v(rows).reshape(-1)

    rng = np.random.default_rng(bits)
    x = (rng.standard_normal(4 * 64) * np.linspace(0.1, 3, 4 * 64)).astype(np.float32)
    buf = np.zeros(4 * size + 7, np.uint8)  # a cache of 4 blocks; the tail stays outside the binding
    err = ctypes.create_string_buffer(256)
    assert lib.ggml_ext_kvquant_bind(buf.ctypes.data, 4 * size, tid, levels.ctypes.data, values.ctypes.data, err,
                                 256) == 0, err.value
    try:
        from_f(x.ctypes.data, buf.ctypes.data, x.size)
        want, want_x = kernel_rows(levels, values, x)
        assert bytes(buf[:4 * size]) == bytes(want)
        y = np.empty_like(x)
        to_f(buf.ctypes.data, y.ctypes.data, x.size)
        np.testing.assert_array_equal(y, want_x)
    finally:
        assert lib.ggml_ext_kvquant_unbind(buf.ctypes.data) == 0
    # unbound now: uniform levels, a different rounding of the same values
    uni = np.linspace(-1, 1, 2 ** bits).astype(np.float32)
    from_f(x.ctypes.data, buf.ctypes.data, x.size)
    want_u, _ = kernel_rows(uni, uni, x)
    assert bytes(buf[:4 * size]) == bytes(want_u) and bytes(want_u) != bytes(want)
    # a table that is not ascending is refused
    bad = levels[::-1].copy()
    assert lib.ggml_ext_kvquant_bind(buf.ctypes.data, 4 * size, tid, bad.ctypes.data, values.ctypes.data, err, 256) == -1
    assert b"ascending" in err.value


@pytest.fixture(scope="module")
def f16_ppl(default_gguf, wiki_test, threads):
    return _ppl(default_gguf, wiki_test, threads, "-ctk", "f16", "-ctv", "f16")


# The value-cache comparison scores 8 windows, not 2: over 2 x 128 scored tokens the perplexity's own standard
# error is about 17 %, and how far nuq4 lands from f16 there moves with the 64-token calibration, which torch
# computes a little differently on different CPUs (3.5 % on one, under 2 % on another); over 8 windows it
# settles (1.1 % on the machine where 2 windows gave 3.5 %).
VALUE_CHUNKS = 8


def test_nuq_value_cache_perplexity(default_gguf, wiki_test, threads, calib):
    def ppl(*extra, env=None):
        return _ppl(default_gguf, wiki_test, threads, *extra, env=env, chunks=VALUE_CHUNKS)
    f16 = ppl("-ctk", "f16", "-ctv", "f16")
    nuq4 = ppl("-ctv", "nuq4", "--kv-calib", str(calib))
    # the calibration from the environment instead of the flag
    nuq2 = ppl("-ctv", "nuq2", env={"GGML_EXT_KV_CALIB": str(calib)})
    # Tolerance: 4-bit values with per-64-channel scales and a calibrated table move the perplexity by
    # well under 2% on this 135M model (measured: docs/KVQUANT.md); a V cache that is read wrongly
    # (wrong table, block, layer) moves it by far more. The quantized cache really ran: nuq4 differs from
    # f16, and nuq2 is further away than nuq4.
    assert abs(nuq4 - f16) <= 0.02 * f16, (nuq4, f16)
    assert nuq4 != f16
    assert abs(nuq2 - f16) > abs(nuq4 - f16), (nuq2, nuq4, f16)


@pytest.mark.parametrize("bits", [4, 2])
def test_key_rows_round_per_channel(calib, bits):
    """ggml_ext_kvquant_bind_keys: 3 cache rows of 128 channels (2 blocks each); channel c of every row is
    normalised with mid[c] / half[c], rounded to the nearest level and read back as values * half + mid."""
    from ggml_ext.kvquant import KVCalibration
    lib = _base()
    name, tid, size = f"NUQ{bits}", {4: 103, 2: 105}[bits], {4: 40, 2: 24}[bits]
    to_f, from_f = getattr(lib, f"ggml_ext_to_float_{name}"), getattr(lib, f"ggml_ext_from_float_ref_{name}")
    to_f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    from_f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.ggml_ext_kvquant_bind_keys.restype = ctypes.c_int
    lib.ggml_ext_kvquant_bind_keys.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64] + \
        [ctypes.c_void_p] * 4 + [ctypes.c_char_p, ctypes.c_size_t]
    lib.ggml_ext_kvquant_unbind.argtypes = [ctypes.c_void_p]
    levels, values = (np.ascontiguousarray(a, dtype=np.float32)
                      for a in KVCalibration.load(calib).levels(LAYER, "k", bits, False))
    D, rows = 128, 3
    rng = np.random.default_rng(bits)
    mid = rng.standard_normal(D).astype(np.float32)
    half = rng.uniform(0.5, 4, D).astype(np.float32)
    x = (mid + half * rng.uniform(-1.3, 1.3, (rows, D))).astype(np.float32)  # some beyond the range: end levels
    buf = np.zeros(rows * D // 64 * size, np.uint8)
    err = ctypes.create_string_buffer(256)
    assert lib.ggml_ext_kvquant_bind_keys(buf.ctypes.data, buf.size, tid, D, levels.ctypes.data, values.ctypes.data,
                                      mid.ctypes.data, half.ctypes.data, err, 256) == 0, err.value
    try:
        # written one block at a time, as set_rows / the CPU copy do, and read back the same way
        for b in range(rows * D // 64):
            from_f(x.reshape(-1)[b * 64:].ctypes.data, buf[b * size:].ctypes.data, 64)
        y = np.empty(rows * D, np.float32)
        for b in range(rows * D // 64):
            to_f(buf[b * size:].ctypes.data, y[b * 64:].ctypes.data, 64)
    finally:
        assert lib.ggml_ext_kvquant_unbind(buf.ctypes.data) == 0
    xn = (x - mid) / half
    idx = np.abs(xn[..., None] - levels).argmin(-1)  # nearest level (ties aside: random data has none)
    np.testing.assert_allclose(y.reshape(rows, D), values[idx] * half + mid, rtol=1e-6, atol=1e-6)
    # the blocks keep the value blocks' trailer: fp16 mid 0, half 1, no outliers
    trailer = buf.reshape(-1, size)[:, size - 8:].view(np.uint16)
    assert (trailer == np.array([0, 0x3C00, 0, 0], np.uint16)).all()
    # a channel without a range is refused
    half[5] = 0
    assert lib.ggml_ext_kvquant_bind_keys(buf.ctypes.data, buf.size, tid, D, levels.ctypes.data, values.ctypes.data,
                                      mid.ctypes.data, half.ctypes.data, err, 256) == -1
    assert b"channel 5" in err.value


def test_nuq_key_cache_perplexity(default_gguf, wiki_test, threads, calib, f16_ppl):
    f16 = f16_ppl
    k4 = _ppl(default_gguf, wiki_test, threads, "-ctk", "nuq4", "-ctv", "f16", "--kv-calib", str(calib))
    k2 = _ppl(default_gguf, wiki_test, threads, "-ctk", "nuq2", "-ctv", "f16", "--kv-calib", str(calib))
    # Tolerance: with this tiny calibration (1 x 64 tokens: narrow per-channel ranges) nuq4 keys cost +8%
    # here (18.25 -> 19.72; the torch simulation with the same calibration: +5.6% for nuq4 K and V), while
    # keys read back without RoPE give 2294 and with the calibrated ranges in the wrong channel order 138
    # (docs/KVQUANT.md, measured with a one-off build): 15% holds the working path with room and catches
    # both. The cache really ran: nuq4 differs from f16, and nuq2 is further away.
    assert abs(k4 - f16) <= 0.15 * f16, (k4, f16)
    assert k4 != f16
    assert abs(k2 - f16) > abs(k4 - f16), (k2, k4, f16)


def _refused(default_gguf, wiki_test, threads, *extra, env=None):
    return cs.tool_refused(lambda: _ppl(default_gguf, wiki_test, threads, *extra, env=env))


def test_refusals_are_clear(default_gguf, wiki_test, threads, calib, tmp_path):
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq4", env={"GGML_EXT_KV_CALIB": ""})
    assert "needs a KV calibration" in msg and "ggml-ext calibrate kv" in msg
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq3", "--kv-calib", str(default_gguf))
    assert "not a KVQuant calibration" in msg
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq4", "--kv-calib", str(tmp_path / "none.gguf"))
    assert "cannot be read" in msg
    msg = _refused(default_gguf, wiki_test, threads, "-ctk", "nuq4", env={"GGML_EXT_KV_CALIB": ""})
    assert "nuq4 K cache needs a KV calibration" in msg and "--kv-calib" in msg
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq5")
    assert "nuq5" in msg


@pytest.mark.parametrize("mode, want", [
    ("layer", ("RPC device", "--no-kv-offload")),
    ("tensor", ("cut across devices", "--split-mode layer")),
])
def test_a_nuq_cache_on_an_rpc_device_or_split_by_tensor_is_refused(default_gguf, wiki_test, threads, calib,
                                                                     two_rpc_servers, mode, want):
    """The cache's binding lives in this process; an rpc-server computes with its own, where the cache is bound to
    nothing (uniform levels: +5.8 % perplexity over two RPC devices before the refusal); split mode "tensor" cuts the
    cache over several devices' buffers, and a binding holds one address. Both refused, with the ways out. Each
    mode on servers of its own (a server that served a client before can answer the next one wrongly)."""
    rpc = ",".join(f"127.0.0.1:{p}" for p in two_rpc_servers)
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq4", "--kv-calib", str(calib), "--rpc", rpc,
                   "-ngl", "99", "-sm", mode)
    assert all(w in msg for w in want), msg


def test_llama_cpp_python_type_k_type_v(default_gguf, threads, calib, monkeypatch):
    """llama-cpp-python's type_k / type_v reach our types (ids 103-105 through llama_context_params), the
    calibration through GGML_EXT_KV_CALIB; without one, context creation fails (an exception, no crash)."""
    pytest.importorskip("llama_cpp")
    from ggml_ext.llama_cpp_glue import Llama
    monkeypatch.setenv("GGML_EXT_KV_CALIB", str(calib))
    kw = dict(n_ctx=256, n_threads=threads, flash_attn=True, verbose=False, seed=0)
    llm = Llama(default_gguf, type_k=103, type_v=103, **kw)
    out = llm("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
    del llm
    assert "Paris" in out, out
    monkeypatch.setenv("GGML_EXT_KV_CALIB", "")
    with pytest.raises(ValueError):
        Llama(default_gguf, type_k=104, type_v=104, **kw)
