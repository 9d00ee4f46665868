"""Running our build's llama.cpp tools (llama-server, llama-bench, llama-perplexity, ...)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import _locate


def tool_env() -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(_locate.lib_dir()), env.get("LD_LIBRARY_PATH")]))
    return env


def command(name: str, *args: str | os.PathLike) -> list[str]:
    return [str(_locate.tool(name)), *(str(a) for a in args)]


def fresh_rusage(argv: list[str]) -> list[str]:
    """`argv` started through a short-lived Python parent, so that the program's peak-RSS count starts from its
    own use. Linux carries a process's ru_maxrss across fork + exec: a child inherits the high-water mark of its
    parent (a test process that once held a model at 5 GB makes every later libFuzzer run report 5 GB and trip
    its -rss_limit_mb at once). A fresh interpreter's fork gives the program a small starting count."""
    return [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))",
            *(str(a) for a in argv)]


def run(argv: list[str], env: dict[str, str] | None = None,
        complete: Callable[[str], bool] | None = None, echo: bool = False) -> tuple[int, str]:
    """Run a tool to its end: (exit code, its output, stdout and stderr together; `echo` passes it on to stderr).
    llama.cpp's log runs on its own thread, never joined (common_log_main is a leaked static): on a fast run (tiny
    models, a loaded machine) a tool can exit 0 before its last lines are written (seen about 1 run in 3 here).
    `complete(log)` says whether the lines the caller reads are there; the result is deterministic, so a run that
    exits 0 without them runs again (4 tries)."""
    for _ in range(4):
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        out = []
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if echo:
                sys.stderr.write(line)
        rc, log = proc.wait(), "".join(out)
        if rc != 0 or complete is None or complete(log):
            break
    return rc, log


def log_tail(log: str, lines: int = 15) -> str:
    """The last lines of a tool's output, for an error message."""
    return "\n".join(log.strip().splitlines()[-lines:])


def exec_tool(name: str, args: list[str]) -> int:
    """Run a tool in the foreground, passing its output through; returns its exit code."""
    try:
        return subprocess.call(command(name, *args), env=tool_env())
    except KeyboardInterrupt:
        return 130


@dataclass
class Perplexity:
    ppl: float
    stderr: float
    n_ctx: int
    n_chunks: int
    n_tokens_scored: int  # tokens first..n_ctx-2 of each window, first = n_ctx//2 (llama-perplexity)
    log: str = field(default="", repr=False, compare=False)  # the tool's output (stdout and stderr)

    def __str__(self) -> str:
        return (f"PPL = {self.ppl:.4f} +/- {self.stderr:.4f} (ctx {self.n_ctx}, {self.n_chunks} chunks, "
                f"{self.n_tokens_scored} tokens scored)")


_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)")


def perplexity(model: str | os.PathLike, text: str | os.PathLike, n_ctx: int = 512, chunks: int | None = None,
               threads: int | None = None, extra: list[str] | None = None, echo: bool = False,
               env: dict[str, str] | None = None, apq_bits: int | None = None,
               binary: str | os.PathLike | None = None) -> Perplexity:
    """Perplexity of `model` on the text file, by our llama-perplexity (fixed windows, second half scored).
    `env`: extra environment variables for the tool (e.g. GGML_EXT_RUNTIME_REPACK=0); `apq_bits`: the
    precision of an any-precision file (--apq-bits; default its highest). `binary`: another build's
    llama-perplexity instead of ours (benchmarks' pristine upstream baseline; pass its library folder in
    `env`'s LD_LIBRARY_PATH)."""
    for p in (model, text):
        if not Path(p).is_file():
            raise FileNotFoundError(f"not found: {p}")
    args = ["-m", model, "-f", text, "-c", str(n_ctx), "--no-warmup"]
    if chunks:
        args += ["--chunks", str(chunks)]
    if threads:
        args += ["-t", str(threads)]
    if apq_bits is not None:
        args += ["--apq-bits", str(apq_bits)]
    args += list(extra or [])
    argv = [str(binary), *(str(a) for a in args)] if binary else command("llama-perplexity", *args)
    # complete: the "Final estimate" line, or no sign that the tool got as far as computing
    rc, log = run(argv, {**tool_env(), **(env or {})}, echo=echo,
                  complete=lambda log: bool(_FINAL.search(log)) or not _CHUNKS.search(log))
    m, c = _FINAL.search(log), _CHUNKS.search(log)
    if rc != 0 or not m or not c:
        raise RuntimeError(f"llama-perplexity failed (exit {rc}):\n{log_tail(log)}")
    n_chunks, ctx = int(c.group(1)), int(c.group(2))
    return Perplexity(float(m.group(1)), float(m.group(2)), ctx, n_chunks, n_chunks * (ctx - 1 - ctx // 2), log)
