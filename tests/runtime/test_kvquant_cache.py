"""KVQuant cache types inside llama.cpp (issue 20, first slice: values; docs/KVQUANT.md "In llama.cpp's cache").

* The ggml types NUQ4/3/2 are the kvquant value rows of 64 channels: ggml's from_float on memory bound to
  a layer's calibrated table (ggml_ext_kvq_bind) writes exactly the bytes of the kvquant row kernel
  (ggml_ext.methods.kvquant.kernels, one head of 64 channels, the same table); unbound memory uses uniform
  levels; to_float reads them back as the kernel's dequantization does.
* llama-perplexity on the default model with ``-ctv nuq4 --kv-calib FILE`` (flash attention, f16 keys) is
  within a stated tolerance of the f16 V cache, and nuq2 (its calibration from GGML_EXT_KV_CALIB instead
  of the flag) is further away.
* Bad input is refused with a clear message and an ordinary exit: no calibration, a file that is not a KV
  calibration, a file that does not exist, KVQuant keys (not done yet).

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


def _ppl(model, text, threads, *extra, env=None):
    return tools.perplexity(model, text, n_ctx=CTX, chunks=CHUNKS, threads=threads, env=env,
                            extra=["-fa", "on", *extra]).ppl


def _base():
    from ggml_ext import _locate, quants
    quants.library()
    return ctypes.CDLL(str(_locate.library("ggml-base")), mode=ctypes.RTLD_GLOBAL)


@pytest.mark.parametrize("bits", [4, 3, 2])
def test_type_bytes_are_the_kvquant_value_rows(calib, bits):
    from ggml_ext.methods.kvquant import KVCalibration
    from ggml_ext.methods.kvquant.kernels import KVCacheLayer
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
    lib.ggml_ext_kvq_bind.restype = ctypes.c_int
    lib.ggml_ext_kvq_bind.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.ggml_ext_kvq_unbind.argtypes = [ctypes.c_void_p]

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
    assert lib.ggml_ext_kvq_bind(buf.ctypes.data, 4 * size, tid, levels.ctypes.data, values.ctypes.data, err,
                                 256) == 0, err.value
    try:
        from_f(x.ctypes.data, buf.ctypes.data, x.size)
        want, want_x = kernel_rows(levels, values, x)
        assert bytes(buf[:4 * size]) == bytes(want)
        y = np.empty_like(x)
        to_f(buf.ctypes.data, y.ctypes.data, x.size)
        np.testing.assert_array_equal(y, want_x)
    finally:
        assert lib.ggml_ext_kvq_unbind(buf.ctypes.data) == 0
    # unbound now: uniform levels, a different rounding of the same values
    uni = np.linspace(-1, 1, 2 ** bits).astype(np.float32)
    from_f(x.ctypes.data, buf.ctypes.data, x.size)
    want_u, _ = kernel_rows(uni, uni, x)
    assert bytes(buf[:4 * size]) == bytes(want_u) and bytes(want_u) != bytes(want)
    # a table that is not ascending is refused
    bad = levels[::-1].copy()
    assert lib.ggml_ext_kvq_bind(buf.ctypes.data, 4 * size, tid, bad.ctypes.data, values.ctypes.data, err, 256) == -1
    assert b"ascending" in err.value


def test_nuq_value_cache_perplexity(default_gguf, wiki_test, threads, calib):
    f16 = _ppl(default_gguf, wiki_test, threads, "-ctv", "f16")
    nuq4 = _ppl(default_gguf, wiki_test, threads, "-ctv", "nuq4", "--kv-calib", str(calib))
    # the calibration from the environment instead of the flag
    nuq2 = _ppl(default_gguf, wiki_test, threads, "-ctv", "nuq2", env={"GGML_EXT_KV_CALIB": str(calib)})
    # Tolerance: 4-bit values with per-64-channel scales and a calibrated table move the perplexity by
    # well under 2% on this 135M model (measured: docs/KVQUANT.md); a V cache that is read wrongly
    # (wrong table, block, layer) moves it by far more. The quantized cache really ran: nuq4 differs from
    # f16, and nuq2 is further away than nuq4.
    assert abs(nuq4 - f16) <= 0.02 * f16, (nuq4, f16)
    assert nuq4 != f16
    assert abs(nuq2 - f16) > abs(nuq4 - f16), (nuq2, nuq4, f16)


def _refused(default_gguf, wiki_test, threads, *extra, env=None):
    with pytest.raises(RuntimeError) as e:
        _ppl(default_gguf, wiki_test, threads, *extra, env=env)
    msg = str(e.value)
    code = int(msg.split("exit ", 1)[1].split(")", 1)[0])
    assert 0 < code < 128, msg  # an error exit, not a signal (no abort, no crash)
    return msg


def test_refusals_are_clear(default_gguf, wiki_test, threads, calib, tmp_path):
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq4", env={"GGML_EXT_KV_CALIB": ""})
    assert "needs a KV calibration" in msg and "ggml-ext calibrate kv" in msg
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq3", "--kv-calib", str(default_gguf))
    assert "not a KVQuant calibration" in msg
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq4", "--kv-calib", str(tmp_path / "none.gguf"))
    assert "cannot be read" in msg
    msg = _refused(default_gguf, wiki_test, threads, "-ctk", "nuq4", "--kv-calib", str(calib))
    assert "keys are not implemented yet" in msg
    msg = _refused(default_gguf, wiki_test, threads, "-ctv", "nuq5")
    assert "nuq5" in msg
