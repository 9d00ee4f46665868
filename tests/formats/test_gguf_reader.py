"""The GGUF reader, the ggml type table and `ggml-ext info`, on valid and hostile files.

Valid files come from the `gguf` package's GGUFWriter; hostile ones are built
byte by byte with `struct`. Every hostile input must raise GGUFError (or, for
random corruption, parse) quickly and with bounded memory, never raise another
exception type and never hang.
"""
from __future__ import annotations

import ast
import contextlib
import json
import operator
import os
import random
import re
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from ggml_ext import formats
from ggml_ext.gguf import GGUFError, GGUFFile, parse_gguf_bytes, read_gguf
from ggml_ext.info import format_info, info_dict

REPO = Path(__file__).resolve().parents[2]
PYDIR = REPO / "python"
# A hang guard, not a speed claim: a hostile count the reader trusted would loop for hours;
# a real parse of these files takes milliseconds on any machine, so 30 s never fires by chance.
HANG_SECONDS = 30.0
PINNED_COMMIT = "0c1e57098"

# ---------------------------------------------------------------- helpers


@contextlib.contextmanager
def time_bound(seconds: float = HANG_SECONDS):
    """Fail (instead of hanging) if the body runs longer than `seconds`."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"case ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def parse_or_error(data: bytes) -> GGUFFile | GGUFError:
    """Parse within the time bound; GGUFError is returned, anything else propagates."""
    with time_bound():
        try:
            return parse_gguf_bytes(data)
        except GGUFError as e:
            return e


def expect_error(data: bytes, *fragments: str) -> GGUFError:
    r = parse_or_error(data)
    assert isinstance(r, GGUFError), f"expected GGUFError, file parsed: {r}"
    msg = str(r).lower()
    for frag in fragments:
        assert frag.lower() in msg, f"{frag!r} not in {str(r)!r}"
    assert "offset" in msg or r.offset is None
    return r


# GGUF value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_raw(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<i", vtype) + payload


def kv_u32(key: str, v: int) -> bytes:
    return kv_raw(key, U32, struct.pack("<I", v))


def kv_str(key: str, v: str) -> bytes:
    return kv_raw(key, STR, gstr(v))


def arr(etype: int, n: int, body: bytes) -> bytes:
    """An array value (without the outer ARR type tag)."""
    return struct.pack("<iQ", etype, n) + body


def kv_arr(key: str, etype: int, n: int, body: bytes) -> bytes:
    return kv_raw(key, ARR, arr(etype, n, body))


def tinfo(name: str | bytes, dims: list[int], type_id: int, offset: int, n_dims: int | None = None) -> bytes:
    nd = len(dims) if n_dims is None else n_dims
    return (gstr(name) + struct.pack("<I", nd) + b"".join(struct.pack("<q", d) for d in dims)
            + struct.pack("<iQ", type_id, offset))


def build(kvs: list[bytes] = (), infos: list[bytes] = (), data: bytes = b"", *, version: int = 3,
          n_tensors: int | None = None, n_kv: int | None = None, alignment: int = 32,
          magic: bytes = b"GGUF") -> bytes:
    head = magic + struct.pack("<I", version)
    head += struct.pack("<QQ", len(infos) if n_tensors is None else n_tensors,
                        len(kvs) if n_kv is None else n_kv)
    meta = head + b"".join(kvs) + b"".join(infos)
    if infos:
        meta += b"\0" * (-len(meta) % alignment)
    return meta + data


def one_tensor(type_id: int = 0, dims: list[int] = (8, 4), offset: int = 0, data_len: int | None = None,
               kvs: list[bytes] = (), alignment: int = 32, name: str = "w") -> bytes:
    """A file with one tensor; data_len defaults to the tensor's true size (0 if unknown)."""
    if data_len is None:
        try:
            data_len = formats.tensor_nbytes(type_id, dims)
        except ValueError:
            data_len = 64
    return build(list(kvs), [tinfo(name, list(dims), type_id, offset)], b"\x11" * data_len, alignment=alignment)


# ---------------------------------------------------------------- valid files from GGUFWriter


def write_model(path: Path, *, extra=None) -> Path:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-test")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_file_type(7)
    w.add_quantization_version(2)
    w.add_uint32("ggml_ext.format_version", 1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(100)])
    w.add_token_scores([float(i) for i in range(100)])
    w.add_bool("test.flag", True)
    w.add_float64("test.f64", 1.5)
    w.add_int64("test.i64", -7)
    w.add_array("test.nested", [[1, 2, 3], [4]])
    if extra:
        extra(w)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((100, 64)).astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    # Q8_0: 8 rows of 64 weights = 2 blocks of 34 bytes per row
    q = rng.integers(0, 255, size=(8, 2 * 34), dtype=np.uint8)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def model_bytes(model_file) -> bytes:
    return model_file.read_bytes()


