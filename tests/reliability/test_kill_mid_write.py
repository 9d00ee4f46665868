"""Killed mid-write, `ggml-ext calibrate` (kv, dec, stats), `convert` (the any-precision method) and `compare`
leave no partial file under a final name, and a rerun completes.

Each command runs as a subprocess on a tiny model (convert_support.tiny) through a small launcher that
stops the process (SIGSTOP) when its output begins to appear: after the N-th tensor a GGUF writer puts in
its temporary file, or just before the N-th rename of a temporary file into place. The test waits for
the stop (waitpid, no clock), kills the process with SIGKILL, and checks what is on disk: the final file
is absent (the temporary file, named for the dead process, may remain), or -- for the commands that
resume -- every file under a final name is whole and loads. The rerun then completes, removes the dead
process's temporary files (ggml_ext/_atomic.py) and writes what an uninterrupted run writes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import convert_support as cs
from ggml_ext import tools
from ggml_ext.gguf import read_gguf

# Runs `ggml-ext ARGS...`, stopping itself at event STOP_AT (1-based): a tensor written by GGUFWriter (flushed
# first, so its bytes are in the temporary file) or the rename of a temporary file (*.tmp) to its final name;
# with STOP_NAME, only events of the file of that name count (a calibration cache written first does not).
LAUNCHER = r"""
import os, signal, sys
stop_at, seen = int(os.environ["GGML_EXT_TEST_STOP_AT"]), [0]
only = os.environ.get("GGML_EXT_TEST_STOP_NAME")
def event(path):
    if only and os.path.basename(str(path)) != only:
        return
    seen[0] += 1
    if seen[0] == stop_at:
        os.kill(os.getpid(), signal.SIGSTOP)
from ggml_ext.gguf import writer
write_tensor = writer.GGUFWriter.write_tensor
def counted_write_tensor(self, data):
    write_tensor(self, data)
    self._fh.flush()
    event(self.path)
writer.GGUFWriter.write_tensor = counted_write_tensor
for name in ("replace", "link"):
    def counted(src, dst, *a, _f=getattr(os, name), **k):
        if str(src).endswith(".tmp"):
            event(dst)
        return _f(src, dst, *a, **k)
    setattr(os, name, counted)
