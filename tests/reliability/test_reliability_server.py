"""Our llama-server under concurrent streaming load, with hostile requests and abandoned streams.

Drives bench/runtime/load_server.py's run_load() against the default model on a free
loopback port with 4 slots: 8 streaming clients x 3 requests, and in the middle
malformed JSON, a prompt longer than a slot's context and wrong field types.
"""
from __future__ import annotations

import http.client
import importlib.util
import json
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ggml_ext import serve

REPO = Path(__file__).resolve().parents[2]
SLOTS, CTX = 4, 2048          # 512 tokens per slot


def _load_script():
    spec = importlib.util.spec_from_file_location("load_server", REPO / "bench" / "runtime" / "load_server.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["load_server"] = mod      # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


load_server = _load_script()


@pytest.fixture(scope="module")
def server(default_gguf, threads, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server-load") / "llama-server.log"
    with open(log_path, "w") as log:
        proc, url = serve.start(default_gguf, port=0, ctx_size=CTX, log=log,
                                extra=["-np", str(SLOTS), "-t", str(threads), "--no-webui"])
        assert urlsplit(url).hostname == "127.0.0.1"
        try:
            yield proc, url, log_path
        finally:
            if proc.poll() is None:
                serve.stop(proc)


def test_concurrent_streams_with_hostile_requests(server):
    proc, url, log_path = server
    rep = load_server.run_load(url, clients=8, requests=3, max_tokens=16, timeout=600, deadline_s=None)
    print("\n" + rep.text())
    assert rep.slots == SLOTS
    assert rep.requests == 24
    assert rep.failures == 0, rep.errors
    assert rep.hostile_sent == 6 and rep.hostile_refused == 6, rep.hostile_unexpected
    assert "exceeds the available context size" in rep.hostile_answers["prompt longer than the context"]
    assert rep.hostile_answers["max_tokens is a string"].startswith("HTTP 400")
    # patch 0931: a body that is not JSON is the client's error (upstream answered 500)
    for name in ("malformed JSON", "not JSON at all"):
        assert rep.hostile_answers[name].startswith("HTTP 400: [json.exception.parse_error"), rep.hostile_answers[name]
    assert rep.busy_slots_after == 0
    assert rep.healthy_after
    assert proc.poll() is None, f"llama-server exited ({proc.returncode}); log {log_path}"


def _busy_slots(url: str) -> int:
    code, slots = load_server.get_json(url, "/slots")
    assert code == 200
    return sum(bool(s.get("is_processing")) for s in slots)


def test_abandoned_streams_free_their_slots(server):
    """Clients that hang up after the first token must not leave slots busy."""
    proc, url, _ = server
    u = urlsplit(url)
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
                       "stream": True, "max_tokens": 400, "temperature": 0.8, "seed": 2}).encode()
    conns = []
    for _ in range(SLOTS):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        for raw in r:                       # read until the first event
            if raw.startswith(b"data: "):
                break
        conns.append(c)
    for c in conns:
        c.sock.close() if c.sock else None
        c.close()
    deadline = time.monotonic() + 30
    busy = _busy_slots(url)
    while busy and time.monotonic() < deadline:
        time.sleep(0.25)
        busy = _busy_slots(url)
    assert busy == 0, "slots still busy 30 s after their clients hung up"
    res = load_server.stream_chat(url, "Say hi.", 8, 60)
    assert res.ok, res.error
    assert proc.poll() is None


def test_stops_cleanly_after_load(server):
    proc, url, _ = server
    rc = serve.stop(proc)
    assert rc in (0, -signal.SIGTERM)
    with pytest.raises(OSError):
        load_server.get_json(url, "/health", timeout=2)