def test_valid_writer_file(model_file):
    g = read_gguf(model_file)
    assert g.version == 3
    assert g.alignment == 32
    assert g.data_offset % 32 == 0
    assert g.file_size == model_file.stat().st_size
    assert g.kv["general.architecture"] == "llama"
    assert g.kv["general.name"] == "tiny-test"
    assert g.kv["llama.block_count"] == 2
    assert g.kv_types["llama.block_count"] == "u32"
    assert g.kv["test.flag"] is True
    assert g.kv["test.f64"] == 1.5
    assert g.kv["test.i64"] == -7
    assert list(g.kv["tokenizer.ggml.tokens"])[:2] == ["tok0", "tok1"]
    assert g.kv_types["tokenizer.ggml.tokens"] == "array[str]"
    assert list(g.kv["tokenizer.ggml.scores"])[5] == 5.0
    assert [list(x) for x in g.kv["test.nested"]] == [[1, 2, 3], [4]]
    assert g.kv_types["test.nested"].startswith("array[array[")
    assert any("nested" in w for w in g.warnings)

    names = [t.name for t in g.tensors]
    assert names == ["token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight", "output_norm.weight"]
    emb = g.tensor("token_embd.weight")
    assert emb.shape == (64, 100) and emb.type_name == "F16" and emb.nbytes == 64 * 100 * 2
    q = g.tensor("blk.0.attn_q.weight")
    assert q.shape == (64, 8) and q.type_id == 8 and q.type_name == "Q8_0" and q.nbytes == 8 * 2 * 34
    for t in g.tensors:
        assert t.file_offset == g.data_offset + t.offset
        assert t.file_offset + t.nbytes <= g.file_size
    # gguf-py lays tensors out the way llama.cpp expects: no layout warning
    assert not any("llama.cpp expects" in w for w in g.warnings)

    hist = g.type_histogram()
    assert set(hist) == {"F16", "F32", "Q8_0"}
    assert hist["F32"].count == 2 and hist["F32"].nbytes == 512 and hist["F32"].bits_per_weight == 32.0
    assert hist["Q8_0"].bits_per_weight == 8.5
    assert list(hist)[0] == "F16"  # largest first
    total_b = 64 * 100 * 2 + 2 * 64 * 4 + 8 * 68
    total_w = 6400 + 128 + 512
    assert g.bits_per_weight() == pytest.approx(total_b * 8 / total_w)


def test_handmade_valid_variants():
    # version 2, custom alignment, interleaved types with good row counts, scalar tensor, every scalar type
    scalars = [
        kv_raw("a.u8", U8, b"\xff"), kv_raw("a.i8", I8, b"\xff"), kv_raw("a.u16", U16, struct.pack("<H", 65535)),
        kv_raw("a.i16", I16, struct.pack("<h", -2)), kv_raw("a.i32", I32, struct.pack("<i", -3)),
        kv_raw("a.f32", F32, struct.pack("<f", 0.5)), kv_raw("a.bool", BOOL, b"\x02"),
        kv_raw("a.u64", U64, struct.pack("<Q", 2**64 - 1)), kv_raw("a.f64", F64, struct.pack("<d", -0.25)),
        kv_arr("a.bools", BOOL, 3, b"\x00\x01\x05"), kv_arr("a.empty", STR, 0, b""),
        kv_arr("a.i16s", I16, 2, struct.pack("<hh", -1, 7)),
        kv_u32("general.alignment", 64),
    ]
    sizes = [formats.tensor_nbytes(31, [64, 4]), formats.tensor_nbytes(38, [32, 8]), 4]
    infos = [tinfo("a", [64, 4], 31, 0), tinfo("b", [32, 8], 38, 192), tinfo("s", [], 0, 384)]
    data = b"\x01" * 388
    for version in (2, 3):
        g = parse_gguf_bytes(build(scalars, infos, data, version=version, alignment=64))
        assert g.version == version and g.alignment == 64 and g.data_offset % 64 == 0
        assert g.kv["a.u8"] == 255 and g.kv["a.i8"] == -1 and g.kv["a.u16"] == 65535
        assert g.kv["a.bool"] is True and g.kv["a.u64"] == 2**64 - 1 and g.kv["a.f64"] == -0.25
        assert g.kv["a.bools"] == [False, True, True] and list(g.kv["a.empty"]) == []
        assert list(g.kv["a.i16s"]) == [-1, 7]
        assert [t.nbytes for t in g.tensors] == sizes
        assert g.tensors[0].type_name == "Q4_0_4_4" and g.tensors[1].type_name == "IQ4_NL_8_8"
        assert g.tensors[2].shape == () and g.tensors[2].n_elements == 1
        assert not g.warnings
    # no tensors: no padding, data section right after the KVs
    g = parse_gguf_bytes(build([kv_str("general.architecture", "llama")]))
    assert g.tensors == [] and g.data_offset == g.file_size and g.bits_per_weight() == 0.0


