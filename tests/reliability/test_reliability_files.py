"""Hostile GGUF files against our llama.cpp tools, llama-cpp-python on our libllama, and `ggml-ext info`.

Two families of files:

* the hand-built hostile files of test_gguf_reader.py (HOSTILE: lying counts,
  string and array lengths, offsets, type ids 31-38 and 100-119, dims, ...);
* a tiny *valid* llama model (SPM vocabulary, 2 layers, 380 KB) written with
  the gguf package, then damaged: byte-level lies in its header (counts,
  string/array lengths, tensor offsets, types, dims), truncations, and
  semantic lies that parse as GGUF but are nonsense to llama.cpp (0 heads,
  scores shorter than tokens, BOS id out of range, missing or misshapen
  tensors, ...).

For every file, `llama-cli -m FILE -p hi -n 1 -st` runs under a 4 GiB
address-space limit and a timeout, and `ggml_ext.llama_cpp_glue.Llama(FILE)`
runs in a worker process under the same limit.  A file that is invalid must be
refused: non-zero exit / an exception, never a signal, never a hang.  A few
files are odd but legal (NaN weights, an unknown tokenizer-free architecture
field); those must just not crash.  `ggml-ext info` must refuse every
structurally broken file with `error: FILE: ...` and may describe the
semantically broken ones (it inspects, it does not run).
"""
from __future__ import annotations

import io
import os
import resource
import signal
import struct
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "formats"))
from test_gguf_reader import HOSTILE  # noqa: E402  the 98 hand-built hostile files of our reader's tests

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from ggml_ext import info as info_verb  # noqa: E402
from ggml_ext import tools  # noqa: E402
from ggml_ext.gguf import GGUFError, parse_gguf_bytes  # noqa: E402

REGRESSIONS = Path(__file__).resolve().parents[1] / "fuzz" / "regressions"   # inputs the fuzzers found
MEM_LIMIT = 4 << 30     # address space of each llama.cpp process
TOOL_TIMEOUT = 30       # seconds per llama-cli run
WORKER_TIMEOUT = 120    # seconds for the llama-cpp-python worker over all files

# ---------------------------------------------------------------- a tiny valid llama model

N_EMBD, N_LAYER, N_HEAD, N_KV, N_FF, N_VOCAB = 64, 2, 4, 2, 128, 300
_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
_TOKENS += [f"\u2581t{i}" for i in range(N_VOCAB - len(_TOKENS))]


