"""One format registry: ggml_ext/include/ggml-ext-types.def, the library's table built from it,
and Python's view (ggml_ext.formats) agree; the tables that used to be written by hand derive
from it; `ggml-ext info --types` prints it."""
from __future__ import annotations

import ctypes
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ggml_ext import _locate, formats, quants

REPO = Path(__file__).resolve().parents[2]
DEF = REPO / "ggml_ext" / "include" / "ggml-ext-types.def"
# The implementations ggml_ext_dispatched_kernel can name (as tests/runtime/test_build_info.py).
KERNELS = {"generic", "avx2", "avx512", "avx512-vnni", "neon-dotprod", "neon-i8mm", "sve256-i8mm", "neon"}


def _def_rows():
    return formats.parse_def(DEF.read_text())


def test_the_def_holds_the_restored_ids_and_the_own_range():
    rows, (first, last) = _def_rows()
    assert [(t.name, t.id) for t in rows] == [("Q4_0_4_4", 31), ("Q4_0_4_8", 32), ("Q4_0_8_8", 33),
                                              ("IQ4_NL_4_4", 36), ("IQ4_NL_4_8", 37), ("IQ4_NL_8_8", 38),
                                              ("CB2", 100), ("CB3", 101), ("APQ", 102),
                                              ("NUQ4", 103), ("NUQ3", 104), ("NUQ2", 105)]
    # the interleaved rows come in groups (no row-wise functions), the codebook rows stand alone, the
    # any-precision planes span the whole matrix (no row-wise functions either), the KV cache blocks
    # stand alone
    assert [t.rowwise for t in rows] == [False] * 6 + [True] * 2 + [False] + [True] * 3
    assert (first, last) == (100, 119)
    assert len({t.id for t in rows}) == len(rows) and len({t.name for t in rows}) == len(rows)
    for t in rows:  # restored ids sit below the own range, new ones inside it
        assert t.id < first or first <= t.id <= last, t
        assert t.blck_size > 0 and t.type_size > 0 and t.row_group >= 1


def test_python_view_is_the_library_table_and_equals_the_def():
    """formats.ext_types() comes from the library (ggml_ext_type_info_at); it equals the .def read as text."""
    assert formats._library_or_none() is not None, "the test needs the built library"
    rows, rng = _def_rows()
    assert list(formats.ext_types()) == rows
    assert formats.own_id_range() == rng


def test_library_answers_from_the_same_table():
    """ggml's own trait table (generated from the .def by patch 0100) and ggml-ext's queries agree with each row."""
    lib = ctypes.CDLL(str(_locate.library("ggml-base")), mode=ctypes.RTLD_GLOBAL)
    lib.ggml_type_name.restype, lib.ggml_type_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    lib.ggml_blck_size.restype, lib.ggml_blck_size.argtypes = ctypes.c_int64, [ctypes.c_int]
    lib.ggml_type_size.restype, lib.ggml_type_size.argtypes = ctypes.c_size_t, [ctypes.c_int]
    lib.ggml_ext_type_row_group.restype, lib.ggml_ext_type_row_group.argtypes = ctypes.c_int, [ctypes.c_int]
    lib.ggml_ext_is_type.restype, lib.ggml_ext_is_type.argtypes = ctypes.c_bool, [ctypes.c_int]
    lib.ggml_ext_type_info_by_id.restype = ctypes.POINTER(formats._Info)
    lib.ggml_ext_type_info_by_id.argtypes = [ctypes.c_int]
    lib.ggml_ext_type_info_at.restype = ctypes.POINTER(formats._Info)
    lib.ggml_ext_type_info_at.argtypes = [ctypes.c_int]
    rows, _ = _def_rows()
    assert lib.ggml_ext_type_count() == len(rows)
    assert not lib.ggml_ext_type_info_at(len(rows)) and not lib.ggml_ext_type_info_at(-1)
    for t in rows:
        assert lib.ggml_type_name(t.id).decode() == t.ggml_name
        assert lib.ggml_blck_size(t.id) == t.blck_size and lib.ggml_type_size(t.id) == t.type_size
        assert lib.ggml_ext_type_row_group(t.id) == t.row_group and lib.ggml_ext_is_type(t.id)
        r = lib.ggml_ext_type_info_by_id(t.id).contents
        assert (r.name.decode(), r.id, r.layout, r.base_name.decode(), r.vec_dot_type) == \
               (t.name, t.id, t.layout, t.base_name, t.vec_dot_type)
        assert r.rowwise == t.rowwise
        if t.rowwise:
            assert t.row_group == 1 and r.shape_rule.decode() == "rows stand alone: any row count"
        elif t.family == "anyprec":
            assert t.row_group == 1 and "any row count" in r.shape_rule.decode()
        else:
            assert r.shape_rule.decode().endswith(f"divisible by {t.row_group}")
        for gemm in (False, True):
            assert formats.dispatched_kernel(t.id, gemm) in KERNELS
    for other in (0, 2, 8, 20, 34, 39, 42, 43, 99, 106, 119, -1, 10**6):
        assert not lib.ggml_ext_is_type(other) and not lib.ggml_ext_type_info_by_id(other)
        assert lib.ggml_ext_type_row_group(other) == 0
        assert formats.dispatched_kernel(other, False) is None