def test_layout_llama_cpp_would_refuse_is_a_warning():
    # tensors in reverse order: valid (aligned, in file, disjoint) but not llama.cpp's packing
    f = build([], [tinfo("a", [8], 0, 32), tinfo("b", [8], 0, 0)], b"\0" * 64)
    g = parse_gguf_bytes(f)
    assert any("llama.cpp expects" in w for w in g.warnings)


# ---------------------------------------------------------------- hostile files, hand-built

BIG = 2**63 - 1
HOSTILE: dict[str, tuple[bytes, tuple[str, ...]]] = {}


def hostile(name: str, data: bytes, *fragments: str) -> None:
    assert name not in HOSTILE
    HOSTILE[name] = (data, fragments)


_arch = kv_str("general.architecture", "llama")
hostile("empty", b"", "too short")
hostile("3 bytes", b"GGU", "too short")
hostile("magic only", b"GGUF", "truncated", "version")
hostile("wrong magic", b"GGML" + build()[4:], "bad magic")
hostile("wrong magic binary", b"\x00\xff\x10\x7f" + build()[4:], "bad magic")
hostile("big-endian version", b"GGUF" + struct.pack(">I", 3) + struct.pack(">QQ", 0, 0), "big-endian GGUF not supported")
hostile("big-endian v2", b"GGUF" + struct.pack(">I", 2) + b"\0" * 16, "big-endian GGUF not supported")
hostile("byte-swapped magic", b"FUGG" + struct.pack(">I", 3) + b"\0" * 16, "big-endian GGUF not supported")
hostile("version 0", build(version=0), "version 0")
hostile("version 1", build(version=1), "version 1")
hostile("version 4", build(version=4), "unsupported GGUF version 4")
hostile("version huge", build(version=0xFFFFFFFF), "unsupported GGUF version")
hostile("header truncated", build()[:15], "truncated")
hostile("n_tensors 2**60", build([_arch], n_tensors=2**60), "tensor count")
hostile("n_tensors 2**64-1", build([_arch], n_tensors=2**64 - 1), "tensor count")
hostile("n_tensors 1 no infos", build([_arch], n_tensors=1), "truncated")
hostile("n_kv 2**62", build([_arch], n_kv=2**62), "key/value count")
hostile("n_kv 2**63", build([_arch], n_kv=2**63), "key/value count")
hostile("n_kv one too many", build([_arch, kv_u32("x", 1)], n_kv=3), "truncated")
hostile("key length 2**63", build([struct.pack("<Q", 2**63) + b"k" + struct.pack("<i", U8) + b"\0"]),
        "string length")
hostile("key length 2**64-1", build([struct.pack("<Q", 2**64 - 1) + b"k" * 8]), "string length")
hostile("key length past EOF", build([struct.pack("<Q", 100) + b"abc" + b"\0" * 20]), "string length", "left in the file")
hostile("value string 2**63", build([kv_raw("k", STR, struct.pack("<Q", 2**63) + b"x" * 8)]), "string length")
hostile("value string 2**31", build([kv_raw("k", STR, struct.pack("<Q", 2**31) + b"x" * 8)]), "string length")
hostile("array length 2**62 u8", build([kv_arr("k", U8, 2**62, b"\0" * 16)]), "array length")
hostile("array length 2**64-1 str", build([kv_arr("k", STR, 2**64 - 1, b"\0" * 16)]), "array length")
hostile("array length past EOF u64", build([kv_arr("k", U64, 1000, b"\0" * 16)]), "needs at least")
hostile("array of str past EOF", build([kv_arr("k", STR, 10**6, gstr("a") * 4)]), "needs at least")
hostile("array str element too long", build([kv_arr("k", STR, 2, gstr("a") + struct.pack("<Q", 2**50))]),
        "string length")
hostile("nested array inner huge", build([kv_arr("k", ARR, 1, arr(U32, 2**40, b"\0" * 8))]), "array")
hostile("nested array inner past EOF", build([kv_arr("k", ARR, 2, arr(U32, 1, b"\0" * 4) + arr(U64, 50, b""))]),
        "needs at least")
_deep = arr(U8, 1, b"\x07")
for _ in range(12):
    _deep = arr(ARR, 1, _deep)
