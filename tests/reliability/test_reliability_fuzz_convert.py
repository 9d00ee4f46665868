"""Fuzzing smoke run of the converter's inputs (tests/fuzz/fuzz_converter_inputs.py, atheris) and replay of its
seeds and regressions (tests/fuzz/converter_seeds/, tests/fuzz/converter_regressions/).

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
SCRIPT = REPO / "tests" / "fuzz" / "fuzz_converter_inputs.py"
SEEDS = REPO / "tests" / "fuzz" / "converter_seeds"
REGRESSIONS = REPO / "tests" / "fuzz" / "converter_regressions"
SMOKE_SECONDS = 15


def _atheris_or_skip():
    """Only the timed fuzz runs need atheris; the replays of the committed inputs do not."""
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed in this Python: `make install` installs it (a PyPI wheel where one "
                    "exists for this Python, else built with clang; why it failed: .venv/.stamps/atheris.log)")


@pytest.fixture(scope="module")
def harness():
    """The fuzz script as a module, without atheris (it is imported only when the script runs as the fuzzer)."""
    spec = importlib.util.spec_from_file_location("fuzz_converter_inputs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_converter_inputs"] = mod
    spec.loader.exec_module(mod)
    assert not mod.FUZZING and "atheris" not in vars(mod)
    return mod


def test_committed_inputs_are_small():
    seeds = list(SEEDS.iterdir())
    assert len(seeds) >= 4
    assert sum(p.stat().st_size for p in seeds) < 200_000
    assert sum(p.stat().st_size for p in REGRESSIONS.iterdir()) < 200_000


def test_seeds_convert(harness):
    """Every seed is a model folder the converter turns into a GGUF file our reader reads back."""
    for p in sorted(SEEDS.iterdir()):
        g = harness.check_one(p.read_bytes())
        assert g is not None and len(g.tensors) > 10, f"{p.name} was refused"


@pytest.mark.parametrize("name", sorted(p.name for p in REGRESSIONS.iterdir()))
def test_regression_is_refused_cleanly(harness, name):
    """What the fuzzer found: each is now refused with a ConversionError (no other exception)."""
    assert harness.check_one((REGRESSIONS / name).read_bytes()) is None


def test_seeds_are_reproducible(harness, tmp_path):
    """--make-seeds writes the committed seeds byte for byte (so they can be regenerated, not hand-edited)."""
    pytest.importorskip("safetensors")
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, str(SCRIPT), "--make-seeds", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in SEEDS.iterdir())
    for name in made:
        assert (tmp_path / name).read_bytes() == (SEEDS / name).read_bytes(), name


def test_fuzz_smoke(tmp_path):
    _atheris_or_skip()
    atheris_smoke.run(SCRIPT, SEEDS, tmp_path, SMOKE_SECONDS, ["-timeout=20", "-rss_limit_mb=2048"], "converter",
                      "shrink it with --minimize, fix the converter, add it to tests/fuzz/converter_regressions/",
                      timeout_slack=90)
