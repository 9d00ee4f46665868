#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Reliability": llama-server under load with hostile requests.
"""Load test for our llama-server: concurrent streaming chat clients plus malformed requests.

    python bench/runtime/load_server.py                        # default model, 8 clients x 3 requests, 4 slots
    python bench/runtime/load_server.py --clients 16 --requests 5 --slots 4 --json
    python bench/runtime/load_server.py --url http://127.0.0.1:8080   # a server that is already running

Each client thread sends its requests one after another as streaming
`/v1/chat/completions` calls and reads the server-sent events to the final
`data: [DONE]`.  While they run, a further thread sends hostile requests
(malformed JSON, a prompt longer than a slot's context, wrong field types);
those must get an HTTP error with an error object, and must not disturb the
others.  Afterwards `/slots` must show every slot idle and `/health` ok.

Prints requests, concurrency, failures, and p50/p99 of time to first token and
of total request time.  Exit status 0 only when every normal request
succeeded, every hostile one was refused and no slot is left busy.
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

PROMPTS = [
    "What is the capital of France?",
    "Name three colours.",
    "Write one sentence about the sea.",
    "What is two plus two?",
    "Say hello in Spanish.",
    "Give me a word that rhymes with cat.",
]


@dataclass
class Result:
    ok: bool
    ttft: float | None = None      # seconds to the first content token
    total: float = 0.0
    n_chunks: int = 0
    error: str = ""


@dataclass
class Report:
    clients: int
    requests_per_client: int
    slots: int | None
    requests: int = 0
    failures: int = 0
    hostile_sent: int = 0
    hostile_refused: int = 0
    hostile_unexpected: list[str] = field(default_factory=list)
    hostile_answers: dict[str, str] = field(default_factory=dict)   # name -> "HTTP code: message"
    busy_slots_after: int | None = None
    healthy_after: bool = False
    wall_s: float = 0.0
    ttft_p50_ms: float = 0.0
    ttft_p99_ms: float = 0.0
    total_p50_ms: float = 0.0
    total_p99_ms: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (self.failures == 0 and self.hostile_refused == self.hostile_sent and self.busy_slots_after == 0
                and self.healthy_after)

    def text(self) -> str:
        lines = [
            f"requests: {self.requests} streaming ({self.clients} clients x {self.requests_per_client}), "
            f"server slots: {self.slots if self.slots is not None else '?'}, wall {self.wall_s:.1f} s",
            f"failures: {self.failures}",
            f"hostile requests: {self.hostile_sent} sent, {self.hostile_refused} refused with an error"
            + (f"; unexpected: {self.hostile_unexpected}" if self.hostile_unexpected else ""),
            f"first token: p50 {self.ttft_p50_ms:.0f} ms, p99 {self.ttft_p99_ms:.0f} ms",
            f"total:       p50 {self.total_p50_ms:.0f} ms, p99 {self.total_p99_ms:.0f} ms",
            f"after: busy slots {self.busy_slots_after}, /health {'ok' if self.healthy_after else 'NOT ok'}",
        ]
        lines += [f"  {k}: {v}" for k, v in self.hostile_answers.items()]
        lines += [f"error: {e}" for e in self.errors[:10]]
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return 0.0
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(q / 100 * len(v) + 0.5)) - 1))
    return v[k]


def _conn(url: str, timeout: float) -> http.client.HTTPConnection:
    u = urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def get_json(url: str, path: str, timeout: float = 10.0) -> tuple[int, object]:
    c = _conn(url, timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        return r.status, json.loads(body) if body else None
    finally:
        c.close()


def post_raw(url: str, path: str, body: bytes, timeout: float = 60.0) -> tuple[int, bytes]:
    c = _conn(url, timeout)
    try:
        c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def stream_chat(url: str, prompt: str, max_tokens: int, timeout: float) -> Result:
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "stream": True,
                       "max_tokens": max_tokens, "temperature": 0.7, "seed": 1}).encode()
    t0 = time.perf_counter()
    c = _conn(url, timeout)
    try:
        c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return Result(False, total=time.perf_counter() - t0, error=f"HTTP {r.status}: {r.read()[:200]!r}")
        ttft, chunks, done = None, 0, False
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                return Result(False, total=time.perf_counter() - t0, error=f"error event: {ev['error']}")
            for ch in ev.get("choices", []):
                if ch.get("delta", {}).get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
        total = time.perf_counter() - t0
        if not done:
            return Result(False, ttft, total, chunks, "stream ended without data: [DONE]")
        if chunks == 0:
            return Result(False, ttft, total, chunks, "no content tokens")
        return Result(True, ttft, total, chunks)
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Result(False, total=time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")
    finally:
        c.close()


def hostile_requests(long_prompt_words: int) -> list[tuple[str, bytes]]:
    long_prompt = " ".join(["word"] * long_prompt_words)
    return [
        ("malformed JSON", b'{"messages": [{"role": "user", "content": "hi"}'),
        ("not JSON at all", b"\x00\xff garbage"),
        ("prompt longer than the context", json.dumps(
            {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 4}).encode()),
        ("max_tokens is a string", json.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}).encode()),
        ("messages is a number", json.dumps({"messages": 5}).encode()),
        ("content is an object", json.dumps({"messages": [{"role": "user", "content": {"x": 1}}]}).encode()),
    ]


def run_load(url: str, clients: int = 8, requests: int = 3, max_tokens: int = 16, timeout: float = 120.0,
             long_prompt_words: int = 3000, deadline_s: float | None = 300.0) -> Report:
    """Run the load against a running server at `url`; returns the report (see Report.passed).
    `deadline_s`: no new request after this long (None: every request is sent; `timeout` per
    request still guards against a hung server)."""
    status, props = get_json(url, "/props")
    slots = props.get("total_slots") if status == 200 and isinstance(props, dict) else None
    rep = Report(clients, requests, slots)
    results: list[Result] = []
    lock = threading.Lock()
    started = threading.Barrier(clients + 1)
    stop_at = time.monotonic() + deadline_s if deadline_s is not None else float("inf")

    def client(i: int) -> None:
        started.wait()
        for j in range(requests):
            if time.monotonic() > stop_at:
                res = Result(False, error="deadline passed before the request was sent")
            else:
                res = stream_chat(url, PROMPTS[(i + j) % len(PROMPTS)], max_tokens, timeout)
            with lock:
                results.append(res)

    def hostile() -> None:
        started.wait()
        time.sleep(0.3)  # in the middle of the streams
        for name, body in hostile_requests(long_prompt_words):
            rep.hostile_sent += 1
            try:
                code, payload = post_raw(url, "/v1/chat/completions", body, timeout)
                err = json.loads(payload).get("error") if payload else None
            except (OSError, http.client.HTTPException, ValueError) as e:
                rep.hostile_unexpected.append(f"{name}: {type(e).__name__}: {e}")
                continue
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            rep.hostile_answers[name] = f"HTTP {code}: {msg[:160]}"
            if 400 <= code < 600 and err:
                rep.hostile_refused += 1
            else:
                rep.hostile_unexpected.append(f"{name}: HTTP {code} {payload[:120]!r}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    h = threading.Thread(target=hostile, daemon=True)
    for t in [*threads, h]:
        t.start()
    for t in [*threads, h]:
        # each client sends `requests` requests of at most `timeout` seconds each
        t.join(max(1.0, min(stop_at - time.monotonic(), requests * timeout + 60) + timeout))
    rep.wall_s = time.perf_counter() - t0

    rep.requests = len(results)
    rep.failures = sum(not r.ok for r in results) + (clients * requests - len(results))
    rep.errors = [r.error for r in results if not r.ok]
    ttfts = [r.ttft for r in results if r.ok and r.ttft is not None]
    totals = [r.total for r in results if r.ok]
    rep.ttft_p50_ms, rep.ttft_p99_ms = 1000 * percentile(ttfts, 50), 1000 * percentile(ttfts, 99)
    rep.total_p50_ms, rep.total_p99_ms = 1000 * percentile(totals, 50), 1000 * percentile(totals, 99)

    # a slot finishing its last stream may need a moment to be marked idle
    for _ in range(20):
        code, slot_list = get_json(url, "/slots")
        if code == 200 and isinstance(slot_list, list):
            rep.busy_slots_after = sum(bool(s.get("is_processing")) for s in slot_list)
            if rep.busy_slots_after == 0:
                break
        time.sleep(0.25)
    code, health = get_json(url, "/health")
    rep.healthy_after = code == 200 and isinstance(health, dict) and health.get("status") == "ok"
    return rep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="a running server (default: start our llama-server on a free loopback port)")
    p.add_argument("--model", help="GGUF file (default: the default model, smollm2-gguf)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=3, help="requests per client")
    p.add_argument("--slots", type=int, default=4, help="llama-server -np")
    p.add_argument("--ctx", type=int, default=2048, help="llama-server -c (shared by the slots)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)

    proc = None
    url = args.url
    if url is None:
        from ggml_ext import assets, serve
        model = args.model or assets.path("smollm2-gguf")
        proc, url = serve.start(model, port=0, ctx_size=args.ctx,
                                extra=["-np", str(args.slots), "-t", str(args.threads), "--no-webui"])
    try:
        rep = run_load(url, args.clients, args.requests, args.max_tokens)
    finally:
        if proc is not None:
            from ggml_ext import serve
            rc = serve.stop(proc)
            print(f"llama-server stopped, exit code {rc}", file=sys.stderr)
    if args.json:
        print(json.dumps(asdict(rep) | {"passed": rep.passed}, indent=2))
    else:
        print(rep.text())
    return 0 if rep.passed else 1


if __name__ == "__main__":
    sys.exit(main())