hostile("nested arrays 13 deep", build([kv_raw("k", ARR, _deep)]), "nested deeper")
hostile("array element type 99", build([kv_arr("k", 99, 1, b"\0" * 8)]), "invalid array element type")
hostile("value type 13", build([kv_raw("k", 13, b"\0" * 8)]), "invalid value type 13")
hostile("value type -1", build([kv_raw("k", -1, b"\0" * 8)]), "invalid value type -1")
hostile("value truncated", build([kv_raw("k", U64, b"\0\0\0")]), "truncated")
hostile("empty key", build([kv_u32("", 1)]), "empty key")
hostile("duplicate key", build([kv_u32("a.b", 1), kv_u32("a.b", 2)]), "duplicate key")
hostile("alignment 0", one_tensor(kvs=[kv_u32("general.alignment", 0)]), "power of two")
hostile("alignment 48", one_tensor(kvs=[kv_u32("general.alignment", 48)]), "power of two")
hostile("alignment 3", build([kv_u32("general.alignment", 3)]), "power of two")
hostile("alignment u64", one_tensor(kvs=[kv_raw("general.alignment", U64, struct.pack("<Q", 32))]), "must be of type u32")
hostile("alignment str", build([kv_str("general.alignment", "32")]), "must be of type u32")
hostile("alignment 2**31 pushes data past EOF",
        build([kv_u32("general.alignment", 2**31)], [tinfo("w", [8], 0, 0)], b"\0" * 32), "beyond the end")
hostile("tensor offset outside file", one_tensor(offset=2**40), "not within")
hostile("tensor offset 2**64-32", one_tensor(offset=2**64 - 32), "not within")
hostile("tensor offset misaligned", one_tensor(offset=8, data_len=200), "not a multiple of the alignment")
hostile("tensor data past EOF", one_tensor(dims=[8, 4], data_len=100), "not within")
hostile("tensor data 1 byte short", one_tensor(dims=[32, 1], type_id=8, data_len=33), "not within")
hostile("tensors overlap fully", build([], [tinfo("a", [8], 0, 0), tinfo("b", [8], 0, 0)], b"\0" * 64), "overlaps")
hostile("tensors overlap partly", build([], [tinfo("a", [16], 0, 0), tinfo("b", [8], 0, 32)], b"\0" * 96), "overlaps")
hostile("tensors overlap out of order",
        build([], [tinfo("a", [8], 0, 64), tinfo("b", [64], 0, 0)], b"\0" * 256), "overlaps")
for _tid in (99, 250, -1, 43, 120, 2**31 - 1):
    hostile(f"type id {_tid}", one_tensor(type_id=_tid), "unknown ggml type id")
hostile("type id 106 (ggml-ext range)", one_tensor(type_id=106), "ggml-ext type id 106, not known to this version")
hostile("type id 119 (ggml-ext range, unused)", one_tensor(type_id=119), "ggml-ext type id 119")
for _tid, _name in ((103, "NUQ4"), (104, "NUQ3"), (105, "NUQ2")):
    # KVQuant cache types: valid sizes, but no tensor of a file may have them (llama's loader: patch 0321)
    hostile(f"type id {_tid} ({_name}, KV cache only)", one_tensor(type_id=_tid, dims=[64, 2]),
            f"type {_name} (id {_tid}), a KVQuant KV cache type")
hostile("type id 4 (removed Q4_2)", one_tensor(type_id=4), "removed")
hostile("type id 5 (removed Q4_3)", one_tensor(type_id=5), "removed")
for _tid, _n in ((31, 4), (32, 4), (33, 8), (36, 4), (37, 4), (38, 8)):
    hostile(f"interleaved {_tid} rows 2", one_tensor(type_id=_tid, dims=[32, 2]), "not a multiple of", str(_n))
    hostile(f"interleaved {_tid} 1-D", one_tensor(type_id=_tid, dims=[32]), "row count 1")
    hostile(f"interleaved {_tid} rows {_n + 2}", one_tensor(type_id=_tid, dims=[64, _n + 2]), "interleaves rows")
hostile("interleaved 33 rows 12", one_tensor(type_id=33, dims=[32, 12]), "by 8")
hostile("interleaved 31 ne0 48", one_tensor(type_id=31, dims=[48, 4]), "block size 32")
hostile("Q8_0 row 48", one_tensor(type_id=8, dims=[48, 2]), "block size 32")
hostile("Q4_K row 128", one_tensor(type_id=12, dims=[128]), "block size 256")
hostile("n_dims 5", one_tensor(dims=[2, 2, 2, 2, 2]), "5 dimensions")
hostile("n_dims 2**32-1", build([], [gstr("w") + struct.pack("<I", 2**32 - 1) + b"\0" * 64]), "dimensions")
hostile("zero dim", one_tensor(dims=[8, 0], data_len=64), "must be > 0")
hostile("zero dim first", one_tensor(dims=[0], data_len=64), "must be > 0")
hostile("negative dim", one_tensor(dims=[8, -4], data_len=64), "must be > 0")
hostile("dim product overflow", one_tensor(dims=[2**62, 4], data_len=64), "INT64_MAX")
hostile("dim product overflow 4d", one_tensor(dims=[2**20, 2**20, 2**20, 2**20], data_len=64), "INT64_MAX")
hostile("dims huge but representable", one_tensor(dims=[2**31, 2**31], data_len=64), "not within")
hostile("duplicate tensor names", build([], [tinfo("w", [8], 0, 0), tinfo("w", [8], 0, 32)], b"\0" * 64),
        "duplicate tensor name")
