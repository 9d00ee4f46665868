"""KVQuant cache: dense-and-sparse outliers and the attention sink (issue 20; docs/KVQUANT.md "Outliers and the
sink"; patch 0323).

* Values with outliers (ggml_ext_kvquant_bind_opts, outliers=1): each 64-value block keeps its minimum or maximum
  (whichever leaves the narrower range) in its trailer's slot as fp16; mid / half come from the other 63 values.
  The bytes and the dequantized values equal a numpy twin of that rule on the same table.
* Keys with outliers: per-channel thresholds mid +- half; the two channels of a block with the largest excess go
  to the block's two slots (fp16), the rest clamp to the end levels (numpy twin).
* The sink: rows written at positions < n_sink (ggml_ext_kvquant_rows_written) read back exactly as written (float),
  others as their blocks; the state's side blob (ggml_ext_kvquant_side_get / _set) carries them to other cells.
* llama-perplexity: nuq3 K+V with --kv-outliers 0.01 --kv-sink 1 is closer to f16 than plain nuq3; bad flags and
  a fraction other than the calibration's are refused with a clear message.
* State round trip (llama-cpp-python, whole context and one sequence): a fresh context restored from the saved
  state gives the same logits for the next token as the original; a context without the sink restores the blocks
  only and gives different logits (the sink rows really travel in the state).

The calibration is the shared 1 x 64-token one (convert_support.default_kv_calibration, 1% outliers).
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
IDS = {4: 103, 3: 104, 2: 105}
SIZES = {4: 40, 3: 32, 2: 24}


@pytest.fixture(scope="module")
def calib():
    return cs.default_kv_calibration()


def _base():
    from ggml_ext import _locate, quants
    quants.library()
    lib = ctypes.CDLL(str(_locate.library("ggml-base")), mode=ctypes.RTLD_GLOBAL)
    p, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    lib.ggml_ext_kvquant_bind_opts.restype = ctypes.c_int
    lib.ggml_ext_kvquant_bind_opts.argtypes = [p, sz, ctypes.c_int, i64, p, p, p, p, ctypes.c_int, ctypes.c_int,
                                           ctypes.c_char_p, sz]
    lib.ggml_ext_kvquant_unbind.argtypes = [p]
    lib.ggml_ext_kvquant_rows_written.argtypes = [p, sz, p, p, ctypes.c_uint32]
    lib.ggml_ext_kvquant_side_get.restype = sz
    lib.ggml_ext_kvquant_side_get.argtypes = [p, sz, p, ctypes.c_uint32, p, sz]
    lib.ggml_ext_kvquant_side_set.restype = ctypes.c_int
    lib.ggml_ext_kvquant_side_set.argtypes = [p, sz, p, ctypes.c_uint32, p, sz]
    return lib


def _row_fns(lib, bits):
    name = f"NUQ{bits}"
    to_f, from_f = getattr(lib, f"ggml_ext_to_float_{name}"), getattr(lib, f"ggml_ext_from_float_ref_{name}")
    to_f.argtypes = from_f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return to_f, from_f


def _table(calib, role, bits):
    from ggml_ext.kvquant import KVCalibration
    cal = KVCalibration.load(calib)
    return [np.ascontiguousarray(a, dtype=np.float32) for a in cal.levels(LAYER, role, bits, True)]




def _nearest(levels, xn):
    mids = (levels[:-1] + levels[1:]) / 2
    return np.searchsorted(mids.astype(np.float32), xn.astype(np.float32), side="left")


def _f16(x):
    return np.float32(np.float16(x))


def _u16(x):
    return int(np.array(x, np.float16).view(np.uint16))


def _bind(lib, buf, nbytes, bits, row_values, levels, values, k_mid=None, k_half=None, outliers=1, n_sink=0):
    err = ctypes.create_string_buffer(256)
    rc = lib.ggml_ext_kvquant_bind_opts(buf.ctypes.data, nbytes, IDS[bits], row_values, levels.ctypes.data,
                                    values.ctypes.data, None if k_mid is None else k_mid.ctypes.data,
                                    None if k_half is None else k_half.ctypes.data, outliers, n_sink, err, 256)
    assert rc == 0, err.value


def _round_trip(lib, fns, x, buf, bits, row_values, levels, values, **bind):
    """x quantized into buf (bound to the layer's tables for the call) and read back through the type's rows."""
    to_f, from_f = fns
    _bind(lib, buf, buf.size, bits, row_values, levels, values, **bind)
    try:
        from_f(x.ctypes.data, buf.ctypes.data, x.size)
        y = np.empty_like(x)
        to_f(buf.ctypes.data, y.ctypes.data, x.size)
    finally:
        assert lib.ggml_ext_kvquant_unbind(buf.ctypes.data) == 0
    return y


@pytest.mark.parametrize("bits", [4, 3, 2])
def test_value_blocks_keep_one_outlier(calib, bits):
    lib = _base()
    to_f, from_f = _row_fns(lib, bits)
    levels, values = _table(calib, "v", bits)
    rng = np.random.default_rng(bits)
    n_blk = 6
    x = rng.standard_normal(n_blk * 64).astype(np.float32)
    x[5], x[64 + 17], x[128 + 40] = 25.0, -30.0, 9.0  # planted outliers; the other blocks take their extreme
    size = SIZES[bits]
    buf = np.zeros(n_blk * size, np.uint8)
    y = _round_trip(lib, (to_f, from_f), x, buf, bits, 192, levels, values)
    for b in range(n_blk):
        xb = x[64 * b:64 * b + 64]
        imin, imax = int(np.argmin(xb)), int(np.argmax(xb))
        max2 = np.max(np.delete(xb, imax))
        min2 = np.min(np.delete(xb, imin))
        slot = imax if xb[imax] - max2 >= min2 - xb[imin] else imin
        rest = np.delete(xb, slot)
        lo, hi = np.float32(rest.min()), np.float32(rest.max())
        mid, half = np.float32((hi + lo) / 2), np.float32(max((hi - lo) / 2, 1e-8))
        idx = _nearest(levels, (xb - mid) / half)
        want = np.concatenate([cs.kvq_pack_head_block(idx, bits), np.array([_u16(mid), _u16(half), 0x8000 | slot, _u16(xb[slot])],
                                                           np.uint16).view(np.uint8)])
        assert bytes(buf[size * b:size * (b + 1)]) == bytes(want), b
        deq = values[idx] * _f16(half) + _f16(mid)
        deq[slot] = _f16(xb[slot])
        np.testing.assert_array_equal(y[64 * b:64 * b + 64], deq.astype(np.float32))
    assert y[5] == 25.0 and y[64 + 17] == -30.0 and y[128 + 40] == 9.0


@pytest.mark.parametrize("bits", [3, 2])
def test_key_blocks_keep_two_outliers(calib, bits):
    lib = _base()
    to_f, from_f = _row_fns(lib, bits)
    levels, values = _table(calib, "k", bits)
    D = 128  # two blocks per row, two rows
    rng = np.random.default_rng(7 + bits)
    mid = rng.standard_normal(D).astype(np.float32)
    half = (0.5 + rng.random(D)).astype(np.float32)
    x = (mid + half * rng.uniform(-0.95, 0.95, (2, D))).astype(np.float32)
    # row 0, block 0: three outliers (excess 3, 1, 2 half-ranges): channels 10 and 50 kept, 30 clamped
    x[0, 10] = mid[10] + 4 * half[10]
    x[0, 30] = mid[30] - 2 * half[30]
    x[0, 50] = mid[50] - 3 * half[50]
    x[1, 64 + 3] = mid[64 + 3] + 1.5 * half[64 + 3]  # row 1, block 1: one outlier
    size = SIZES[bits]
    buf = np.zeros(4 * size, np.uint8)
    y = _round_trip(lib, (to_f, from_f), x, buf, bits, D, levels, values, k_mid=mid, k_half=half)
    for r in range(2):
        for b in range(2):
            c = slice(64 * b, 64 * b + 64)
            xn = (x[r, c] - mid[c]) / half[c]
            idx = _nearest(levels, xn)
            ex = np.abs(xn) - 1
            kept = sorted(sorted(np.flatnonzero(ex > 0), key=lambda i: (-ex[i], i))[:2])
            w = [0, 0x3C00, 0, 0]
            for s, ch in enumerate(kept):
                w[2 * s], w[2 * s + 1] = 0x8000 | int(ch), _u16(x[r, 64 * b + ch])
            blk = 2 * r + b
            want = np.concatenate([cs.kvq_pack_head_block(idx, bits), np.array(w, np.uint16).view(np.uint8)])
            assert bytes(buf[size * blk:size * (blk + 1)]) == bytes(want), (r, b)
            deq = values[idx] * half[c] + mid[c]
            for ch in kept:
                deq[ch] = _f16(x[r, 64 * b + ch])
            np.testing.assert_array_equal(y[r, c], deq.astype(np.float32))
    assert y[0, 10] == _f16(x[0, 10]) and y[0, 50] == _f16(x[0, 50])
    assert y[0, 30] == pytest.approx(values[0] * half[30] + mid[30])  # the third clamped to the end level


def test_sink_rows_and_state_blob(calib):
    lib = _base()
    bits = 3
    to_f, from_f = _row_fns(lib, bits)
    levels, values = _table(calib, "v", bits)
    D, rows, size = 128, 6, SIZES[bits]
    row_bytes = 2 * size
    buf = np.zeros(rows * row_bytes, np.uint8)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows, D)).astype(np.float32)
    _bind(lib, buf, buf.size, bits, D, levels, values, n_sink=1)
    try:
        cells = np.array([0, 1, 2, 3, 4, 5], np.uint32)
        pos = np.array([7, 0, 8, 9, 0, 10], np.int32)  # rows 1 and 4 hold position 0 (two sequences)
        lib.ggml_ext_kvquant_rows_written(buf.ctypes.data, row_bytes, cells.ctypes.data, pos.ctypes.data, rows)
        from_f(x.ctypes.data, buf.ctypes.data, x.size)
        y = np.empty_like(x)
        to_f(buf.ctypes.data, y.ctypes.data, x.size)
        np.testing.assert_array_equal(y[[1, 4]], x[[1, 4]])  # the sink rows: exact
        assert not any(np.array_equal(y[i], x[i]) for i in (0, 2, 3, 5))  # the others: quantized
        # the state blob of cells (4, 2): one sink row, ordinal 0
        sel = np.array([4, 2], np.uint32)
        n = lib.ggml_ext_kvquant_side_get(buf.ctypes.data, row_bytes, sel.ctypes.data, 2, None, 0)
        assert n == 8 + 4 + 4 * D
        blob = np.zeros(n, np.uint8)
        assert lib.ggml_ext_kvquant_side_get(buf.ctypes.data, row_bytes, sel.ctypes.data, 2, blob.ctypes.data, n) == n
        # restored into cells (3, 5) (a state read into other cells): 3 becomes a sink row, 5 does not
        buf[3 * row_bytes:4 * row_bytes] = buf[4 * row_bytes:5 * row_bytes]
        dst = np.array([3, 5], np.uint32)
        assert lib.ggml_ext_kvquant_side_set(buf.ctypes.data, row_bytes, dst.ctypes.data, 2, blob.ctypes.data, n) == 0
        to_f(buf.ctypes.data, y.ctypes.data, x.size)
        np.testing.assert_array_equal(y[3], x[4])
        assert not np.array_equal(y[5], x[5])
        # a row rewritten at another position stops being a sink
        one, p5 = np.array([1], np.uint32), np.array([5], np.int32)
        lib.ggml_ext_kvquant_rows_written(buf.ctypes.data, row_bytes, one.ctypes.data, p5.ctypes.data, 1)
        to_f(buf.ctypes.data, y.ctypes.data, x.size)
        assert not np.array_equal(y[1], x[1])
        # malformed blobs are refused
        assert lib.ggml_ext_kvquant_side_set(buf.ctypes.data, row_bytes, dst.ctypes.data, 2, blob.ctypes.data, n - 1) == -1
        bad = blob.copy()
        bad[8:12] = np.frombuffer(np.uint32(7).tobytes(), np.uint8)  # ordinal 7 of 2 cells
        assert lib.ggml_ext_kvquant_side_set(buf.ctypes.data, row_bytes, dst.ctypes.data, 2, bad.ctypes.data, n) == -1
    finally:
        assert lib.ggml_ext_kvquant_unbind(buf.ctypes.data) == 0


def _ppl(model, text, threads, *extra, env=None):
    return tools.perplexity(model, text, n_ctx=CTX, chunks=CHUNKS, threads=threads, env=env,
                            extra=["-fa", "on", *extra]).ppl


def test_perplexity_outliers_and_sink(default_gguf, wiki_test, threads, calib):
    kv = ["-ctk", "nuq3", "-ctv", "nuq3", "--kv-calib", str(calib)]
    f16 = _ppl(default_gguf, wiki_test, threads, "-ctk", "f16", "-ctv", "f16")
    # the value tables of this measurement (fitted per token): the 64-value block tables, the default since,
    # make plain nuq3 values much better at this size and are tested in test_kvquant_rotation.py
    tok = {"GGML_EXT_KV_VTABLE": "token"}
    plain = _ppl(default_gguf, wiki_test, threads, *kv, env=tok)
    both = _ppl(default_gguf, wiki_test, threads, *kv, "--kv-outliers", "0.01", "--kv-sink", "1", env=tok)
    # the environment instead of the flags gives the same run
    env = _ppl(default_gguf, wiki_test, threads, *kv,
               env={"GGML_EXT_KV_OUTLIERS": "0.01", "GGML_EXT_KV_SINK": "1", **tok})
    # 3-bit K+V without outliers and sink is far off f16 on this model (+22.9% at ctx 2048, 4 x 512 calibration);
    # with them +7.8% (docs/RESULTS.md "KVQuant");
    # this test's 1 x 64 calibration at ctx 256 meets the bound below (passed on this machine)
    assert abs(both - f16) < 0.5 * abs(plain - f16), (f16, plain, both)
    assert env == both


def _refused(default_gguf, wiki_test, threads, *extra, env=None):
    return cs.tool_refused(lambda: _ppl(default_gguf, wiki_test, threads, *extra, env=env))


def test_refusals(default_gguf, wiki_test, threads, calib):
    kv = ["-ctv", "nuq3", "--kv-calib", str(calib)]
    msg = _refused(default_gguf, wiki_test, threads, *kv, "--kv-outliers", "0.05")
    assert "fitted at outlier fraction 0.01" in msg
    assert "--kv-outliers" in _refused(default_gguf, wiki_test, threads, *kv, "--kv-outliers", "x")
    assert "--kv-sink" in _refused(default_gguf, wiki_test, threads, *kv, "--kv-sink", "17")
    msg = _refused(default_gguf, wiki_test, threads, *kv, env={"GGML_EXT_KV_SINK": "-1"})
    assert "GGML_EXT_KV_SINK" in msg


def test_state_round_trip(default_gguf, threads, calib, monkeypatch):
    """Save after a prompt, restore into fresh contexts (whole state; one sequence), evaluate the next token:
    the logits equal the original's; a context without the sink restores the blocks alone and differs."""
    pytest.importorskip("llama_cpp")
    import llama_cpp
    from ggml_ext.llama_cpp_glue import Llama
    monkeypatch.setenv("GGML_EXT_KV_CALIB", str(calib))
    monkeypatch.setenv("GGML_EXT_KV_OUTLIERS", "0.01")
    monkeypatch.setenv("GGML_EXT_KV_SINK", "1")
    kw = dict(n_ctx=256, n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False, seed=0,
              type_k=104, type_v=104)
    a = Llama(default_gguf, **kw)
    toks = a.tokenize(b"The first token of a sequence is where attention sinks: a quantized cache keeps it exact.")
    a.eval(toks)
    state = a.save_state()
    ctx_a = a._ctx.ctx
    n_seq = llama_cpp.llama_state_seq_get_size(ctx_a, 0)
    seq_buf = (ctypes.c_uint8 * n_seq)()
    assert llama_cpp.llama_state_seq_get_data(ctx_a, seq_buf, n_seq, 0) == n_seq
    nxt = 1234

    def last_logits(llm):
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()

    a.eval([nxt])
    want = last_logits(a)
    assert np.all(np.isfinite(want)) and np.ptp(want) > 1

    b = Llama(default_gguf, **kw)
    b.load_state(state)
    b.eval([nxt])
    np.testing.assert_array_equal(last_logits(b), want)
    del b

    c = Llama(default_gguf, **kw)
    assert llama_cpp.llama_state_seq_set_data(c._ctx.ctx, seq_buf, n_seq, 0) == n_seq
    c.n_tokens = len(toks)
    c.input_ids[:len(toks)] = toks
    c.eval([nxt])
    np.testing.assert_array_equal(last_logits(c), want)
    del c

    monkeypatch.setenv("GGML_EXT_KV_SINK", "0")
    d = Llama(default_gguf, **kw)
    d.load_state(state)
    d.eval([nxt])
    assert not np.array_equal(last_logits(d), want)
    del d, a
