"""Our llama-server on a free loopback port: health, chat completions, web UI, clean stop."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from ggml_ext import serve


@pytest.fixture(scope="module")
def server(default_gguf, threads, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server") / "llama-server.log"
    with open(log_path, "w") as log:
        proc, url = serve.start(default_gguf, port=0, ctx_size=1024, extra=["-t", str(threads), "-np", "1"], log=log)
        try:
            yield proc, url, log_path
        finally:
            serve.stop(proc)


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def test_health(server):
    _, url, _ = server
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        assert r.status == 200
        assert json.loads(r.read())["status"] == "ok"


def test_chat_completions(server):
    _, url, _ = server
    r = _post(url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        "max_tokens": 24, "temperature": 0, "seed": 0})
    assert "Paris" in r["choices"][0]["message"]["content"]
    assert r["usage"]["completion_tokens"] > 0


def test_web_ui_and_the_endpoints_it_uses(server):
    _, url, _ = server
    with urllib.request.urlopen(url + "/", timeout=10) as r:
        page = r.read()
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    assert b"<html" in page and b"/v1/chat/completions" in page
    with urllib.request.urlopen(url + "/props", timeout=10) as r:
        props = json.loads(r.read())
    assert "default_generation_settings" in props and props["chat_template"]
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        assert json.loads(r.read())["data"]
    # the UI streams its answers as server-sent events
    req = urllib.request.Request(url + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"messages": [{"role": "user", "content": "Hello"}], "stream": True,
                                                  "max_tokens": 8}).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [line for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2


def test_bad_request_is_an_error_not_a_crash(server):
    proc, url, _ = server
    req = urllib.request.Request(url + "/v1/chat/completions", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    # patch 0931: 400 with an OpenAI-style error object (upstream: 500); and it keeps serving
    assert e.value.code == 400
    err = json.loads(e.value.read())["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400 and "parse error" in err["message"]
    assert proc.poll() is None
    test_health(server)


def test_stops_cleanly(default_gguf, threads):
    proc, _ = serve.start(default_gguf, port=0, ctx_size=256, extra=["-t", str(threads)])
    assert serve.stop(proc) in (0, -signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_the_serve_verb_stops_its_server_on(sig, default_gguf, threads, tmp_path):
    # `ggml-ext serve` as systemd, docker stop or a closed terminal end it: a real signal to the Python process
    log = open(tmp_path / "serve.log", "w+")
    cli = subprocess.Popen([sys.executable, "-m", "ggml_ext.cli", "serve", str(default_gguf), "--port", "0",
                            "-c", "256", "--", "-t", str(threads)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
    server_pid = None
    try:
        # the ready line comes once /health answers; the deadline only guards against a hang
        ready = ""
        deadline = time.monotonic() + 180
        while "ready at" not in ready:
            assert time.monotonic() < deadline and cli.poll() is None, open(log.name).read()[-3000:]
            if select.select([cli.stdout], [], [], 1)[0]:
                ready = cli.stdout.readline()
        m = re.search(r"\(pid (\d+)\) ready at http://([\d.]+):(\d+)", ready)
        server_pid, host, port = int(m[1]), m[2], int(m[3])
        assert _alive(server_pid)

        os.kill(cli.pid, sig)
        assert cli.wait(60) == 0, open(log.name).read()[-3000:]
        # stop() has reaped it: no process (nor zombie) of that pid is left
        assert not _alive(server_pid)
        with socket.socket() as s:  # the port is free: a new server could listen on it
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of old connections is no owner
            s.bind((host, port))
            s.listen()
        assert "Traceback" not in open(log.name).read()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        if server_pid and _alive(server_pid):  # a failed test must not leave an orphan behind
            os.kill(server_pid, signal.SIGKILL)
        log.close()