hostile("empty tensor name", build([], [tinfo("", [8], 0, 0)], b"\0" * 32), "empty name")
hostile("tensor name 64 bytes", build([], [tinfo("n" * 64, [8], 0, 0)], b"\0" * 32), "too long")
hostile("tensor name 2**63", build([], [struct.pack("<Q", 2**63) + b"\0" * 40]), "string length")
hostile("tensor info truncated", build([], [tinfo("w", [8, 8], 0, 0)])[:24 + 41 - 5], "truncated")
hostile("data section past EOF", build([], [tinfo("w", [8, 8], 0, 0)])[:24 + 41 + 5], "beyond the end")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_handmade(name):
    data, fragments = HOSTILE[name]
    expect_error(data, *fragments)   # parse_or_error: under the hang guard


@pytest.mark.parametrize("name", ["n_tensors 2**60", "n_kv 2**62", "key length 2**63", "value string 2**63",
                                  "array length 2**62 u8", "array length 2**64-1 str", "array of str past EOF",
                                  "nested array inner huge", "dims huge but representable"])
def test_absurd_sizes_use_bounded_memory(name):
    data, _ = HOSTILE[name]
    tracemalloc.start()
    try:
        expect_error(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{name}: peak {peak} bytes"


def test_hostile_from_disk(tmp_path):
    """The same cases through read_gguf() (the mmap path)."""
    for i, (name, (data, fragments)) in enumerate(HOSTILE.items()):
        p = tmp_path / f"h{i}.gguf"
        p.write_bytes(data)
        with time_bound():
            with pytest.raises(GGUFError) as ei:
                read_gguf(p)
        for frag in fragments:
            assert frag.lower() in str(ei.value).lower(), name


def test_error_names_offset():
    e = expect_error(HOSTILE["n_tensors 2**60"][0])
    assert e.offset == 8 and "byte offset 8" in str(e)
    e = expect_error(HOSTILE["n_kv 2**62"][0])
    assert e.offset == 16
    e = expect_error(HOSTILE["wrong magic"][0])
    assert e.offset == 0
    assert isinstance(e, ValueError)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_gguf(tmp_path / "nope.gguf")
    with pytest.raises((GGUFError, IsADirectoryError)):
        read_gguf(tmp_path)


# ---------------------------------------------------------------- truncation and fuzzing of a real file


def test_truncated_everywhere(model_bytes):
    g = parse_gguf_bytes(model_bytes)
    data_end = max(t.file_offset + t.nbytes for t in g.tensors)
    cuts = list(range(0, g.data_offset + 1)) + list(range(g.data_offset, data_end, 7))
    t0 = time.perf_counter()
    worst = 0.0
    for cut in cuts:
        t1 = time.perf_counter()
        r = parse_or_error(model_bytes[:cut])
        worst = max(worst, time.perf_counter() - t1)
        assert isinstance(r, GGUFError), f"truncated at {cut} of {len(model_bytes)} parsed"
    elapsed = time.perf_counter() - t0
    print(f"\n{len(cuts)} truncations in {elapsed:.2f} s (worst case {worst * 1000:.1f} ms)")


NASTY = [0, 1, 2**31, 2**32 - 1, 2**32, 2**60, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def test_random_corruption(model_bytes):
    """Seeded random damage to the metadata: GGUFError or a clean parse, nothing else, fast."""
    g = parse_gguf_bytes(model_bytes)
    meta_end = g.data_offset
    rng = random.Random(1234)
    trials = 10000
    n_err = n_ok = 0
    worst = 0.0
    t0 = time.perf_counter()
    for trial in range(trials):
        b = bytearray(model_bytes)
        mode = trial % 3
        if mode == 0:      # flip a few random bytes
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(meta_end)] = rng.randrange(256)
        elif mode == 1:    # plant an absurd 64-bit or 32-bit value
            pos = rng.randrange(meta_end - 8)
            v = rng.choice(NASTY)
            if rng.random() < 0.5:
                b[pos:pos + 8] = struct.pack("<Q", v)
            else:
                b[pos:pos + 4] = struct.pack("<I", v & 0xFFFFFFFF)
        else:              # damage and truncate
            b[rng.randrange(meta_end)] ^= 1 << rng.randrange(8)
            del b[rng.randrange(len(b)):]
        t1 = time.perf_counter()
        r = parse_or_error(bytes(b))
        worst = max(worst, time.perf_counter() - t1)
        if isinstance(r, GGUFError):
            n_err += 1
        else:
            n_ok += 1
            assert isinstance(r, GGUFFile)
            r.type_histogram()
            r.bits_per_weight()
            format_info(r, show_tensors=True)       # the info verb copes with whatever parsed
            json.dumps(info_dict(r, show_tensors=True), ensure_ascii=False)
            for t in r.tensors:   # a parse that succeeds must be self-consistent
                assert t.file_offset + t.nbytes <= r.file_size
    elapsed = time.perf_counter() - t0
    print(f"\n{trials} corruptions: {n_err} GGUFError, {n_ok} parsed, {elapsed:.2f} s, "
          f"worst case {worst * 1000:.1f} ms")
    assert n_err > trials // 2


def test_random_corruption_handmade():
    """Same, on a hand-built file with every value type and an interleaved tensor."""
    base = build([_arch, kv_u32("general.alignment", 64), kv_arr("a", ARR, 2, arr(I32, 2, b"\1\0\0\0\2\0\0\0") + arr(STR, 1, gstr("x"))),
                  kv_arr("b", F64, 2, b"\0" * 16), kv_raw("c", BOOL, b"\1")],
                 [tinfo("t0", [64, 4], 31, 0), tinfo("t1", [32, 8], 8, 192)], b"\5" * 512, alignment=64)
    assert isinstance(parse_or_error(base), GGUFFile)
    rng = random.Random(99)
    for _ in range(5000):
        b = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(base) - 512)] = rng.randrange(256)
        r = parse_or_error(bytes(b))
        if isinstance(r, GGUFFile):
            format_info(r, show_tensors=True)
            json.dumps(info_dict(r, show_tensors=True), ensure_ascii=False)


