"""One llama-server, an any-precision model and a NUQ value cache, under mixed load: precisions never leak.

A tiny llama (one KV head of 64 channels) converted with ``--method anyprec`` (3..8 bits) and its KV
calibration; the server runs 16 slots with ``-ctv nuq4 --kv-calib`` and a slot save folder. Each request
(prompt, ``apq_bits``) is first served alone: the reference. Then:

* 16 streams at once, four prompts at each of four precisions (3, 4, 5, 8; requests of different precisions
  never share a batch), while two more streaming requests are cancelled after their first tokens: every
  answer has its reference's text, and log-probabilities nearer its own reference than any other
  precision's; the server serves on;
* a slot is saved (``/slots/0?action=save``), used by another request, restored, and continues the saved
  conversation exactly as it did before it was overwritten, from the restored cache (its prompt is not
  evaluated again).

Throughput and latency under this load are not asserted (no clock in the test; bench/runtime/
bench_server_load.py measures them); 0 failed requests, 0 crashes and equal answers are.
"""
from __future__ import annotations

import http.client
import json
import threading
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import convert_support as cs

PROMPTS = ["The capital of France is", "Once upon a time, there was", "1, 2, 3, 4,", "The quick brown fox"]
BITS = [3, 4, 5, 8]
STREAMS = [(p, b) for p in PROMPTS for b in BITS]  # 16 concurrent requests
N_PREDICT = 12


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from ggml_ext.converters import convert
    from ggml_ext.kvquant import calibrate
    d = tmp_path_factory.mktemp("mixed")
    model = cs.tiny("llama", num_attention_heads=1, num_key_value_heads=1)
    apq = d / "tiny-apq.gguf"
    convert(model, apq, method="anyprec", method_options={"fisher": False, "bits": "3-8"})
    text = d / "text.txt"
    text.write_text(" ".join(f"word{i} and some more text {i % 7}." for i in range(3000)))
    cal = d / "kv.gguf"
    calibrate(model, str(text), n_samples=2, seq_len=32, bits=(4,), progress=False).save(cal, force=True)
    return apq, cal, d


@pytest.fixture(scope="module")
def server(files, threads):
    from ggml_ext import serve
    apq, cal, d = files
    slots = d / "slots"
    slots.mkdir()
    log = open(d / "server.log", "w")
    proc, url = serve.start(apq, port=0, ctx_size=len(STREAMS) * 256, log=log,
                            extra=["-t", str(threads), "-np", str(len(STREAMS)), "--no-webui", "-fa", "on", "-ctv", "nuq4",
                                   "--kv-calib", str(cal), "--slot-save-path", str(slots)])
    try:
        yield proc, url, d / "server.log"
    finally:
        serve.stop(proc)
        log.close()


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _complete(url: str, prompt: str, bits: int, **fields) -> dict:
    return _post(url, "/completion", {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "n_probs": 3,
                                      "seed": 0, "apq_bits": bits, **fields})


def _answer(r: dict) -> tuple[str, list[float]]:
    return r["content"], [p["logprob"] for s in r["completion_probabilities"] for p in [s, *s["top_logprobs"]]]


def _gap(got, want) -> float:
    """The largest log-probability difference of two answers; infinite when their texts differ."""
    if got[0] != want[0] or len(got[1]) != len(want[1]):
        return float("inf")
    return max((abs(a - b) for a, b in zip(got[1], want[1])), default=0.0)


def _same(got, want) -> bool:
    """A request served alone is a batch of one: served alone again, it answers alike."""
    return _gap(got, want) <= 1e-4


# Requests at one precision share a batch when they arrive together, and a batch of several sequences
# takes other matrix-multiply paths than a batch of one (upstream's too): their log-probabilities then
# agree to ~1e-3, not bit for bit. A leaked precision moves them by far more (checked on the references).
BATCHED = 1e-2


