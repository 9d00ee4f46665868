"""A bad value of one of our flags names the flag and what it takes, in the llama tools and in `ggml-ext`.

The llama tools parse common's arguments (patches 0310, 0320, 0323, 0331) through ggml_ext/src/llama/flags.c
(and qdec.c's spec parser): "--apq-bits: 'abc' is not an integer; use 1..8" where common said "stoi". The
value is refused while the arguments are parsed: no model is read (the -m given does not exist), and the
tool exits with a status, not a signal. `ggml-ext`'s own flags do the same through argparse types
(python/ggml_ext/_args.py) and choices.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from ggml_ext import tools

CTK_NAMES = "use f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, nuq4, nuq3, nuq2"

LLAMA = [  # (arguments, words of the error)
    (["--apq-bits", "abc"], "--apq-bits: 'abc' is not an integer; use 1..8"),
    (["--apq-bits", "9"], "--apq-bits: 9 is out of range; use 1..8"),
    (["--apq-bits", "0"], "--apq-bits: 0 is out of range; use 1..8"),
    (["--apq-bits", "4x"], "--apq-bits: '4x' is not an integer; use 1..8"),
    (["--kv-outliers", "x"], "--kv-outliers: 'x' is not a number; use 0 <= F < 0.5"),
    (["--kv-outliers", "0.7"], "--kv-outliers: 0.7 is out of range; use 0 <= F < 0.5"),
    (["--kv-outliers", "nan"], "--kv-outliers: 'nan' is not a number"),
    (["--kv-sink", "abc"], "--kv-sink: 'abc' is not an integer; use 0..16"),
    (["--kv-sink", "17"], "--kv-sink: 17 is out of range; use 0..16"),
    (["--dec-k", "abc"], "--dec-k: 'abc' is not an integer or NAME=N list; use 0.."),
    (["--dec-k", "99999"], "--dec-k: '99999' is out of range; use 0.."),
    (["--dec-k", "7x"], "--dec-k: '7x' is not an integer; use 0.."),
    (["--dec-k", "qkv=x"], "--dec-k: 'qkv=x': the value of qkv is not an integer in 0.."),
    (["--dec-ntb", "abc"], "--dec-ntb: 'abc' is not an integer or NAME=N list; use 0..65536"),
    (["--dec-config", "/nonexistent/dec.json"], "QDEC config /nonexistent/dec.json"),
    (["-ctk", "nuq5"], "'nuq5' is not a KV cache type; " + CTK_NAMES),
    (["-ctv", "abc"], "'abc' is not a KV cache type; " + CTK_NAMES),
]


def _run(argv: list[str]) -> tuple[int, str]:
    r = subprocess.run(argv, env=tools.tool_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       errors="replace", timeout=120)
    return r.returncode, r.stdout + r.stderr


# llama-cli covers the parser; the server and llama-perplexity take the same flags
RUNS = [("llama-cli", a, w) for a, w in LLAMA] + [
    (tool, a, w) for tool in ("llama-server", "llama-perplexity") for a, w in LLAMA[::4]]


@pytest.mark.parametrize("tool,args,words", RUNS, ids=[f"{t} {' '.join(a)}" for t, a, _ in RUNS])
def test_llama_tools_name_the_flag(tool, args, words, tmp_path):
    rc, log = _run(tools.command(tool, "-m", tmp_path / "no-such-model.gguf", *args))
    assert 0 < rc < 128, f"{tool} {args}: exit {rc}\n{log[-1500:]}"
    assert words in log, log[-1500:]
    assert f'error while handling argument "{args[0]}"' in log, log[-1500:]
    assert "stoi" not in log and "stof" not in log


def test_good_values_still_parse(tmp_path):
    """The same flags with good values get past the parser: the run fails only on the missing model."""
    rc, log = _run(tools.command("llama-cli", "-m", tmp_path / "no-such-model.gguf", "--apq-bits", "4",
                                 "--kv-outliers", "0.01", "--kv-sink", "4", "--dec-k", "qkv=16,o=8", "--dec-ntb", "0",
                                 "-ctk", "nuq4", "-ctv", "q8_0", "-n", "1", "-p", "hi", "-st"))
    assert rc != 0 and "error while handling argument" not in log, log[-1500:]


def test_llama_bench_names_the_cache_types(tmp_path):
    rc, log = _run(tools.command("llama-bench", "-m", tmp_path / "no-such-model.gguf", "-ctk", "nuq5"))
    assert 0 < rc < 128, log[-1500:]
    assert "unknown KV cache type 'nuq5'" in log and "nuq4, nuq3, nuq2" in log, log[-1500:]


CLI = [  # (ggml-ext arguments, words of argparse's error)
    (["chat", "m.gguf", "--apq-bits", "abc"], "argument --apq-bits: 'abc' is not an integer; use 1..8"),
    (["serve", "m.gguf", "--apq-bits", "9"], "argument --apq-bits: 9 is out of range; use 1..8"),
    (["perplexity", "m.gguf", "--apq-bits", "x"], "argument --apq-bits: 'x' is not an integer; use 1..8"),
    (["anyprec", "extract", "m.gguf", "--bits", "9", "-o", "o.gguf"], "argument --bits: 9 is out of range; use 1..8"),
    (["calibrate", "kv", "hf", "-o", "o.gguf", "--bits", "2,x"],
     "argument --bits: in '2,x': 'x' is not an integer; use 1..8"),
    (["calibrate", "kv", "hf", "-o", "o.gguf", "--qnorm-bits", "12"],
     "argument --qnorm-bits: in '12': 12 is out of range; use 1..8"),
    (["calibrate", "dec", "b.gguf", "--hf", "hf", "-o", "o.gguf", "--layers", "abc"],
     "argument --layers: in 'abc': 'abc' is not an integer"),
    (["calibrate", "dec", "b.gguf", "--hf", "hf", "-o", "o.gguf", "--layers", "3-1"],
     "argument --layers: in '3-1': the range 3-1 is empty"),
    (["convert", "hf", "-o", "o.gguf", "--type", "q9"], "argument --type: invalid choice: 'q9' (choose from"),
    (["repack", "a.gguf", "b.gguf", "--layout", "9x9"], "argument --layout: invalid choice: '9x9' (choose from"),
    (["bench", "m.gguf", "--apq-bits", "abc"], "--apq-bits takes precisions like 3,4,8 or all, not 'abc'"),
]


@pytest.mark.parametrize("args,words", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_cli_names_the_flag(args, words, tmp_path):
    r = subprocess.run([sys.executable, "-m", "ggml_ext.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert 0 < r.returncode < 128, r.stderr[-1500:]
    assert words in r.stderr, r.stderr[-1500:]
    assert "Traceback" not in r.stderr