# ---------------------------------------------------------------- ggml type table


def test_type_table_helpers():
    assert formats.type_info(8).name == "Q8_0"
    assert formats.type_info("q4_k").id == 12
    assert formats.row_bytes(8, 64) == 68
    assert formats.row_bytes("Q4_K", 512) == 288
    assert formats.tensor_nbytes(0, [3, 5, 7]) == 3 * 5 * 7 * 4
    assert formats.tensor_nbytes(31, [4096, 4096]) == formats.tensor_nbytes(2, [4096, 4096])
    with pytest.raises(ValueError, match="block size 32"):
        formats.row_bytes(8, 33)
    with pytest.raises(ValueError, match="block size 256"):
        formats.tensor_nbytes(14, [32, 4])
    with pytest.raises(ValueError, match="row count 6 is not a multiple of 8"):
        formats.tensor_nbytes(38, [32, 6])
    with pytest.raises(ValueError, match="ggml-ext type id 106, not known to this version"):
        formats.type_info(106)
    with pytest.raises(ValueError, match="removed"):
        formats.type_info(4)
    with pytest.raises(ValueError, match="unknown ggml type id 99"):
        formats.type_info(99)
    for tid, n in ((31, 4), (32, 4), (33, 8), (36, 4), (37, 4), (38, 8)):
        t = formats.type_info(tid)
        assert (t.block_size, t.type_size, t.row_group, t.kind) == (32, 18, n, "legacy")
    # the own range holds the codebook types (100, 101: 256-weight blocks), the any-precision bitplanes
    # (102: blocks of 32), the KVQuant cache types (103-105: value rows of 64) and nothing else yet
    own = {i: t.name for i, t in formats.TYPES.items() if formats.EXT_ID_MIN <= i <= formats.EXT_ID_MAX}
    assert own == {100: "CB2", 101: "CB3", 102: "APQ", 103: "NUQ4", 104: "NUQ3", 105: "NUQ2"}
    assert {i: (formats.TYPES[i].kind, formats.TYPES[i].block_size) for i in own} == {
        100: ("ext", 256), 101: ("ext", 256), 102: ("ext", 32), 103: ("ext", 64), 104: ("ext", 64), 105: ("ext", 64)}


def _pinned_tree() -> Path | None:
    env = os.environ.get("GGML_EXT_LLAMA_CPP_SRC")
    candidates = [Path(env)] if env else []
    cache = os.environ.get("GGML_EXT_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ggml-ext")
    candidates.append(Path(cache) / f"llama.cpp-{PINNED_COMMIT}")
    candidates.append(Path("/root/.cache/ggml-ext") / f"llama.cpp-{PINNED_COMMIT}")
    for c in candidates:
        if (c / "ggml" / "include" / "ggml.h").is_file() and (c / "ggml" / "src" / "ggml.c").is_file():
            return c
    return None


