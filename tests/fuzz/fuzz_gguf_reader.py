#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Reliability": atheris fuzzing of our GGUF reader.
"""Coverage-guided fuzzing of our GGUF reader (ggml_ext.gguf.reader) and `ggml-ext info`, with atheris.

    make install                                      # installs atheris into .venv (a PyPI wheel, or built)
    python tests/fuzz/fuzz_gguf_reader.py --make-seeds tests/fuzz/gguf_seeds   # (re)build the seed corpus
    mkdir -p /tmp/corpus && cp tests/fuzz/gguf_seeds/* /tmp/corpus/
    python tests/fuzz/fuzz_gguf_reader.py /tmp/corpus -max_total_time=600 -artifact_prefix=/tmp/crash-
    python tests/fuzz/fuzz_gguf_reader.py /tmp/crash-XXXX    # replay one input

The property: every input either parses into a self-consistent GGUFFile that
`ggml-ext info` can print (text and JSON), or raises GGUFError.  Any other
exception is a crash.  Arguments after the script's own are libFuzzer's
(-runs=N, -max_total_time=S, -max_len=N, ...); the corpus folder grows, so point
it at a copy, not at the committed seeds.  A crash found here belongs in
tests/fuzz/regressions/ (replayed by tests/reliability/test_reliability_fuzz.py).

Only the fuzz run needs atheris: imported as a module (the tests' replay of the
committed inputs through `check_one`) or with --make-seeds, this file does not
import it.
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

FUZZING = __name__ == "__main__" and sys.argv[1:2] != ["--make-seeds"]
if FUZZING:
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: `make install` installs it into .venv (or `.venv/bin/pip install "
                 "atheris`); replaying inputs needs no atheris: tests/reliability/test_reliability_fuzz.py")
    # coverage instrumentation of the modules under test: they must be first imported here
    _instrumented = atheris.instrument_imports(include=["ggml_ext.gguf.reader", "ggml_ext.formats",
                                                        "ggml_ext.info"])
else:
    _instrumented = contextlib.nullcontext()
with _instrumented:
    from ggml_ext import info
    from ggml_ext.gguf import GGUFError, GGUFFile, parse_gguf_bytes


def check_one(data: bytes) -> GGUFFile | None:
    """Parse `data`; on success exercise everything `ggml-ext info` does and check self-consistency."""
    try:
        g = parse_gguf_bytes(data)
    except GGUFError as e:
        str(e)
        return None
    assert g.file_size == len(data)
    assert g.data_offset <= g.file_size
    assert not g.tensors or g.data_offset % g.alignment == 0   # no tensors: no padding after the KVs
    end = g.data_offset
    for t in sorted(g.tensors, key=lambda t: t.offset):
        assert t.file_offset == g.data_offset + t.offset
        assert t.file_offset >= end, f"tensor {t.name!r} overlaps its predecessor"
        end = t.file_offset + t.nbytes
        assert end <= g.file_size
    g.type_histogram()
    g.bits_per_weight()
    info.format_info(g, show_tensors=True)
    json.dumps(info.info_dict(g, show_tensors=True), ensure_ascii=False)
    return g


def test_one_input(data: bytes) -> None:
    check_one(data)


def make_seeds(folder: Path) -> list[Path]:
    """A few small real GGUF files from the gguf package's writer (every value type, several tensor types)."""
    import gguf
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    written = []

    def new(name: str, arch: str = "llama") -> gguf.GGUFWriter:
        return gguf.GGUFWriter(str(folder / name), arch)

    def close(w: gguf.GGUFWriter, name: str) -> None:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        written.append(folder / name)

    # 1. a tiny llama: hparams, a short SPM-style vocabulary, f32/f16/q8_0/q4_0 tensors
    w = new("tiny-llama.gguf")
    w.add_name("seed")
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_block_count(1)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(7)
    w.add_tokenizer_model("llama")
    toks = ["<unk>", "<s>", "</s>"] + [f"\u2581w{i}" for i in range(29)]
    w.add_token_list(toks)
    w.add_token_scores([float(-i) for i in range(len(toks))])
    w.add_token_types([2, 3, 3] + [1] * 29)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    w.add_tensor("token_embd.weight", rng.standard_normal((32, 32)).astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng.integers(0, 255, (32, 34), dtype=np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_k.weight", rng.integers(0, 255, (16, 18), dtype=np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    close(w, "tiny-llama.gguf")

    # 2. every scalar and array value type, nested arrays, no tensors
    w = new("all-value-types.gguf", "test")
    w.add_uint8("t.u8", 255)
    w.add_int8("t.i8", -1)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -2)
    w.add_uint32("t.u32", 2**32 - 1)
    w.add_int32("t.i32", -3)
    w.add_float32("t.f32", 0.5)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", -0.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, 1.5])
    w.add_array("t.arr_str", ["a", "bc", ""])
    w.add_array("t.arr_bool", [True, False])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_uint32("general.alignment", 64)
    close(w, "all-value-types.gguf")

    # 3. many small tensors of several types, alignment 64 (K-quant and 3-D shapes)
    w = new("tensor-types.gguf", "test")
    w.add_custom_alignment(64)                 # sets the KV and lays the data out by it
    w.add_tensor("a.f32", np.arange(8, dtype=np.float32))
    w.add_tensor("b.f16_3d", np.ones((2, 3, 4), np.float16))
    w.add_tensor("c.q4_k", rng.integers(0, 255, (2, 144), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("d.i32", np.arange(4, dtype=np.int32))
    w.add_tensor("e.bf16", rng.integers(0, 2**16, (4, 8), dtype=np.uint16).view(np.uint8).reshape(4, 16),
                 raw_dtype=gguf.GGMLQuantizationType.BF16)
    close(w, "tensor-types.gguf")
    return written


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--make-seeds":
        for p in make_seeds(Path(sys.argv[2])):
            print(f"{p} ({p.stat().st_size} bytes)")
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
