"""libFuzzer + ASan/UBSan on llama.cpp's C/C++ GGUF loading (tests/fuzz/fuzz_gguf_c.py, tests/c/sanitizer/).

* every committed fuzz input replays through its C harness without a report: the reader's seeds and
  the regressions through fuzz_gguf and fuzz_llama_vocab; the committed seeds of ggml-ext's own readers
  (tests/fuzz/kv_calib_seeds, qdec_seeds, ext_tensor_seeds) and their regressions through fuzz_kv_calib
  (KV-calibration side file), fuzz_qdec (QDEC side file) and fuzz_ext_tensors (CB2/CB3, APQ with its
  tables, interleaved: load and validate);
* short smoke runs of each target from its seed corpus;
* a sanitizer build of tests/c/sanitizer/load_gguf_model.c (load with check_tensors, decode one
  token) over a subset of the hostile files of test_reliability_files.py: refused or loaded,
  never a sanitizer report or a signal (the full set: `fuzz_gguf_c.py hostile`);
Bugs found and fixed: docs/RELIABILITY.md (patches 0930, 0932); their inputs are in tests/fuzz/regressions/.

The sanitizer build needs a clang that links libFuzzer + ASan/UBSan (scripts/find_clang.py takes
the newest installed; `make system-deps` installs Debian's clang + libclang-rt-dev when none does);
it is cached under ~/.cache/ggml-ext/sanitizer, rebuilt through ccache when a patch or
source changes (a cold build without ccache takes well over 10 minutes on 2 cores).
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "fuzz" / "fuzz_gguf_c.py"
FUZZ_DIR = REPO / "tests" / "fuzz"
SMOKE_SECONDS = {"fuzz_gguf": 20, "fuzz_llama_vocab": 15, "fuzz_kv_calib": 10, "fuzz_qdec": 10, "fuzz_ext_tensors": 10}
HOSTILE_SUBSET = 4          # every 4th hostile file in make test; all of them in the script


def _script():
    spec = importlib.util.spec_from_file_location("fuzz_gguf_c", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_gguf_c"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fz():
    mod = _script()
    try:
        mod.find_clang()  # one that links -fsanitize=fuzzer,address,undefined
    except SystemExit as e:
        pytest.skip(str(e))
    mod.build()
    return mod


@pytest.mark.parametrize("target", list(SMOKE_SECONDS))
def test_committed_inputs_replay_clean(fz, target):
    exe = fz.build(target) / target
    files = fz.committed_inputs(target)
    assert files
    r = subprocess.run([str(exe), "-runs=1", *map(str, files)], capture_output=True, text=True, errors="replace",
                       env=fz.sanitizer_env(), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert len(re.findall(r"^Running: ", r.stderr, re.M)) == len(files)


@pytest.mark.parametrize("target", list(SMOKE_SECONDS))
def test_fuzz_smoke(fz, target, tmp_path):
    res = fz.run(target, SMOKE_SECONDS[target], None, [], tmp_path)
    log = Path(res["log"]).read_text()
    assert not res["crashes"] and res["returncode"] == 0, (
        f"libFuzzer found a crash in {target} ({res['crashes']} in {res['artifacts']}): minimise it "
        f"(-minimize_crash=1), fix it, add it to tests/fuzz/regressions/\n{log[-4000:]}")
    print(f"\n{target}: {res['execs']} execs in {res['seconds']} s ({res['exec_per_s']}/s), cov {res['cov']}, "
          f"corpus {res['seeds']} -> {res['corpus']}, 0 crashes")
    assert res["execs"] > 100 and res["cov"] and res["corpus"] >= res["seeds"]


def test_hostile_files_under_sanitizers(fz):
    pytest.importorskip("gguf")
    res = fz.hostile(HOSTILE_SUBSET, 2)
    print(f"\nload_gguf_model (ASan/UBSan): {res['files']} files in {res['seconds']} s, {res['refused']} refused, "
          f"{res['loaded']} loaded, known failures {res['known']}")
    assert res["files"] >= 50
    assert not res["bad"], "\n".join(f"--- {k}: {v['verdict']} rc={v['rc']}\n{v['tail']}" for k, v in res["bad"].items())
    assert res["loaded"] >= 1          # the valid tiny model is among them and decodes


def test_valid_model_decodes_under_sanitizers(fz, tmp_path):
    """The loader program itself works: the valid tiny model loads, validates and decodes."""
    pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO / "tests" / "reliability"))
    import test_reliability_files as rf
    model = tmp_path / "tiny.gguf"
    model.write_bytes(rf.tiny_model(tmp_path / "t.gguf"))
    exe = fz.build("load_gguf_model") / "load_gguf_model"
    r = subprocess.run([str(exe), str(model)], capture_output=True, text=True, errors="replace",
                       env=fz.sanitizer_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"ok, \d+ tokens decoded, logit sum -?[0-9]", r.stdout), r.stdout