_C_SIZES = {"ggml_half": 2, "ggml_fp16_t": 2, "ggml_bf16_t": 2, "float": 4, "double": 8,
            "int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4, "uint32_t": 4,
            "int64_t": 8, "uint64_t": 8}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv}


def _eval_c(expr: str, macros: dict[str, str], block_sizes: dict[str, str]) -> int:
    """Evaluate a small C integer expression: macros, sizeof(type), + - * / and parentheses."""
    for _ in range(20):
        new = re.sub(r"sizeof\(\s*(block_\w+)\s*\)", lambda m: f"({block_sizes[m.group(1)]})", expr)
        new = re.sub(r"sizeof\(\s*(\w+)\s*\)", lambda m: str(_C_SIZES[m.group(1)]), new)
        new = re.sub(r"\b([A-Z_][A-Z0-9_]*)\b", lambda m: f"({macros[m.group(1)]})" if m.group(1) in macros
                     else m.group(1), new)
        if new == expr:
            break
        expr = new

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"cannot evaluate {expr!r}")
    return ev(ast.parse(expr, mode="eval"))


def test_type_table_matches_pinned_tree():
    tree = _pinned_tree()
    if tree is None:
        pytest.skip(f"pinned llama.cpp tree ({PINNED_COMMIT}) not present; fetch it with "
                    "`python3 scripts/fetch_llama_cpp.py tree`")
    ggml_h = (tree / "ggml/include/ggml.h").read_text()
    ggml_c = (tree / "ggml/src/ggml.c").read_text()
    common = (tree / "ggml/src/ggml-common.h").read_text()

    enum_body = re.search(r"enum ggml_type\s*\{(.*?)\};", ggml_h, re.S).group(1)
    enum: dict[str, int] = {}
    for line in enum_body.splitlines():
        line = line.split("//")[0]
        m = re.match(r"\s*GGML_TYPE_(\w+)\s*=\s*(\d+)\s*,", line)
        if m:
            enum[m.group(1)] = int(m.group(2))
    count = enum.pop("COUNT")
    assert count == formats.STOCK_TYPE_COUNT

    macros = dict(re.findall(r"^#define\s+(\w+)\s+(.+?)\s*(?://.*)?$", common, re.M))
    block_sizes = {m.group(1): m.group(2) for m in
                   re.finditer(r"static_assert\(sizeof\((block_\w+)\)\s*==\s*(.+?),\s*\"wrong", common)}

    traits_body = re.search(r"type_traits\[GGML_TYPE_COUNT\]\s*=\s*\{(.*?)\n\};", ggml_c, re.S).group(1)
    traits: dict[int, tuple[str, int, int]] = {}
    for m in re.finditer(r"\[(GGML_TYPE_\w+|\d+)\]\s*=\s*\{(.*?)\n    \}", traits_body, re.S):
        key, body = m.group(1), m.group(2)
        tid = int(key) if key.isdigit() else enum[key[len("GGML_TYPE_"):]]
        name = re.search(r"\.type_name\s*=\s*\"([^\"]*)\"", body).group(1)
        blck = _eval_c(re.search(r"\.blck_size\s*=\s*([^,]+),", body).group(1), macros, block_sizes)
        size = _eval_c(re.search(r"\.type_size\s*=\s*([^,]+),", body).group(1), macros, block_sizes)
        traits[tid] = (name, blck, size)

    assert len(enum) >= 30
    for name, tid in enum.items():
        ours = formats.type_info(tid)
        assert ours.kind == "stock", name
        assert ours.name == name, (tid, ours.name, name)
        tname, blck, size = traits[tid]
        assert (ours.ggml_name, ours.block_size, ours.type_size) == (tname, blck, size), name
    # ids the tree does not define: removed upstream; 31-33/36-38 restored by us, the rest reserved
    for tid in range(count):
        if tid in enum.values():
            continue
        assert traits[tid][1] == 0, f"id {tid} is not in the enum but has a block size upstream"
        if tid in (31, 32, 33, 36, 37, 38):
            assert formats.type_info(tid).kind == "legacy"
            assert formats.TYPES[tid].name in traits[tid][0]  # "TYPE_Q4_0_4_4 REMOVED, ..."
        else:
            assert tid not in formats.TYPES
    stock = {i for i, t in formats.TYPES.items() if t.kind == "stock"}
    assert stock == set(enum.values())
    print(f"\n{len(enum)} stock types match {tree}")


