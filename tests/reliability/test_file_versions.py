"""Versions and declared facts, checked when a file is opened (ggml_ext/src/llama/file_checks.c and
python/ggml_ext/formats/versions.py).

A tiny llama converted with ``--method anyprec`` (3..8 bits), then rewritten with one key changed:

* a ggml_ext.*version key above this build's (format, anyprec, ooc, codebook tables), of a format this
  build does not know, below 1, or not an integer;
* any-precision seed / parent bits that contradict the APQ tensors (parent 2 or 200, seed 0, seed 4
  where the tables are those of seed 3);
* side files (KV calibration, QDEC) of a newer version.

Each is refused by our llama-cli (a clear message naming the file, exit status 1..127, no signal), by
``ggml-ext info``, by ``ggml-ext anyprec extract`` where it reads the file, and by the side-file readers
(Python and C) with the words "written by a newer ggml-ext (version N); this build reads M".
"""
from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import convert_support as cs
from ggml_ext import tools
from ggml_ext.formats import versions
from ggml_ext.gguf import GGUFWriter, read_gguf

NEWER = "written by a newer ggml-ext (version {n}); this build reads {m}"


@pytest.fixture(scope="module")
def apq(tmp_path_factory) -> Path:
    from ggml_ext.converters import convert
    out = tmp_path_factory.mktemp("apq") / "tiny-apq.gguf"
    convert(cs.tiny("llama"), out, method="anyprec", method_options={"fisher": False, "bits": "3-8"})
    return out


def rewrite(src: Path, dst: Path, set_kv: dict | None = None, drop: tuple = ()) -> Path:
    """``src`` with keys set (key -> (GGUF type, value)) or dropped, tensors as they are."""
    g = read_gguf(src)
    data = cs.read_tensor_bytes(src)
    w = GGUFWriter(dst, force=True)
    set_kv = dict(set_kv or {})
    for k, v in g.kv.items():
        if k in drop:
            continue
        if k in set_kv:
            w.add(k, *set_kv.pop(k))
        else:
            w.add(k, g.kv_types[k], v)
    for k, (vt, v) in set_kv.items():
        w.add(k, vt, v)
    for t in g.tensors:
        w.add_tensor_info(t.name, t.shape, t.type_id, t.nbytes)
    with w:
        for t in g.tensors:
            w.write_tensor(np.frombuffer(data[t.name][2], np.uint8))
    return dst


def llama_cli(path: Path, *extra: str) -> tuple[int, str]:
    cmd = tools.command("llama-cli", "-m", path, "-p", "hi", "-n", "1", "-st", "-t", "1", "-c", "64",
                        "--no-warmup", "--simple-io", *extra)
    r = subprocess.run(cmd, env=tools.tool_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       errors="replace", timeout=120)
    return r.returncode, r.stdout + r.stderr


def cli(*args: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "ggml_ext.cli", *args], env=tools.tool_env(), capture_output=True,
                       text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def refused(rc: int, log: str, *words: str) -> None:
    assert 0 < rc < 128, f"exit {rc} (a signal or a success, not a refusal):\n{log[-2000:]}"
    for w in words:
        assert w in log, f"{w!r} not in:\n{log[-2000:]}"


CASES = {  # name -> (keys set, words the refusal holds)
    "format-99": ({"ggml_ext.format_version": ("u32", 99)},
                  ("ggml_ext.format_version", NEWER.format(n=99, m=1))),
    "anyprec-99": ({"ggml_ext.anyprec.version": ("u32", 99)},
                   ("ggml_ext.anyprec.version", NEWER.format(n=99, m=1))),
    "ooc-2": ({"ggml_ext.ooc.version": ("u32", 2)}, ("ggml_ext.ooc.version", NEWER.format(n=2, m=1))),
    "codebooks-2": ({"ggml_ext.codebooks.tables_version": ("u32", 2)},
                    ("ggml_ext.codebooks.tables_version", NEWER.format(n=2, m=1))),
    "unknown-format": ({"ggml_ext.lattice.version": ("u32", 1)},
                       ("ggml_ext.lattice.version", "written by a newer ggml-ext (version 1); this build reads none")),
    "format-0": ({"ggml_ext.format_version": ("u32", 0)}, ("ggml_ext.format_version", "version 0 is not one")),
    "format-str": ({"ggml_ext.format_version": ("str", "1")}, ("ggml_ext.format_version", "not a version number")),
    "parent-2": ({"ggml_ext.anyprec.parent_bits": ("u32", 2)},
                 ("ggml_ext.anyprec.parent_bits = 2 contradicts tensor blk.", "8 bitplanes")),
    "parent-200": ({"ggml_ext.anyprec.parent_bits": ("u32", 200)},
                   ("ggml_ext.anyprec.parent_bits is not a precision from 1 to 8 bits",)),
    "seed-0": ({"ggml_ext.anyprec.seed_bits": ("u32", 0)},
               ("ggml_ext.anyprec.seed_bits is not a precision from 1 to 8 bits",)),
    "seed-4": ({"ggml_ext.anyprec.seed_bits": ("u32", 4)},
               ("ggml_ext.anyprec.seed_bits = 4 contradicts tensor blk.", ".apq_tables", "3-bit seed tables")),
}


