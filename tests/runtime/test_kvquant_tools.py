"""The KVQuant cache types (-ctk/-ctv nuq4|nuq3|nuq2, --kv-calib) in the llama.cpp tools beyond
llama-perplexity (tests/runtime/test_kvquant_cache.py): llama-bench (its own type parser, patch 0324),
llama-cli, and llama-server's slot save / restore, whose file holds the cache's NUQ bytes; a missing or
bad calibration is a clear startup error of the server and of llama-bench, never a crash.

The calibration is the shared 1 x 64-token one (convert_support.default_kv_calibration, cached)."""
from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import convert_support as cs  # noqa: E402
from ggml_ext import serve, tools  # noqa: E402


@pytest.fixture(scope="module")
def calib():
    return cs.default_kv_calibration()


def _run(name, *args, env=None, timeout=300):
    e = tools.tool_env()
    e.update(env or {})
    return subprocess.run(tools.command(name, *args), env=e, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _error_exit(r):
    out = r.stdout + r.stderr
    assert 0 < r.returncode < 128, f"exit {r.returncode} (a signal or success, not an error exit):\n{out[-3000:]}"
    return out


def test_llama_bench_nuq_types(default_gguf, threads, calib):
    r = _run("llama-bench", "-m", default_gguf, "-p", "16", "-n", "4", "-d", "32", "-r", "1", "-t", threads,
             "-fa", "1", "-ctk", "nuq4,f16", "-ctv", "nuq3", "--kv-calib", calib, "-o", "json", "--no-warmup")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    got = {(x["type_k"], x["type_v"], x["n_prompt"], x["n_gen"]) for x in rows}
    assert got == {(k, "nuq3", p, g) for k in ("nuq4", "f16") for p, g in ((16, 0), (0, 4))}, got
    assert all(x["n_depth"] == 32 and x["avg_ts"] > 0 for x in rows), rows


def test_llama_bench_refusals(default_gguf, threads, calib):
    # an unknown name is named, with the types it could be
    out = _error_exit(_run("llama-bench", "-m", default_gguf, "-ctv", "nuq5", "-fa", "1"))
    assert "unknown KV cache type 'nuq5'" in out and "nuq4" in out
    # no calibration: context creation fails with the glue's message, an ordinary exit
    out = _error_exit(_run("llama-bench", "-m", default_gguf, "-p", "8", "-n", "0", "-r", "1", "-t", threads,
                           "-fa", "1", "-ctv", "nuq4", env={"GGML_EXT_KV_CALIB": ""}))
    assert "needs a KV calibration" in out


def test_llama_cli_nuq_cache(default_gguf, threads, calib, tmp_path):
    out = tmp_path / "answer.txt"
    r = _run("llama-cli", "-m", default_gguf, "-p", "What is the capital of France? Answer in one sentence.",
             "-st", "-n", "12", "--temp", "0", "--seed", "0", "-c", "256", "-t", threads, "--no-warmup",
             "--simple-io", "-fa", "on", "-ctk", "nuq4", "-ctv", "nuq4", "--kv-calib", calib, "-o", out)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "Paris" in out.read_text(encoding="utf-8").split("Assistant:", 1)[-1]


def _post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _complete(url, tokens, n):
    r = _post(url + "/completion", {"prompt": tokens, "n_predict": n, "temperature": 0, "top_k": 1, "seed": 0,
                                    "id_slot": 0, "cache_prompt": True, "return_tokens": True})
    return r["tokens"], r["timings"]["prompt_n"]


def test_server_slot_save_restore_nuq(default_gguf, threads, calib, tmp_path):
    """A completion of 12 tokens, the slot saved, erased, restored, and 12 more tokens: the 24 equal one
    uninterrupted completion of 24, and the continuation after the restore evaluated at most 2 prompt tokens
    (the restored cache served the rest; without it the whole prompt is evaluated again)."""
    slots = tmp_path / "slots"
    slots.mkdir()
    with open(tmp_path / "server.log", "w") as log:
        proc, url = serve.start(default_gguf, port=0, ctx_size=512, log=log, extra=[
            "-t", str(threads), "-np", "1", "-fa", "on", "-ctk", "nuq4", "-ctv", "nuq4", "--kv-calib", str(calib),
            "--slot-save-path", str(slots)])
        try:
            prompt = _post(url + "/tokenize", {"content": "The history of the city of Paris begins",
                                               "add_special": True})["tokens"]
            full, _ = _complete(url, prompt, 24)
            _post(url + "/slots/0?action=erase", {})
            first, _ = _complete(url, prompt, 12)
            saved = _post(url + "/slots/0?action=save", {"filename": "s0.bin"})
            assert saved["n_saved"] >= len(prompt) + 11 and (slots / "s0.bin").stat().st_size > 0, saved
            _post(url + "/slots/0?action=erase", {})
            restored = _post(url + "/slots/0?action=restore", {"filename": "s0.bin"})
            assert restored["n_restored"] == saved["n_saved"], restored
            rest, evaluated = _complete(url, prompt + first, 12)
            assert evaluated <= 2, evaluated
            assert first + rest == full, (first, rest, full)
            # erased without a restore, the same request evaluates the whole prompt again (the check above can fail)
            _post(url + "/slots/0?action=erase", {})
            again, evaluated = _complete(url, prompt + first, 12)
            assert evaluated >= len(prompt) + len(first) - 1, (evaluated, again)
            assert proc.poll() is None
        finally:
            serve.stop(proc)


@pytest.mark.parametrize("case", ["missing", "not-a-calibration", "none"])
def test_server_bad_calibration_is_a_startup_error(default_gguf, threads, calib, tmp_path, case):
    kv = {"missing": ["--kv-calib", str(tmp_path / "none.gguf")],
          "not-a-calibration": ["--kv-calib", str(default_gguf)], "none": []}[case]
    port = serve.free_port()
    r = _run("llama-server", "-m", default_gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "256",
             "-t", threads, "-fa", "on", "-ctv", "nuq4", *kv, env={"GGML_EXT_KV_CALIB": ""}, timeout=120)
    out = _error_exit(r)
    want = {"missing": "cannot be read", "not-a-calibration": "not a KVQuant calibration",
            "none": "needs a KV calibration"}[case]
    assert want in out, out[-3000:]
