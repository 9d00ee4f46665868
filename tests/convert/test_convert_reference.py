"""Against the pinned llama.cpp's own convert_hf_to_gguf.py (run as a reference only).

On the default model at q8_0: the same tensors (names, shapes, types, and in fact the
same bytes), and the same metadata except for the differences docs/CONVERT.md
explains: ``general.name``/``general.size_label`` (naming heuristics) and
``tokenizer.ggml.pre`` ("gpt-2" here, from the structure of this folder's
tokenizer.json; the reference's check-text hash says "smollm", whose digit splitting
this tokenizer.json does not do). Our extra keys: ``ggml_ext.*`` and
``tokenizer.ggml.add_eos_token``.
"""
from __future__ import annotations

import array
import os
import subprocess
import sys
from pathlib import Path

import pytest

import convert_support as cs

EXPECTED_DIFFERENT = {"general.name", "general.size_label", "tokenizer.ggml.pre"}
OUR_EXTRA = {"ggml_ext.format_version", "ggml_ext.source_hash", "tokenizer.ggml.add_eos_token"}


def _tree() -> Path:
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(repo / "scripts" / "fetch_llama_cpp.py"), "tree"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip().splitlines()[-1])


def run_reference(model: Path, out: Path, outtype: str) -> None:
    tree = _tree()
    env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"), NO_LOCAL_GGUF="1")
    r = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(model), "--outfile", str(out),
                        "--outtype", outtype], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def _plain(v):
    return list(v) if isinstance(v, (list, array.array)) else v


@pytest.fixture(scope="module")
def reference_q8(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "ref.q8_0.gguf"
    run_reference(cs.default_hf(), out, "q8_0")
    return out


def test_same_tensors_as_convert_hf_to_gguf(reference_q8):
    ours = cs.read_tensor_bytes(cs.default_converted("q8_0"))
    ref = cs.read_tensor_bytes(reference_q8)
    assert ours.keys() == ref.keys()
    for name in ours:
        assert ours[name][:2] == ref[name][:2], f"{name}: {ours[name][:2]} vs reference {ref[name][:2]}"
    assert all(ours[n][2] == ref[n][2] for n in ours), "identical bytes (ggml's Q8_0 and gguf-py's agree)"


def test_same_metadata_as_convert_hf_to_gguf(reference_q8):
    from ggml_ext.gguf import read_gguf
    ours, ref = read_gguf(cs.default_converted("q8_0")), read_gguf(reference_q8)
    assert set(ours.kv) - set(ref.kv) == OUR_EXTRA
    assert set(ref.kv) - set(ours.kv) <= {"general.size_label"}
    for key in set(ref.kv) & set(ours.kv) - EXPECTED_DIFFERENT:
        assert ours.kv_types[key] == ref.kv_types[key], key
        assert _plain(ours.kv[key]) == _plain(ref.kv[key]), key
    assert (ours.kv["tokenizer.ggml.pre"], ref.kv["tokenizer.ggml.pre"]) == ("gpt-2", "smollm")
