"""The path for users who outgrow one machine: ggml-rpc-server on loopback, llama-cli --rpc across it."""
from __future__ import annotations

import subprocess

from ggml_ext import tools


def test_llama_cli_runs_the_default_model_across_rpc(rpc_server, default_gguf, tool_env, threads):
    port, log = rpc_server
    proc = subprocess.run(
        tools.command("llama-cli", "-m", default_gguf, "--rpc", f"127.0.0.1:{port}", "-ngl", "99", "-dev", "RPC0", "-lv", "4",
                      "-p", "What is the capital of France? Answer in one sentence.", "-st", "-n", "24", "--temp", "0", "--seed", "0",
                      "-c", "512", "-t", str(threads)),
        env=tool_env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Paris" in proc.stdout, out[-3000:]
    # the weights and the KV cache went to the RPC device, not the local CPU
    assert "offloaded 31/31 layers" in out, out[-3000:]
    assert f"RPC0[127.0.0.1:{port}] model buffer size" in out, out[-3000:]
    assert f"RPC0[127.0.0.1:{port}] KV buffer size" in out, out[-3000:]
    log.seek(0)
    assert "Accepted client connection" in log.read()
