#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Reliability": llama-server under 16 concurrent streams, ours against the pristine build.
"""llama-server under concurrent load: failed requests, answers against the same request served alone, throughput,
latency and peak memory; our build with an any-precision file and a NUQ cache against the pristine build with a
Q4_K_M file and its q4_0 cache, the same prompts, the same slots and threads.

    bench/runtime/bench_server_load.py --ours OURS_BIN --upstream UP_BIN --work DIR [--streams 16]

The files are made once in DIR from the ``smollm2-hf`` asset: an any-precision file (``convert --method anyprec
--bits 3-8``, no Fisher: speed and leaks do not depend on the quantizer's choices), its KV calibration, and the f16
file the pristine ``llama-quantize`` turns into Q4_K_M. Each server runs ``-np STREAMS -c STREAMS x 512 -fa on``.
Ours serves the streams at precisions 3, 4, 5 and 8 in turn (``apq_bits`` per request) with ``-ctk nuq4 -ctv nuq4``;
two more streams are cancelled after their first tokens. Every request is first served alone (greedy) and its
answer under load compared with that text (a batch of several streams sums in another order than one stream
alone, on both servers: the table counts the answers that differ, and the differing texts go to stderr). Streams
start together; each one's time to the first token and to the last is taken from the client, tokens/s is all
generated tokens over the wall time from the start to the last answer, peak memory is the server's VmHWM. Prints a markdown table; ``--json FILE`` keeps the figures.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

PROMPTS = ["The capital of France is", "Once upon a time, there was", "1, 2, 3, 4,", "The quick brown fox",
           "In the beginning", "Water boils at", "My favourite book is", "The best way to learn is"]
BITS = [3, 4, 5, 8]


def make_files(work: Path, up_bin: Path) -> dict[str, Path]:
    from ggml_ext import assets
    from ggml_ext.converters import convert
    from ggml_ext.kvquant import calibrate
    hf = assets.path("smollm2-hf")
    work.mkdir(parents=True, exist_ok=True)
    f = {"apq": work / "smollm2-apq.gguf", "kv": work / "smollm2-kv.gguf", "f16": work / "smollm2-f16.gguf",
         "q4_k_m": work / "smollm2-q4_k_m.gguf"}
    if not f["apq"].exists():
        convert(hf, f["apq"], method="anyprec", method_options={"fisher": False, "bits": "3-8"})
    if not f["kv"].exists():
        calibrate(hf, str(assets.path("wiki-train")), n_samples=4, seq_len=256, bits=(4,),
                  progress=False).save(f["kv"], force=True)
    if not f["f16"].exists():
        convert(hf, f["f16"], "f16")
    if not f["q4_k_m"].exists():
        subprocess.run([str(up_bin / "llama-quantize"), str(f["f16"]), str(f["q4_k_m"]), "Q4_K_M"], check=True,
                       capture_output=True)
    return f


def stream(url: str, body: dict, cancel_after: int | None = None) -> dict:
    """One streaming /completion: its text, tokens, time to the first event and to the end (or to the cancel)."""
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=900)
    t0 = time.monotonic()
    c.request("POST", "/completion", body=json.dumps({**body, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}")
    text, n, first, events = [], 0, None, 0
    while True:
        line = r.fp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        events += 1
        ev = json.loads(line[6:])
        if first is None:
            first = time.monotonic() - t0
        text.append(ev.get("content", ""))
        n += 1 if ev.get("content") else 0
        if cancel_after is not None and events >= cancel_after:
            break
        if ev.get("stop"):
            n = ev.get("timings", {}).get("predicted_n", n)
            break
    c.close()
    return {"text": "".join(text), "tokens": n, "ttft": first, "total": time.monotonic() - t0}


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(label: str, bin_dir: Path, model: Path, extra: list[str], reqs: list[dict], cancels: list[dict],
        a: argparse.Namespace, check_alone: bool) -> dict:
    from ggml_ext import serve, tools
    log = open(a.work / f"server-{label}.log", "w")
    port = serve.free_port("127.0.0.1")
    cmd = [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-c", str(a.streams * 512), "-t", str(a.threads), "-np", str(a.streams), "--no-webui", "-fa", "on", *extra]
    # the pristine server with the environment as it is: tool_env's LD_LIBRARY_PATH would hand it our libraries
    env = tools.tool_env() if label == "ours" else {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        serve.wait_ready(proc, url, timeout=600)
        alone = [stream(url, q)["text"] for q in reqs] if check_alone else None
        out: list[dict | None] = [None] * len(reqs)
        errors: list[str] = []
        go = threading.Barrier(len(reqs) + len(cancels))

        def one(i, q):
            go.wait()
            try:
                out[i] = stream(url, q)
            except Exception as e:  # noqa: BLE001 - counted as a failed request
                errors.append(f"{q['prompt']!r}: {e}")

        def cancel(q):
            go.wait()
            try:
                stream(url, q, cancel_after=2)
            except Exception as e:  # noqa: BLE001
                errors.append(f"cancelled {q['prompt']!r}: {e}")

        ts = [threading.Thread(target=one, args=(i, q)) for i, q in enumerate(reqs)]
        ts += [threading.Thread(target=cancel, args=(q,)) for q in cancels]
        t0 = time.monotonic()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.monotonic() - t0
        alive = proc.poll() is None
        hwm = vm_hwm_mib(proc.pid) if alive else float("nan")
    finally:
        serve.stop(proc)
        log.close()
    done = [o for o in out if o]
    toks = sum(o["tokens"] for o in done)
    return {"label": label, "requests": len(reqs), "failed": len(reqs) - len(done) + len(errors), "errors": errors,
            "crashed": not alive, "tokens": toks, "wall_s": wall, "tok_s": toks / wall if wall > 0 else 0.0,
            "ttft_p50": statistics.median(o["ttft"] for o in done) if done else None,
            "total_p50": statistics.median(o["total"] for o in done) if done else None,
            "total_max": max((o["total"] for o in done), default=None), "peak_rss_mib": hwm,
            "differ_from_alone": (sum(o is None or o["text"] != w for o, w in zip(out, alone)) if alone else None),
            "differ": [(q["prompt"], q.get("apq_bits"), w, o and o["text"]) for q, o, w in zip(reqs, out, alone or [])
                       if alone and (o is None or o["text"] != w)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", type=Path, required=True, help="our build's bin/ (llama-server)")
    ap.add_argument("--upstream", type=Path, required=True, help="the pristine build's bin/ (llama-server, llama-quantize)")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    f = make_files(a.work, a.upstream)
    base = {"n_predict": a.n_predict, "temperature": 0, "seed": 0, "cache_prompt": False}
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(a.streams)]
    ours = [{**base, "prompt": p, "apq_bits": BITS[i % len(BITS)]} for i, p in enumerate(prompts)]
    up = [{**base, "prompt": p} for p in prompts]
    cancels_ours = [{**base, "prompt": PROMPTS[1], "n_predict": 400, "apq_bits": b} for b in (8, 3)]
    cancels_up = [{**base, "prompt": PROMPTS[1], "n_predict": 400} for _ in range(2)]
    rows = [run("ours", a.ours, f["apq"], ["-ctk", "nuq4", "-ctv", "nuq4", "--kv-calib", str(f["kv"])], ours,
                cancels_ours, a, True),
            run("pristine", a.upstream, f["q4_k_m"], ["-ctk", "q4_0", "-ctv", "q4_0"], up, cancels_up, a, True)]
    print(f"| server | file, cache | streams (+ cancelled) | failed | crashed | differ from alone | tok/s | "
          f"first token p50 s | answer p50 / max s | peak RSS MiB |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r, what in zip(rows, ("APQ 3/4/5/8 bits, nuq4 K+V", "Q4_K_M, q4_0 K+V")):
        d = "-" if r["differ_from_alone"] is None else r["differ_from_alone"]
        print(f"| {r['label']} | {what} | {r['requests']} (+2) | {r['failed']} | {'yes' if r['crashed'] else 'no'} | "
              f"{d} | {r['tok_s']:.1f} | {r['ttft_p50']:.2f} | {r['total_p50']:.2f} / {r['total_max']:.2f} | "
              f"{r['peak_rss_mib']:.0f} |")
    for r in rows:
        for e in r["errors"]:
            print(f"{r['label']}: {e}", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    for r in rows:
        for p, b, alone, got in r["differ"]:
            print(f"{r['label']}: {p!r} at {b} bits differs from alone:\n  alone: {alone!r}\n  load:  {got!r}", file=sys.stderr)
    return 0 if all(r["failed"] == 0 and not r["crashed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