def _default_kv() -> dict[str, tuple[str, object]]:
    """key -> (GGUFWriter method, value); cases replace or drop entries."""
    return {
        "general.name": ("add_string", "tiny-hostile"),
        "llama.context_length": ("add_uint32", 128),
        "llama.embedding_length": ("add_uint32", N_EMBD),
        "llama.block_count": ("add_uint32", N_LAYER),
        "llama.feed_forward_length": ("add_uint32", N_FF),
        "llama.attention.head_count": ("add_uint32", N_HEAD),
        "llama.attention.head_count_kv": ("add_uint32", N_KV),
        "llama.rope.dimension_count": ("add_uint32", N_EMBD // N_HEAD),
        "llama.attention.layer_norm_rms_epsilon": ("add_float32", 1e-5),
        "general.file_type": ("add_uint32", 0),
        "tokenizer.ggml.model": ("add_string", "llama"),
        "tokenizer.ggml.tokens": ("add_array", list(_TOKENS)),
        "tokenizer.ggml.scores": ("add_array", [0.0] * len(_TOKENS)),
        "tokenizer.ggml.token_type": ("add_array", [2, 3, 3] + [6] * 256 + [1] * (len(_TOKENS) - 259)),
        "tokenizer.ggml.bos_token_id": ("add_uint32", 1),
        "tokenizer.ggml.eos_token_id": ("add_uint32", 2),
        "tokenizer.ggml.unknown_token_id": ("add_uint32", 0),
    }


def _default_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)

    def f(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    hd = N_EMBD // N_HEAD
    t = {"token_embd.weight": f(N_VOCAB, N_EMBD), "output_norm.weight": np.ones(N_EMBD, np.float32)}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        t |= {p + "attn_norm.weight": np.ones(N_EMBD, np.float32), p + "attn_q.weight": f(N_EMBD, N_EMBD),
              p + "attn_k.weight": f(N_KV * hd, N_EMBD), p + "attn_v.weight": f(N_KV * hd, N_EMBD),
              p + "attn_output.weight": f(N_EMBD, N_EMBD), p + "ffn_norm.weight": np.ones(N_EMBD, np.float32),
              p + "ffn_gate.weight": f(N_FF, N_EMBD), p + "ffn_up.weight": f(N_FF, N_EMBD),
              p + "ffn_down.weight": f(N_EMBD, N_FF)}
    return t


def tiny_model(path: Path, kv: dict | None = None, drop_kv=(), tensors: dict | None = None, drop_tensors=(),
               arch: str = "llama") -> bytes:
    """Write the tiny model (with replaced/dropped KVs and tensors) to `path` and return its bytes."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, (method, value) in (_default_kv() | (kv or {})).items():
        if key in drop_kv:
            continue
        if method == "add_array":
            w.add_array(key, value)
        else:
            getattr(w, method)(key, value)
    for name, arr in (_default_tensors() | (tensors or {})).items():
        if name not in drop_tensors:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


# ---------------------------------------------------------------- byte-level edits of a valid file


def _gstr(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def tensor_fields(data: bytes, name: str) -> dict[str, int]:
    """Byte positions of a tensor-info record's fields (n_dims, ne[i], type, offset)."""
    g = parse_gguf_bytes(data)
    pos = data.find(_gstr(name), 0, g.data_offset)
    assert pos > 0, name
    p = pos + 8 + len(name.encode())
    n_dims = struct.unpack_from("<I", data, p)[0]
    fields = {"n_dims": p}
    for i in range(n_dims):
        fields[f"ne{i}"] = p + 4 + 8 * i
    fields["type"] = p + 4 + 8 * n_dims
    fields["offset"] = fields["type"] + 4
    return fields


def patch(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def kv_value_pos(data: bytes, key: str) -> int:
    """Position of the value of KV `key` (just after its type tag)."""
    pos = data.find(_gstr(key))
    assert pos > 0, key
    return pos + 8 + len(key.encode()) + 4


def nuq4_weight_model(path: Path) -> bytes:
    """The tiny model with blk.0.attn_k.weight of type NUQ4 [64, 32]: written as F32 [10, 32] (the same 1280
    bytes, so every offset stays right), then its ne0 and type patched."""
    data = tiny_model(path, tensors={"blk.0.attn_k.weight": np.ones((N_KV * N_EMBD // N_HEAD, 10), np.float32)})
    f = tensor_fields(data, "blk.0.attn_k.weight")
    return patch(patch(data, f["ne0"], "<Q", 64), f["type"], "<i", 103)


# ---------------------------------------------------------------- the cases

# name -> (bytes, expectation); expectation "refuse" (must fail cleanly) or "survive" (may load; must not crash)
CASES: dict[str, tuple[bytes, str]] = {}


def _build_cases(tmp: Path) -> None:
    if CASES:
        return
    n = 0

    def model(**kw) -> bytes:
        nonlocal n
        n += 1
        return tiny_model(tmp / f"m{n}.gguf", **kw)

    base = model()
    g = parse_gguf_bytes(base)
    CASES["valid tiny model"] = (base, "survive")

    # --- header counts
    CASES["n_tensors +1"] = (patch(base, 8, "<Q", len(g.tensors) + 1), "refuse")
    CASES["n_tensors -1"] = (patch(base, 8, "<Q", len(g.tensors) - 1), "refuse")
    CASES["n_tensors 2**63-1"] = (patch(base, 8, "<Q", 2**63 - 1), "refuse")
    CASES["n_kv +1"] = (patch(base, 16, "<Q", len(g.kv) + 1), "refuse")
    CASES["n_kv -1"] = (patch(base, 16, "<Q", len(g.kv) - 1), "refuse")
    CASES["n_kv 2**40"] = (patch(base, 16, "<Q", 2**40), "refuse")
    # --- huge string lengths and arrays inside a real model
    name_len = base.find(_gstr("tiny-hostile"))
    CASES["general.name length 2**62"] = (patch(base, name_len, "<Q", 2**62), "refuse")
    CASES["general.name length +1000"] = (patch(base, name_len, "<Q", 1012), "refuse")
    tok = kv_value_pos(base, "tokenizer.ggml.tokens")          # -> i32 elem type, u64 count
    CASES["tokens array count 2**40"] = (patch(base, tok + 4, "<Q", 2**40), "refuse")
    CASES["tokens array count 2**64-1"] = (patch(base, tok + 4, "<Q", 2**64 - 1), "refuse")
    CASES["tokens array count +1"] = (patch(base, tok + 4, "<Q", len(_TOKENS) + 1), "refuse")
    CASES["tokens array elem type 99"] = (patch(base, tok, "<i", 99), "refuse")
    CASES["first token length 2**62"] = (patch(base, tok + 12, "<Q", 2**62), "refuse")
    sc = kv_value_pos(base, "tokenizer.ggml.scores")
    CASES["scores array count 2**61"] = (patch(base, sc + 4, "<Q", 2**61), "refuse")
    CASES["key length 2**63"] = (patch(base, base.find(_gstr("llama.block_count")), "<Q", 2**63), "refuse")
    CASES["kv type tag 77"] = (patch(base, kv_value_pos(base, "llama.block_count") - 4, "<i", 77), "refuse")
    # --- tensor infos that lie
    q = tensor_fields(base, "blk.0.attn_q.weight")
    norm = tensor_fields(base, "output_norm.weight")
    emb = tensor_fields(base, "token_embd.weight")
    q_off = struct.unpack_from("<Q", base, q["offset"])[0]
    CASES["attn_q offset +32"] = (patch(base, q["offset"], "<Q", q_off + 32), "refuse")
    CASES["attn_q offset -32"] = (patch(base, q["offset"], "<Q", q_off - 32), "refuse")
    CASES["attn_q offset misaligned"] = (patch(base, q["offset"], "<Q", q_off + 1), "refuse")
    CASES["attn_q offset 2**63"] = (patch(base, q["offset"], "<Q", 2**63), "refuse")
    CASES["attn_q offset 2**64-32"] = (patch(base, q["offset"], "<Q", 2**64 - 32), "refuse")
    CASES["attn_q ne1 doubled"] = (patch(base, q["ne1"], "<q", 2 * N_EMBD), "refuse")
    CASES["attn_q ne1 2**40"] = (patch(base, q["ne1"], "<q", 2**40), "refuse")
    CASES["attn_q ne0 0"] = (patch(base, q["ne0"], "<q", 0), "refuse")
    CASES["attn_q ne0 -64"] = (patch(base, q["ne0"], "<q", -64), "refuse")
    CASES["attn_q n_dims 5"] = (patch(base, q["n_dims"], "<I", 5), "refuse")
    CASES["attn_q n_dims 0"] = (patch(base, q["n_dims"], "<I", 0), "refuse")
    CASES["token_embd ne1 2**62"] = (patch(base, emb["ne1"], "<q", 2**62), "refuse")
    CASES["attn_q type F16 (data is F32)"] = (patch(base, q["type"], "<i", 1), "refuse")
    CASES["attn_q type Q8_0 (data is F32)"] = (patch(base, q["type"], "<i", 8), "refuse")
    CASES["attn_q type -1"] = (patch(base, q["type"], "<i", -1), "refuse")
    CASES["attn_q type 2**31-1"] = (patch(base, q["type"], "<i", 2**31 - 1), "refuse")
    for tid in (31, 32, 33, 36, 37, 38):   # restored interleaved ids: 64x64 fits their row groups, 1-D does not
        CASES[f"attn_q type {tid}"] = (patch(base, q["type"], "<i", tid), "refuse")
        CASES[f"output_norm type {tid} (1 row)"] = (patch(base, norm["type"], "<i", tid), "refuse")
        CASES[f"token_embd type {tid} (300 rows)"] = (patch(base, emb["type"], "<i", tid), "refuse")
    for tid in range(100, 120):            # ggml-ext's own range
        CASES[f"attn_q type {tid}"] = (patch(base, q["type"], "<i", tid), "refuse")
    CASES["output_norm type 110 (1 row)"] = (patch(base, norm["type"], "<i", 110), "refuse")
    CASES["alignment 64 (offsets now misaligned)"] = (model(kv={"general.alignment": ("add_uint32", 64)}), "survive")
    # --- truncated data and header
    size = len(base)
    for frac in (0.25, 0.5, 0.9):
        CASES[f"truncated at {int(frac * 100)}% of the data"] = (
            base[: g.data_offset + int((size - g.data_offset) * frac)], "refuse")
    CASES["last byte missing"] = (base[:-1], "refuse")
    CASES["truncated in the tensor infos"] = (base[: g.data_offset - 40], "refuse")
    CASES["truncated in the token list"] = (base[: tok + 3000], "refuse")
    CASES["data section zeroed"] = (base[: g.data_offset] + bytes(size - g.data_offset), "survive")
    nan = bytearray(base)
    nan[g.data_offset:] = b"\x00\x00\xc0\x7f" * ((size - g.data_offset) // 4)
    CASES["all weights NaN"] = (bytes(nan), "survive")

    # --- semantic lies: valid GGUF, nonsense model
    u32 = "add_uint32"
    for key, val in (("llama.attention.head_count", 0), ("llama.attention.head_count_kv", 0),
                     ("llama.attention.head_count", 3), ("llama.attention.head_count", 128),
                     ("llama.attention.head_count_kv", 3), ("llama.block_count", 0),
                     ("llama.block_count", 1000), ("llama.block_count", 2**31), ("llama.block_count", 2**32 - 1),
                     ("llama.embedding_length", 0), ("llama.embedding_length", 128),
                     ("llama.feed_forward_length", 0), ("llama.rope.dimension_count", 0),
                     ("llama.rope.dimension_count", 1000)):
        CASES[f"{key} = {val}"] = (model(kv={key: (u32, val)}), "refuse")
    # llama.cpp resets out-of-range special token ids to -1 with a warning
    for key, val in (("tokenizer.ggml.bos_token_id", 10**6), ("tokenizer.ggml.eos_token_id", 2**32 - 1),
                     ("tokenizer.ggml.unknown_token_id", 400)):
        CASES[f"{key} = {val}"] = (model(kv={key: (u32, val)}), "survive")
    # upstream aborted on these (server slot of 0 tokens); patch 0900 refuses them at load
    CASES["llama.context_length = 0"] = (model(kv={"llama.context_length": (u32, 0)}), "refuse")
    CASES["llama.context_length = 2**32-1"] = (model(kv={"llama.context_length": (u32, 2**32 - 1)}), "refuse")
    CASES["llama.block_count is a string"] = (model(kv={"llama.block_count": ("add_string", "2")}), "refuse")
    CASES["llama.block_count is u64 2**40"] = (model(kv={"llama.block_count": ("add_uint64", 2**40)}), "refuse")
    CASES["rms_epsilon is a string"] = (model(kv={"llama.attention.layer_norm_rms_epsilon": ("add_string", "x")}),
                                        "refuse")
    CASES["rms_epsilon NaN"] = (model(kv={"llama.attention.layer_norm_rms_epsilon": ("add_float32", float("nan"))}),
                                "refuse")
    # RoPE base 0 / NaN or a negative scaling factor: NaN attention scores (soft_max asserts); patch 0900 refuses
    CASES["rope freq base 0"] = (model(kv={"llama.rope.freq_base": ("add_float32", 0.0)}), "refuse")
    CASES["rope freq base NaN"] = (model(kv={"llama.rope.freq_base": ("add_float32", float("nan"))}), "refuse")
    CASES["rope scaling factor -1"] = (model(kv={"llama.rope.scaling.factor": ("add_float32", -1.0)}), "refuse")
    CASES["no embedding_length"] = (model(drop_kv={"llama.embedding_length"}), "refuse")
    CASES["no block_count"] = (model(drop_kv={"llama.block_count"}), "refuse")
    CASES["no tokenizer"] = (model(drop_kv={"tokenizer.ggml.model", "tokenizer.ggml.tokens",
                                            "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}), "refuse")
    CASES["tokenizer model unknown"] = (model(kv={"tokenizer.ggml.model": ("add_string", "bogus")}), "refuse")
    CASES["scores shorter than tokens"] = (model(kv={"tokenizer.ggml.scores": ("add_array", [0.0] * 10)}), "refuse")
    CASES["token_type shorter than tokens"] = (model(kv={"tokenizer.ggml.token_type": ("add_array", [1] * 10)}),
                                               "refuse")
    CASES["tokens are numbers"] = (model(kv={"tokenizer.ggml.tokens": ("add_array", list(range(N_VOCAB)))}),
                                   "refuse")
    CASES["empty token list"] = (model(kv={"tokenizer.ggml.tokens": ("add_array", []),
                                           "tokenizer.ggml.scores": ("add_array", []),
                                           "tokenizer.ggml.token_type": ("add_array", [])}), "refuse")
    CASES["architecture unknown"] = (model(arch="nonexistent"), "refuse")
    CASES["missing tensor blk.1.ffn_down"] = (model(drop_tensors={"blk.1.ffn_down.weight"}), "refuse")
    CASES["extra unknown tensor"] = (model(tensors={"blk.0.bogus.weight": np.ones(8, np.float32)}), "refuse")
    CASES["attn_q wrong shape"] = (model(tensors={"blk.0.attn_q.weight": np.ones((32, N_EMBD), np.float32)}),
                                   "refuse")
    CASES["token_embd fewer rows than vocab"] = (
        model(tensors={"token_embd.weight": np.ones((100, N_EMBD), np.float32)}), "refuse")
    CASES["output_norm 2-D"] = (model(tensors={"output_norm.weight": np.ones((2, N_EMBD), np.float32)}), "refuse")

    # --- a weight of a KV-cache-only type (KVQuant NUQ4, id 103): parses as GGUF (gguf.cpp knows the type),
    # refused by the loader (patch 0321). attn_k as F32 [10, 32] has the bytes of NUQ4 [64, 32] (32 rows x 40 B)
    CASES["attn_k of cache type NUQ4"] = (nuq4_weight_model(tmp / "nuq4.gguf"), "refuse")

    # --- the reader's hand-built hostile files: no architecture, always refused
    for name, (data, _) in HOSTILE.items():
        CASES[f"reader: {name}"] = (data, "refuse")
    # --- what the C fuzzer found (tests/fuzz/fuzz_gguf_c.py; patch 0930): a 0 in a shape that hid an
    # element-count overflow made the load abort in ggml_new_tensor
    for p in sorted(REGRESSIONS.glob("c-*")):
        CASES[f"c fuzzer: {p.stem}"] = (p.read_bytes(), "refuse")


@pytest.fixture(scope="module")
def case_files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hostile-models")
    _build_cases(tmp / "build")
    files = {}
    for i, (name, (data, _)) in enumerate(CASES.items()):
        p = tmp / f"case{i:03d}.gguf"
        p.write_bytes(data)
        files[name] = p
    return files


# ---------------------------------------------------------------- running llama.cpp on them


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_cli(path: Path, env: dict) -> tuple[int | str, str]:
    cmd = tools.command("llama-cli", "-m", path, "-p", "hi", "-n", "1", "-st", "-t", "1", "-c", "128",
                        "--no-warmup", "--simple-io")
    try:
        r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           errors="replace", timeout=TOOL_TIMEOUT, preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def cli_results(case_files, tool_env) -> dict[str, tuple[int | str, str]]:
    env = dict(tool_env, GGML_NO_BACKTRACE="1")   # ggml's abort handler would attach gdb for a backtrace
    with ThreadPoolExecutor(2) as pool:   # tiny files, short runs: two at a time on the 2-core machine
        futs = {name: pool.submit(run_cli, p, env) for name, p in case_files.items()}
        return {name: f.result() for name, f in futs.items()}


WORKER = textwrap.dedent("""
    import sys
    from ggml_ext.llama_cpp_glue import Llama
    for line in sys.stdin:
        i, path = line.rstrip("\\n").split("\\t", 1)
        print("BEGIN", i, flush=True)
        try:
            llm = Llama(path, n_ctx=128, n_threads=1, n_batch=32)
            toks = llm.tokenize(b"hi")
            llm.eval(toks)
            del llm
            print("LOADED", i, flush=True)
        except Exception as e:
            msg = (type(e).__name__ + ": " + str(e)).replace("\\n", " ")[:300]
            print("RAISED", i, msg, flush=True)
    """)


def run_python_worker(files: list[Path], env: dict) -> dict[int, tuple[str, str]]:
    """Load each file with llama-cpp-python; a worker that dies is restarted after the file that killed it."""
    results: dict[int, tuple[str, str]] = {}
    todo = list(range(len(files)))
    while todo:
        feed = "".join(f"{i}\t{files[i]}\n" for i in todo)
        try:
            r = subprocess.run([sys.executable, "-c", WORKER], input=feed, env=env, capture_output=True, text=True,
                               errors="replace", timeout=WORKER_TIMEOUT, preexec_fn=_limits)
            out, rc = r.stdout, r.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = "timeout"
        current = None
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if parts[0] == "BEGIN":
                current = int(parts[1])
            elif parts[0] in ("LOADED", "RAISED"):
                results[int(parts[1])] = (parts[0].lower(), parts[2] if len(parts) > 2 else "")
                current = None
        if current is None:
            assert rc == 0, f"worker exited {rc} between files:\n{r.stderr[-2000:]}"
            break
        results[current] = ("timeout" if rc == "timeout" else f"died {rc}", "")
        todo = todo[todo.index(current) + 1:]
    return results


@pytest.fixture(scope="module")
def python_results(case_files) -> dict[str, tuple[str, str]]:
    names = list(case_files)
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    env["GGML_NO_BACKTRACE"] = "1"
    res = run_python_worker([case_files[n] for n in names], env)
    return {names[i]: res[i] for i in res}


# Files on which our llama.cpp aborts instead of refusing. Strict xfail keeps them visible: when one is
# fixed, the test XPASSes, fails, and the entry must go. docs/RELIABILITY.md has the history: upstream
# aborted on llama.block_count 0 / > LLAMA_MAX_LAYERS, a NaN rms epsilon (at the first decode) and
# context_length 0 or 2**32-1; patch 0900-model-hparams-checks turns those into load errors.
KNOWN_CRASHES_CLI: dict[str, str] = {}
KNOWN_CRASHES_PY: dict[str, str] = {}


def _case_params(known: dict[str, str]):
    # names are known before the files are written: build them into a throwaway folder once
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        _build_cases(Path(d))
    assert set(known) <= set(CASES)
    params = []
    for name in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=known[name])] if name in known else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def _tail(text: str, n: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


@pytest.mark.parametrize("name", _case_params(KNOWN_CRASHES_CLI))
def test_llama_cli_refuses_or_survives(name, cli_results):
    rc, log = cli_results[name]
    expect = CASES[name][1]
    assert rc != "timeout", f"llama-cli hung on {name!r} (> {TOOL_TIMEOUT} s)"
    assert rc >= 0, f"llama-cli died with signal {signal.Signals(-rc).name} on {name!r}:\n{_tail(log, 15)}"
    if expect == "refuse":
        assert rc != 0, f"llama-cli accepted {name!r}:\n{_tail(log)}"
        assert "error" in log.lower() or "failed" in log.lower(), f"no error message for {name!r}:\n{_tail(log)}"


@pytest.mark.parametrize("name", _case_params(KNOWN_CRASHES_PY))
def test_llama_cpp_python_refuses_or_survives(name, python_results):
    outcome, msg = python_results[name]
    expect = CASES[name][1]
    assert outcome != "timeout", f"Llama() hung on {name!r}"
    assert not outcome.startswith("died"), f"Llama() killed the process on {name!r} ({outcome})"
    if expect == "refuse":
        assert outcome == "raised", f"Llama() loaded {name!r}"
        assert msg.startswith(("ValueError", "RuntimeError")), msg


def _info(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = SimpleNamespace(file=str(path), build=False, tensors=True, json=False)
    with redirect_stdout(out), redirect_stderr(err):
        rc = info_verb.main(args)
    return rc, out.getvalue(), err.getvalue()


def test_info_refuses_broken_files(case_files):
    """`ggml-ext info` (the verb's main, in-process: a crash would be a Python exception here)."""
    refused = described = 0
    for name, path in case_files.items():
        try:
            structurally_ok = parse_gguf_bytes(CASES[name][0]) is not None
        except GGUFError:
            structurally_ok = False
        rc, out, err = _info(path)
        if structurally_ok:
            assert rc == 0, (name, err)
            assert "tensor" in out.lower() or "architecture" in out.lower(), name
            described += 1
        else:
            assert rc == 1, (name, rc)
            assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, (name, err)
            refused += 1
    print(f"\ninfo: {refused} refused, {described} described (valid GGUF, semantic lies)")
    assert refused > 100


def test_info_cli_subprocess_on_a_few(case_files):
    """The installed `ggml-ext` entry point, as a user runs it."""
    exe = Path(sys.executable).with_name("ggml-ext")
    if not exe.exists():
        pytest.skip(f"no ggml-ext entry point next to {sys.executable}")
    for name in ("tokens array count 2**40", "attn_q offset 2**63", "attn_q type 119", "truncated at 50% of the data"):
        r = subprocess.run([str(exe), "info", str(case_files[name])], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (name, r.stderr)
        assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr, (name, r.stderr)


def test_summary(cli_results, python_results):
    """One line per outcome class, for the report (and to catch an empty run)."""
    cli_refused = sum(1 for rc, _ in cli_results.values() if isinstance(rc, int) and rc > 0)
    py_raised = sum(1 for o, _ in python_results.values() if o == "raised")
    print(f"\n{len(CASES)} files: llama-cli refused {cli_refused}, llama-cpp-python raised on {py_raised}")
    assert len(cli_results) == len(python_results) == len(CASES) >= 200


def test_cache_type_weight_is_refused_by_name(tmp_path, tool_env):
    """llama-cli and llama-cpp-python refuse a weight of a KVQuant cache type (patch 0321) with a message that
    names the tensor and the reason, and ggml-ext's reader refuses it too."""
    path = tmp_path / "nuq4.gguf"
    path.write_bytes(nuq4_weight_model(tmp_path / "w.gguf"))
    rc, log = run_cli(path, dict(tool_env, GGML_NO_BACKTRACE="1"))
    assert rc != "timeout" and isinstance(rc, int) and rc > 0, (rc, _tail(log, 12))
    assert "tensor 'blk.0.attn_k.weight' (type nuq4) is of a KVQuant KV cache type" in log, _tail(log, 12)
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    env.pop("LLAMA_CPP_LIB_PATH", None)   # as python_results: the glue finds our libllama
    out = run_python_worker([path], env)[0]
    assert out[0] == "raised", out
    with pytest.raises(GGUFError, match="blk.0.attn_k.weight.*NUQ4 \\(id 103\\), a KVQuant KV cache type"):
        parse_gguf_bytes(path.read_bytes())


# ---------------------------------------------------------------- gguf.cpp with its data loaded (no_alloc=false)

def test_control_vector_files_are_refused(tmp_path, tool_env):
    """`--control-vector` reads the whole file through gguf_init_from_file(no_alloc=false): the inputs the C
    fuzzer found (tests/fuzz/regressions/c-gguf-*: a 64-byte file announcing a 4 TiB tensor aborted
    llama-cli in ggml_init before patch 0930) are reported and skipped, never a signal."""
    model = tmp_path / "tiny.gguf"
    tiny_model(model)
    env = dict(tool_env, GGML_NO_BACKTRACE="1")
    files = [REGRESSIONS / f"c-gguf-{n}.gguf" for n in ("kv-type-minus-1", "1gib-tensor-no-data", "4tib-tensor-no-data")]
    for f in files:
        cmd = tools.command("llama-cli", "-m", model, "--control-vector", f, "-p", "hi", "-n", "1", "-st", "-t", "1",
                            "-c", "128", "--no-warmup", "--simple-io")
        r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                           timeout=TOOL_TIMEOUT, preexec_fn=_limits)
        log = r.stdout + r.stderr
        # a bad control vector is reported and skipped (llama-cli goes on without it): no signal
        assert r.returncode >= 0, f"llama-cli rc {r.returncode} on --control-vector {f.name}:\n{_tail(log, 12)}"
        assert "failed to load control vector" in log, _tail(log, 12)