@pytest.fixture(scope="module")
def case_files(apq, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cases")
    return {name: rewrite(apq, d / f"{name}.gguf", kv) for name, (kv, _) in CASES.items()}


def test_the_file_itself_loads_and_reports(apq):
    rc, log = llama_cli(apq)
    assert rc == 0, log[-2000:]
    rc, log = cli("info", str(apq))
    assert rc == 0, log


@pytest.mark.parametrize("name", sorted(CASES))
def test_llama_cli_refuses(case_files, name):
    rc, log = llama_cli(case_files[name])
    refused(rc, log, str(case_files[name]), *CASES[name][1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_info_refuses(case_files, name):
    rc, log = cli("info", str(case_files[name]))
    refused(rc, log, "error: ", str(case_files[name]), *CASES[name][1])


@pytest.mark.parametrize("name", ["format-99", "anyprec-99", "parent-2", "parent-200", "seed-0", "seed-4"])
def test_anyprec_extract_refuses(case_files, name, tmp_path):
    out = tmp_path / "x.gguf"
    rc, log = cli("anyprec", "extract", str(case_files[name]), "--bits", "4", "-o", str(out))
    refused(rc, log, str(case_files[name]), *CASES[name][1])
    assert not out.exists()


def test_python_and_c_read_the_same_versions():
    from ggml_ext import _locate
    lib = ctypes.CDLL(str(_locate.lib_dir() / "libllama.so"))
    lib.ggml_ext_format_key_version.argtypes = [ctypes.c_char_p]
    lib.ggml_ext_format_key_version.restype = ctypes.c_int
    for key, reads in versions.READS.items():
        assert lib.ggml_ext_format_key_version(key.encode()) == reads, key
    assert lib.ggml_ext_format_key_version(b"ggml_ext.lattice.version") == -1
    # and the writers write what this build reads
    from ggml_ext import quants
    from ggml_ext.kvquant import calibration as kvc
    from ggml_ext.methods import anyprec, ooc
    from ggml_ext.qdec import calibration as dc
    assert versions.READS["ggml_ext.format_version"] == quants.format_version()
    assert versions.READS["ggml_ext.anyprec.version"] == anyprec.FORMAT_VERSION
    assert versions.READS["ggml_ext.ooc.version"] == ooc.FORMAT_VERSION
    assert versions.READS["kvquant.format_version"] == kvc.FORMAT_VERSION
    assert versions.READS["qdec.format_version"] == dc.FORMAT_VERSION
    from ggml_ext import codebooks
    assert versions.READS["ggml_ext.codebooks.tables_version"] == codebooks.tables_version()


# ---------------------------------------------------------------- side files


def _side_file(path: Path, kind: str, version) -> Path:
    """A side file's header as the readers check it first: general.type and its version key."""
    w = GGUFWriter(path, force=True)
    w.add("general.type", "str", kind)
    w.add(f"{kind}.format_version", *version)
    w.add_tensor_info(f"{kind}.x", (4,), 0, 16)
    with w:
        w.write_tensor(np.zeros(4, np.float32))
    return path


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory) -> Path:
    from ggml_ext.converters import convert
    out = tmp_path_factory.mktemp("f32") / "tiny-f32.gguf"
    # one head of 64: a NUQ cache needs a head dim that its 64-value blocks divide
    convert(cs.tiny("llama", num_attention_heads=1, num_key_value_heads=1), out, "f32")
    return out


@pytest.mark.parametrize("version,words", [(("u32", 2), NEWER.format(n=2, m=1)),
                                           (("u32", 0), "version 0 is not one"),
                                           (("str", "x"), "not a version number")])
def test_kv_calibration_of_a_newer_version_is_refused(f32_model, tmp_path, version, words):
    side = _side_file(tmp_path / "kv.gguf", "kvquant", version)
    from ggml_ext.kvquant.calibration import KVCalibration, KVCalibrationError
    with pytest.raises(KVCalibrationError, match="kvquant.format_version") as e:
        KVCalibration.load(side)
    assert words in str(e.value) and str(side) in str(e.value)
    rc, log = llama_cli(f32_model, "-fa", "on", "-ctk", "f16", "-ctv", "nuq4", "--kv-calib", str(side))
    refused(rc, log, str(side), "kvquant.format_version", words)


@pytest.mark.parametrize("version,words", [(("u32", 3), NEWER.format(n=3, m=1)),
                                           (("i32", -1), "version -1 is not one")])
def test_qdec_side_file_of_a_newer_version_is_refused(f32_model, tmp_path, version, words):
    side = _side_file(tmp_path / "dec.gguf", "qdec", version)
    from ggml_ext.qdec.calibration import DecError, load
    with pytest.raises(DecError, match="qdec.format_version") as e:
        load(side)
    assert words in str(e.value) and str(side) in str(e.value)
    rc, log = llama_cli(f32_model, "--dec", str(side))
    refused(rc, log, str(side), "qdec.format_version", words)