def test_stock_types_from_the_library_match_the_per_id_view():
    stock = formats.stock_types()
    ids = [s.id for s in stock]
    assert ids == sorted(ids) and 4 not in ids and 5 not in ids
    assert not set(ids) & {t.id for t in formats.ext_types()}
    for s in stock:
        t = formats.TYPES[s.id]
        assert (t.name, t.block_size, t.type_size, t.ggml_name, t.kind) == \
               (s.name, s.blck_size, s.type_size, s.ggml_name, "stock"), s
    assert {t.id for t in formats.TYPES.values() if t.kind == "stock"} == set(ids)


def test_hand_kept_tables_derive_from_the_registry():
    from ggml_ext import build_info, convert, repack
    from ggml_ext.converters import policy
    ext = formats.ext_types()
    from ggml_ext.methods.anyprec import planes_type
    for t in ext:
        info = formats.TYPES[t.id]
        assert (info.name, info.block_size, info.type_size, info.row_group, info.ggml_name, info.kind) == \
               (t.name, t.blck_size, t.type_size, t.row_group, t.ggml_name,
                "legacy" if t.id < formats.EXT_ID_MIN else "ext")
        if t.family == "anyprec":  # written by --method anyprec (its planes), not a --type
            assert planes_type(t.layout) == t.name and t.name.lower() not in convert.TYPES
            continue
        if t.family == "kvquant":  # KV cache types (-ctv nuq4), never a weight's --type
            assert t.name.lower() not in convert.TYPES and t.name not in policy.BLOCK
            continue
        assert policy.BLOCK[t.name] == t.blck_size
        assert t.name.lower() in convert.TYPES and policy.OUTPUT_TYPES[t.name.lower()] == t.name
        if t.family == "interleaved4":
            assert policy.INTERLEAVED_ROWS[t.name] == t.row_group
            assert build_info.INTERLEAVED_TYPES[t.id] == t.name
        else:  # codebooks: own ids, rows alone, produced by ggml_quantize_chunk
            assert t.family == "codebooks" and t.name not in policy.INTERLEAVED_ROWS
            assert quants.CODEBOOKS[t.name] == t.layout
    assert quants.INTERLEAVED == {t.name: t.layout for t in ext if t.base_name == "Q4_0"}
    assert quants.INTERLEAVED_IQ4_NL == {t.name: t.layout for t in ext if t.base_name == "IQ4_NL"}
    assert repack.Q4_0_LAYOUTS == {"4x4": "Q4_0_4_4", "4x8": "Q4_0_4_8", "8x8": "Q4_0_8_8"}
    assert repack.IQ4_LAYOUTS == {"4x4": "IQ4_NL_4_4", "4x8": "IQ4_NL_4_8", "8x8": "IQ4_NL_8_8"}
    assert (formats.EXT_ID_MIN, formats.EXT_ID_MAX) == formats.own_id_range()
    assert "31-33 and 36-38" in formats.describe_id(77)


# Hand-written id ranges of our types in C: what the registry replaced ("type >= 31 && type <= 33", "type - 36").
_C_RANGE = re.compile(r"\btype\)?\s*(?:[<>]=?|==|-)\s*(?:31|32|33|36|37|38)\b")


def test_no_hand_written_id_ranges_in_c():
    hits = []
    for p in sorted((REPO / "ggml_ext").rglob("*")):
        if p.suffix in {".c", ".h", ".cpp", ".patch"}:
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if _C_RANGE.search(line):
                    hits.append(f"{p.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def _info(*args):
    return subprocess.run([sys.executable, "-m", "ggml_ext.cli", "info", *args], capture_output=True, text=True,
                          timeout=120)


def test_info_types_json_lists_every_type_truthfully():
    proc = _info("--types", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert set(ids) == {s.id for s in formats.stock_types()} | {t.id for t in formats.ext_types()}
    by_id = {r["id"]: r for r in rows}
    for r in rows:
        assert r["bits_per_weight"] == pytest.approx(r["bytes"] * 8 / r["block"], abs=1e-4)
    q4 = by_id[2]
    assert (q4["name"], q4["block"], q4["bytes"], q4["bits_per_weight"], q4["stock_readable"], q4["kernels"]) == \
           ("Q4_0", 32, 18, 4.5, True, None)
    assert by_id[0]["name"] == "F32" and by_id[0]["bits_per_weight"] == 32
    for t in formats.ext_types():
        r = by_id[t.id]
        assert (r["name"], r["block"], r["bytes"], r["stock_readable"], r["family"], r["base"], r["row_group"],
                r["origin"]) == (t.name, t.blck_size, t.type_size, False, t.family, t.base_name, t.row_group,
                                 "restored" if t.family == "interleaved4" else "ggml-ext")
        assert r["kernels"] == {"arch": platform.machine(), "gemv": formats.dispatched_kernel(t.id, False),
                                "gemm": formats.dispatched_kernel(t.id, True)}
        assert {r["kernels"]["gemv"], r["kernels"]["gemm"]} <= KERNELS


def test_info_types_text_has_a_line_per_type():
    proc = _info("--types")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["id", "name"]
    names = [ln.split()[1] for ln in lines[1:]]
    assert names == [r["name"] for r in formats.table()]
    q = next(ln for ln in lines if ln.split()[1] == "Q4_0_8_8")
    k = f"{formats.dispatched_kernel(33, False)} / {formats.dispatched_kernel(33, True)}"
    assert q.split()[:6] == ["33", "Q4_0_8_8", "32", "18", "4.500", "no"] and q.endswith(k)