def _cancel_after_first_tokens(url: str, prompt: str, bits: int, events: int = 2) -> int:
    """A streaming request whose client goes away after ``events`` server-sent events; returns how many came."""
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    c.request("POST", "/completion", body=json.dumps({"prompt": prompt, "n_predict": 200, "temperature": 0,
                                                      "stream": True, "apq_bits": bits}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    got = 0
    while got < events:
        line = r.fp.readline()
        if not line:
            break
        got += line.startswith(b"data: ")
    c.close()  # mid-stream: the server must drop the slot's task, not crash
    return got


def test_concurrent_precisions_and_a_cancelled_stream(server):
    proc, url, log = server
    want = {(p, b): _answer(_complete(url, p, b)) for p, b in STREAMS}
    want_other = {b: _answer(_complete(url, PROMPTS[0], b)) for b in (3, 8)}
    for p in PROMPTS:  # a leak must be visible: any two precisions' answers lie far apart
        for i, b in enumerate(BITS):
            for c in BITS[i + 1:]:
                assert _gap(want[(p, b)], want[(p, c)]) > 4 * BATCHED, (p, b, c, want[(p, b)], want[(p, c)])

    got, errors = {}, []

    def one(p, b):
        try:
            got[(p, b)] = _answer(_complete(url, p, b))
        except Exception as e:  # noqa: BLE001 - reported below, with the others
            errors.append(f"{p!r} at {b} bits: {e}")

    workers = [threading.Thread(target=one, args=(p, b)) for p, b in STREAMS]
    cancellers = [threading.Thread(target=lambda b=b: _cancel_after_first_tokens(url, PROMPTS[1], b)) for b in (8, 3)]
    for w in [*workers, *cancellers]:
        w.start()
    for w in [*workers, *cancellers]:
        w.join()
    assert not errors, errors
    for (p, b), ans in want.items():
        assert _gap(got[(p, b)], ans) <= BATCHED, ((p, b), got[(p, b)], ans)
    # served on: the same answers again, one after another
    assert proc.poll() is None
    for b in (3, 8):
        assert _same(_answer(_complete(url, PROMPTS[0], b)), want_other[b])


def test_a_restored_slot_continues_exactly(server):
    """Saved at 4 bits, overwritten at 8, restored: the 4-bit conversation continues from the restored cache
    as before, and an 8-bit request does not take the restored 4-bit KV for its own."""
    proc, url, log = server
    p, bits = PROMPTS[2], 4
    first = _complete(url, p, bits, id_slot=0, cache_prompt=True)
    follow = p + first["content"]
    before = _complete(url, follow, bits, id_slot=0, cache_prompt=True)  # continues from slot 0's cache
    assert before["timings"]["cache_n"] > 0, before["timings"]
    alone8 = _answer(_complete(url, follow, 8, id_slot=1, cache_prompt=False))
    saved = _post(url, "/slots/0?action=save", {"filename": "slot0.bin"})
    assert saved.get("n_saved", 0) > 0, saved
    for restore_then_bits in (8, bits):
        _complete(url, PROMPTS[3], 8, id_slot=0, cache_prompt=True)  # slot 0 now holds another conversation at 8
        restored = _post(url, "/slots/0?action=restore", {"filename": "slot0.bin"})
        assert restored.get("n_restored", 0) == saved["n_saved"], restored
        after = _complete(url, follow, restore_then_bits, id_slot=0, cache_prompt=True)
        if restore_then_bits == bits:
            assert _same(_answer(after), _answer(before)), (after["content"], before["content"])
            # from the restored cache: its tokens were not evaluated again
            assert after["timings"]["cache_n"] > 0, after["timings"]
        else:
            # the restored KV is 4-bit: an 8-bit request recomputes it and answers as alone
            assert after["timings"]["cache_n"] == 0, after["timings"]
            assert _same(_answer(after), alone8), (after["content"], alone8[0])
    assert proc.poll() is None