from ggml_ext.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_killed(args: list[str], stop_at: int, name: str | None = None) -> None:
    """`ggml-ext ARGS`, killed (SIGKILL) at event ``stop_at`` (of the file called ``name`` only, when given);
    fails if the command ends before it."""
    env = {**tools.tool_env(), "GGML_EXT_TEST_STOP_AT": str(stop_at), "GGML_EXT_TEST_STOP_NAME": name or ""}
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    _, status = os.waitpid(p.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode(errors="replace")
        pytest.fail(f"ggml-ext {' '.join(args)} ended (exit {p.returncode}) before event {stop_at}:\n{err[-2000:]}")
    os.kill(p.pid, signal.SIGKILL)
    _, status = os.waitpid(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    p.stderr.close()
    assert p.returncode == -signal.SIGKILL


def run_ok(args: list[str]) -> str:
    r = subprocess.run([sys.executable, "-m", "ggml_ext.cli", *args], env=tools.tool_env(), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def temps(folder: Path) -> list[Path]:
    return sorted(folder.rglob(".*.tmp"))


@pytest.fixture(scope="module")
def tiny() -> Path:
    # one head of 64 channels: KVQuant's blocks are 64 values of one head
    return cs.tiny("llama", num_attention_heads=1, num_key_value_heads=1)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("text") / "calib.txt"
    p.write_text(" ".join(f"word{i} and some more text {i % 7}." for i in range(3000)))
    return p


def _killed_then_rerun(args: list[str], out: Path, stop_at: int) -> None:
    """The single-file case: killed at ``stop_at``, no ``out``; the rerun writes it and leaves no temporary file."""
    run_killed(args, stop_at, out.name)
    assert not out.exists(), f"{out} exists after a kill mid-write"
    assert temps(out.parent), "the kill did not land mid-write (no temporary file of the dead process)"
    run_ok(args)
    assert out.is_file() and not temps(out.parent)


def test_calibrate_kv(tiny, text, tmp_path):
    out = tmp_path / "kv.gguf"
    args = ["calibrate", "kv", str(tiny), "-o", str(out), "--text", str(text), "--samples", "2", "--seq-len", "32",
            "--bits", "4", "-q"]
    _killed_then_rerun(args, out, stop_at=3)
    from ggml_ext.kvquant.calibration import KVCalibration
    assert KVCalibration.load(out).n_layers == cs.LAYERS


def test_calibrate_dec(tiny, text, tmp_path):
    from ggml_ext.converters import convert
    base = tmp_path / "base.q4_0.gguf"
    convert(tiny, base, "q4_0")
    out = tmp_path / "dec.gguf"
    args = ["calibrate", "dec", str(base), "--hf", str(tiny), "-o", str(out), "--text", str(text), "--samples", "2",
            "--seq-len", "32"]
    _killed_then_rerun(args, out, stop_at=3)
    from ggml_ext.qdec.calibration import load
    assert load(out, base).linears


def test_convert_anyprec(tiny, text, tmp_path):
    out = tmp_path / "apq.gguf"
    args = ["convert", str(tiny), "-o", str(out), "--method", "anyprec", "--bits", "3-4", "--calib", str(text),
            "--calib-samples", "2", "--calib-seq-len", "32", "-q", "-t", "1"]
    _killed_then_rerun(args, out, stop_at=4)
    from ggml_ext.anyprec.extract import open_file
    assert open_file(out).matrices


def test_calibrate_stats_resumes(tiny, text, tmp_path):
    """stats writes one file per layer and resumes: killed before its second layer file is renamed into place,
    the folder holds whole files only (the manifest says which layers are done), and the rerun gives the
    uninterrupted run's files."""
    out = tmp_path / "stats"
    args = ["calibrate", "stats", str(tiny), "-o", str(out), "--text", str(text), "--samples", "2", "--seq-len", "32",
            "--collect", "hessian", "-q"]
    # renames: manifest (created), layer-000, manifest, layer-001 <- killed here
    run_killed(args, stop_at=4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layers_done"] == [0]
    from safetensors.numpy import load_file
    assert load_file(str(out / "layer-000.safetensors"))
    assert not (out / "layer-001.safetensors").exists()
    run_ok(args)
    assert not temps(out)
    whole = tmp_path / "whole"
    run_ok([*args[:4], str(whole), *args[5:]])
    for f in ("layer-000.safetensors", "layer-001.safetensors"):
        assert (out / f).read_bytes() == (whole / f).read_bytes(), f


def test_compare_resumes(tiny, text, tmp_path):
    """compare keeps a manifest of the steps done; killed while writing its float reference, every file under
    a final name is whole (the manifest parses, each GGUF reads), and the rerun completes the report."""
    out = tmp_path / "cmp"
    args = ["compare", str(tiny), "-o", str(out), "--formats", "q8_0", "--calib", str(text), "--eval", str(text),
            "-c", "128", "--chunks", "2", "--imatrix-chunks", "1", "--upstream-bin", "ours", "-t", "1", "-q"]
    run_killed(args, stop_at=5)  # the 5th tensor of the float reference it converts first
    assert temps(out), "the kill did not land mid-write"
    for f in out.rglob("*"):
        if f.name.endswith(".tmp") or not f.is_file():
            continue
        if f.suffix == ".json":
            json.loads(f.read_text())
        elif f.suffix == ".gguf":
            read_gguf(f)
    run_ok(args)
    assert (out / "results.csv").is_file() and not temps(out)


def test_a_dead_writers_nested_temporary_files_go_with_its_own(tmp_path):
    """A writer handed a temporary path (_atomic.output_path) names its temporary file after that path:
    killed, it leaves `.T.<host>.<pid>.<r>.tmp` and `..T.<host>.<pid>.<r>.tmp.<host>.<pid>.<r2>.tmp`; the next
    write to T removes both (the second was left forever: found by test_compare_resumes)."""
    from ggml_ext import _atomic
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "T.gguf"
    outer = tmp_path / f".{target.name}.{_atomic._HOST}.{dead.pid}.abc123.tmp"
    inner = tmp_path / f".{outer.name}.{_atomic._HOST}.{dead.pid}.def456.tmp"
    live = tmp_path / f".{outer.name}.{_atomic._HOST}.{os.getpid()}.ghi789.tmp"
    for f in (outer, inner, live):
        f.write_bytes(b"partial")
    assert sorted(_atomic.remove_stale_temps(target)) == sorted([outer, inner])
    assert live.exists()
