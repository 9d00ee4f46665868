"""`ggml-ext serve`: our llama-server on loopback, with its OpenAI-style API."""
from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from . import _locate, tools
from ._args import int_range


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("--apq-bits", type=int_range(1, 8), default=None, metavar="B",
                   help="precision of an any-precision file (convert --method anyprec; default: its highest)")
    p.epilog = "Further llama-server arguments go after --, e.g. `ggml-ext serve M.gguf --port 8081 -- -t 4`."
    p.set_defaults(extra=[])  # cli.main puts what follows "--" here


def start(model: str | Path, host: str = "127.0.0.1", port: int = 0, ctx_size: int = 4096,
          extra: list[str] | None = None, timeout: float = 120.0, log=None,
          started: list | None = None) -> tuple[subprocess.Popen, str]:
    """Start llama-server and wait until /health answers; returns (process, base URL).

    ``started``: a list the process is appended to as soon as it exists, so a caller whose signal
    handlers raise can stop it even when the signal lands between this function's return and the
    caller's assignment of its result."""
    if not Path(model).is_file():
        raise FileNotFoundError(f"model file not found: {model}")
    port = port or free_port(host)
    extra = list(extra or [])
    webui = _locate.webui_dir()
    if webui and "--path" not in extra and "--no-webui" not in extra:
        extra += ["--path", str(webui)]
    cmd = tools.command("llama-server", "-m", model, "--host", host, "--port", str(port), "-c", str(ctx_size),
                        *extra)
    # Its own session: a terminal's Ctrl-C or a group kill reaches only us, and stop() sends the server one
    # SIGTERM (a second one makes llama-server exit at once, skipping its clean shutdown).
    proc = subprocess.Popen(cmd, env=tools.tool_env(), stdout=log or subprocess.DEVNULL,
                            stderr=subprocess.STDOUT if log else subprocess.DEVNULL, start_new_session=True)
    if started is not None:
        started.append(proc)
    url = f"http://{host}:{port}"
    try:
        wait_ready(proc, url, timeout)
        return proc, url
    except BaseException:  # also Ctrl-C or a signal while it loads: never leave it running
        stop(proc)
        raise


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 120.0) -> None:
    """Wait until the llama-server ``proc`` at ``url`` answers /health (RuntimeError if it exits first,
    TimeoutError after ``timeout`` seconds: a guard against a server that hangs while loading)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"llama-server did not become ready within {timeout:.0f} s")


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """Stop llama-server cleanly (SIGTERM), killing it only if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Stopped(Exception):
    """Raised in the main thread by SIGTERM or SIGHUP, as KeyboardInterrupt is by SIGINT."""


def _raise_stopped(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def main(args: argparse.Namespace) -> int:
    """Run the server until it exits (its exit code) or until Ctrl-C, SIGTERM (kill, systemd, docker stop)
    or SIGHUP (the terminal closed) stops it: 0 after a stop by signal."""
    extra = list(args.extra)
    if getattr(args, "apq_bits", None) is not None:
        extra += ["--apq-bits", str(args.apq_bits)]
    # Python's default for SIGTERM/SIGHUP is to die at once, leaving llama-server holding the port.
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _raise_stopped)
    except ValueError:  # not the main thread: the caller owns the signals
        pass
    # One try block from the start to the end: a signal may land anywhere, the print included (a
    # SIGTERM right after "ready" once escaped a second block), and the server is stopped wherever.
    started: list = []
    try:
        proc, url = start(args.model, args.host, args.port, args.ctx_size, extra, log=sys.stderr, started=started)
        print(f"llama-server (pid {proc.pid}) ready at {url}  (web UI: {url}/, OpenAI API: {url}/v1)  Ctrl-C to stop",
              flush=True)
        return proc.wait()
    except (FileNotFoundError, RuntimeError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Stopped):
        # a second signal must not interrupt the stop (bounded: SIGKILL after stop()'s timeout);
        # start() has already stopped a server that was not ready
        try:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
        except ValueError:
            pass
        for proc in started:
            stop(proc)
        return 0