# ---------------------------------------------------------------- `ggml-ext info` through a subprocess


def run_info(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PYDIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("GGML_EXT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "ggml_ext.info", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_info_valid(model_file):
    r = run_info(str(model_file))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for frag in ("architecture:", "llama", "tiny-test", "context length:", "256", "layers:",
                 "vocab size:", "100", "file type:", "MOSTLY_Q8_0", "ggml_ext.format_version",
                 "quantization version", "Q8_0", "F16", "F32", "8.5000", "overall bits per weight",
                 "<array of 100 str>", "nested arrays"):
        assert frag in out, frag
    assert "tok57" not in out          # token list summarised, not dumped
    assert "blk.0.attn_q.weight" not in out

    r = run_info(str(model_file), "--tensors")
    assert r.returncode == 0 and "blk.0.attn_q.weight" in r.stdout and "64x8" in r.stdout

    r = run_info(str(model_file), "--json", "--tensors")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["summary"]["architecture"] == "llama" and d["summary"]["vocab_size"] == 100
    assert d["types"]["Q8_0"]["bits_per_weight"] == 8.5
    assert d["metadata"]["tokenizer.ggml.tokens"]["value"] == {"array_of": "str", "length": 100}
    assert len(d["tensors"]) == 4


def test_format_info_direct(model_file):
    from ggml_ext.info import format_info

    g = read_gguf(model_file)
    text = format_info(g, show_tensors=False)
    assert "llama" in text and "output_norm.weight" not in text
    assert "output_norm.weight" in format_info(g, show_tensors=True)


@pytest.mark.parametrize("name", ["n_tensors 2**60", "key length 2**63", "type id 106 (ggml-ext range)",
                                  "wrong magic", "big-endian version", "tensors overlap fully", "empty",
                                  "interleaved 33 rows 12"])
def test_info_hostile(tmp_path, name):
    data, fragments = HOSTILE[name]
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    r = run_info(str(p), timeout=30)
    assert r.returncode == 1
    assert r.stderr.startswith(f"error: {p}: "), r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    for frag in fragments:
        assert frag.lower() in r.stderr.lower()


def test_info_missing_and_usage(tmp_path):
    r = run_info(str(tmp_path / "missing.gguf"))
    assert r.returncode == 1 and "error:" in r.stderr and "no such file" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_info(str(tmp_path))
    assert r.returncode == 1 and "error:" in r.stderr and "Traceback" not in r.stderr
    r = run_info()
    assert r.returncode == 2 and "error:" in r.stderr
    r = run_info("--build")
    assert "Traceback" not in r.stderr + r.stdout
    assert r.returncode in (0, 1)


def test_info_real_default_model():
    try:
        from ggml_ext import assets
        path = Path(assets.path("smollm2-gguf"))
    except Exception as e:  # noqa: BLE001 - the assets module is optional here
        pytest.skip(f"default model not available: {type(e).__name__}: {e}")
    if not path.is_file():
        pytest.skip(f"default model not fetched ({path} missing)")
    g = read_gguf(path)
    assert g.kv["general.architecture"] == "llama"
    assert g.kv["llama.block_count"] == 30
    assert len(g.kv["tokenizer.ggml.tokens"]) == 49152
    assert {"Q4_1", "Q8_0"} <= set(g.type_histogram())
    r = run_info(str(path), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "llama" in r.stdout and "<array of 49152 str>" in r.stdout
    assert "Q4_1" in r.stdout and "Q8_0" in r.stdout


# ---------------------------------------------------------------- KV-cache-only types are no tensor types


def test_writer_refuses_cache_only_types(tmp_path):
    """ggml-ext's own writer never makes a file with a KVQuant cache type (NUQ4/3/2): the reader and llama.cpp's
    loader would refuse it. Other ggml-ext types (CB2, 100) are still accepted."""
    from ggml_ext.gguf.writer import GGUFWriteError, GGUFWriter
    for tid, name in ((103, "NUQ4"), (104, "NUQ3"), (105, "NUQ2")):
        assert formats.TYPES[tid].cache_only and formats.TYPES[tid].name == name
        w = GGUFWriter(tmp_path / f"{name}.gguf")
        with pytest.raises(GGUFWriteError, match=f"type {name} \\(id {tid}\\) is a KV cache type"):
            w.add_tensor_info("blk.0.attn_k.weight", (64, 2), tid, formats.tensor_nbytes(tid, [64, 2]))
        assert not (tmp_path / f"{name}.gguf").exists()
    assert not formats.TYPES[100].cache_only
    GGUFWriter(tmp_path / "cb2.gguf").add_tensor_info("w", (256, 2), 100, formats.tensor_nbytes(100, [256, 2]))
