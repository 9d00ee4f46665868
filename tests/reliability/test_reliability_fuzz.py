"""Fuzzing smoke run of our GGUF reader (tests/fuzz/fuzz_gguf_reader.py, atheris) and replay of tests/fuzz/.

The smoke run is short (15 s) and starts from a copy of the committed seeds, so
the committed corpus never grows.  Only it needs atheris: the replay imports the
script's property (`check_one`) without it.  Longer runs: docs/RELIABILITY.md.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import atheris_smoke

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "fuzz" / "fuzz_gguf_reader.py"
FUZZ_DIR = REPO / "tests" / "fuzz"
SMOKE_SECONDS = 15


def _atheris_or_skip():
    """Only the timed fuzz runs need atheris; the replays of the committed inputs do not."""
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed in this Python: `make install` installs it (a PyPI wheel where one "
                    "exists for this Python, else built with clang; why it failed: .venv/.stamps/atheris.log)")


def _harness():
    """The fuzz script as a module, without atheris (it is imported only when the script runs as the fuzzer)."""
    spec = importlib.util.spec_from_file_location("fuzz_gguf_reader", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_gguf_reader"] = mod
    spec.loader.exec_module(mod)
    assert not mod.FUZZING and "atheris" not in vars(mod)
    return mod


def _inputs() -> list[Path]:
    """The GGUF inputs: seeds and regressions, and the seeds of the C fuzzers of ggml-ext's own readers (KV
    calibration, QDEC side file, our tensor types), which our reader reads too (converter_*/ are model folders,
    not GGUF files)."""
    return sorted(p for d in ("gguf_seeds", "regressions", "kv_calib_seeds", "qdec_seeds", "ext_tensor_seeds")
                  for p in (FUZZ_DIR / d).iterdir() if p.is_file())


def test_committed_fuzz_inputs_are_small():
    files = _inputs()
    assert files, "no seeds in tests/fuzz/"
    assert sum(p.stat().st_size for p in files) < 1 << 20


def test_replay_seeds_and_regressions():
    """Every committed input passes the fuzz property (parses consistently or raises GGUFError)."""
    h = _harness()
    parsed = 0
    for p in _inputs():
        parsed += h.check_one(p.read_bytes()) is not None
    assert parsed >= 3          # the seeds are valid files


def test_seeds_are_reproducible(tmp_path):
    """--make-seeds writes the committed seeds byte for byte (so they can be regenerated, not hand-edited)."""
    pytest.importorskip("gguf")
    r = subprocess.run([sys.executable, str(SCRIPT), "--make-seeds", str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    for p in tmp_path.iterdir():
        assert p.read_bytes() == (FUZZ_DIR / "gguf_seeds" / p.name).read_bytes(), p.name


def test_fuzz_smoke(tmp_path):
    _atheris_or_skip()
    atheris_smoke.run(SCRIPT, FUZZ_DIR / "gguf_seeds", tmp_path, SMOKE_SECONDS, ["-max_len=8192"], "gguf_reader",
                      "add it to tests/fuzz/regressions/")
