#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Reliability": libFuzzer + ASan/UBSan on llama.cpp's GGUF loading.
"""libFuzzer + ASan/UBSan for llama.cpp's C/C++ GGUF loading (the patched tree, with ggml_ext).

    fuzz_gguf_c.py build                          build (cached) and print the build folder
    fuzz_gguf_c.py seeds DIR                      write the seed corpus into DIR
    fuzz_gguf_c.py run [--target T] [--seconds N] [--corpus DIR] [--json] [-- LIBFUZZER ARGS]
    fuzz_gguf_c.py replay [--target T] FILE...    run inputs once (a crash exits non-zero)
    fuzz_gguf_c.py hostile [--subset N] [--json]  load_gguf_model over the hostile files of
                                                  tests/reliability/test_reliability_files.py

Targets (tests/c/sanitizer/): fuzz_gguf (gguf.cpp's allocating parser, every tensor through
ggml_validate_row_data, metadata written and read back), fuzz_llama_vocab (llama_model_load_from_file,
vocab_only, then tokenize), and ggml-ext's own readers: fuzz_kv_calib (the KV-calibration side file,
bound to each KVQuant cache type), fuzz_qdec (the QDEC side file, attached to weights of its shapes),
fuzz_ext_tensors (CB2/CB3, APQ with its tables, interleaved: the loader's file checks, validation,
companions, dequantization). Each target's corpus starts from its seeds (SEEDS); ggml-ext's targets
have real files committed under tests/fuzz/<target>_seeds/ (`seeds --ext` writes them again). The build is clang + ccache into
~/.cache/ggml-ext/sanitizer, re-patched and re-configured when its key changes (clang's version,
the pristine tree, the patch series, every source we compile into the libraries).
Needs a clang that links -fsanitize=fuzzer,address,undefined: the newest one installed is used
(scripts/find_clang.py; `make system-deps` installs Debian's clang + libclang-rt-dev when none does).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC_DIR = REPO / "tests" / "c" / "sanitizer"
DICT = SRC_DIR / "gguf.dict"
REGRESSIONS = REPO / "tests" / "fuzz" / "regressions"
CACHE = Path(os.environ.get("GGML_EXT_CACHE", Path.home() / ".cache" / "ggml-ext"))
TARGETS = ("fuzz_gguf", "fuzz_llama_vocab", "fuzz_kv_calib", "fuzz_qdec", "fuzz_ext_tensors")
# The committed seeds of ggml-ext's own targets (tests/fuzz/<name>/); the GGUF targets' come from make_seeds.
EXT_SEEDS = {"fuzz_kv_calib": "kv_calib_seeds", "fuzz_qdec": "qdec_seeds", "fuzz_ext_tensors": "ext_tensor_seeds"}
MAX_LEN = 65536          # the seeds are headers and small tensors; a larger input only slows it
# Sanitizer settings of every run: fail on the first report, bounded memory, no leak noise from
# libFuzzer's own exits (leaks are still checked: detect_leaks=1 is ASan's default on Linux).
ASAN = "abort_on_error=1:detect_leaks=1:allocator_may_return_null=0:max_allocation_size_mb=2048:symbolize=1"
UBSAN = "print_stacktrace=1:halt_on_error=1"

sys.path.insert(0, str(REPO / "scripts"))


def _log(msg: str) -> None:
    print(f"[fuzz_gguf_c] {msg}", file=sys.stderr, flush=True)


def find_clang() -> tuple[str, str]:
    """(clang, clang++): the newest installed clang that links libFuzzer + ASan/UBSan (find_clang.py);
    SystemExit saying which were tried and why each failed."""
    import find_clang as fc
    try:
        return fc.find_clang()
    except LookupError as e:
        raise SystemExit(f"error: {e}") from None


def _tool(name: str) -> str:
    # cmake/ninja from the virtual environment (make install puts them there), else PATH
    venv_bin = Path(sys.executable).parent
    path = shutil.which(name, path=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    if not path:
        raise SystemExit(f"error: {name} not found (make install puts it in .venv)")
    return path


def build_key(cc: str) -> tuple[str, Path]:
    import apply_patches
    import fetch_llama_cpp
    pristine = Path(subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_llama_cpp.py"), "tree"],
                                   check=True, capture_output=True, text=True).stdout.strip())
    h = hashlib.sha256()
    h.update(subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.encode())
    h.update(apply_patches.stamp_for(pristine, apply_patches.patch_files(REPO / "ggml_ext" / "patches")).encode())
    h.update(fetch_llama_cpp.COMMIT.encode())
    # what goes into the libraries; the harnesses themselves are synced into the folder on every call
    sources = [REPO / "CMakeLists.txt", REPO / "cmake" / "ggml-ext-sources.cmake", REPO / "cmake" / "ggml-ext-amx.cmake", SRC_DIR / "CMakeLists.txt"]
    for d in (REPO / "ggml_ext" / "src", REPO / "ggml_ext" / "include"):
        sources += sorted(p for p in d.rglob("*") if p.is_file() and p.suffix in (".c", ".h", ".def", ".cpp", ".cu", ".cuh"))
    for p in sources:
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16], pristine


def _tools_exist(bdir: Path) -> bool:
    """Whether the programs the folder was configured with are still there: a checkout that configured it (its
    .venv's ninja, its Python) may be gone since, and cmake --build would then fail."""
    cache = bdir / "CMakeCache.txt"
    if not cache.is_file():
        return False
    for line in cache.read_text(errors="replace").splitlines():
        name, _, value = line.partition("=")
        if name.split(":")[0] in ("CMAKE_MAKE_PROGRAM", "Python3_EXECUTABLE") and value and not Path(value).exists():
            return False
    return True


def build(*targets: str) -> Path:
    """The sanitizer build of the current sources, with ``targets`` (default: all) built.

    One folder, ~/.cache/ggml-ext/sanitizer, re-patched and re-configured when the key changes:
    paths stay the same, so ccache (paths relative to the folder, the folder not hashed) hits for
    every unchanged file, llama.cpp's unity-build chunks included (they name sources by
    absolute path). A lock serialises builds from several checkouts."""
    import fcntl
    targets = targets or (*TARGETS, "load_gguf_model")
    cc, cxx = find_clang()
    key, pristine = build_key(cc)
    root = CACHE / "sanitizer"
    bdir = root / "build"
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CCACHE_BASEDIR=str(root), CCACHE_NOHASHDIR="1", CCACHE_DIR=os.environ.get(
        "CCACHE_DIR", str(Path.home() / ".cache" / "ccache")))
    t0 = time.time()
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = bdir / ".key"
        if not (stamp.is_file() and stamp.read_text().strip() == key and _tools_exist(bdir)):
            import apply_patches
            _log(f"configuring {root} with {cc} (the first build takes a while; ccache makes later ones quick)")
            tree = apply_patches.patched_tree(pristine, root / "llama.cpp", REPO / "ggml_ext" / "patches")
            src = root / "src"
            if src.exists():
                shutil.rmtree(src)
            src.mkdir(parents=True)
            for name in ("tests/c/sanitizer", "cmake", "ggml_ext/src", "ggml_ext/include", "scripts"):
                shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(REPO / "CMakeLists.txt", src / "CMakeLists.txt")
            ccache = shutil.which("ccache")
            launcher = [f"-DCMAKE_C_COMPILER_LAUNCHER={ccache}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={ccache}"] if ccache else []
            subprocess.run([_tool("cmake"), "-S", str(src / "tests" / "c" / "sanitizer"), "-B", str(bdir), "-G", "Ninja",
                            f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}", f"-DCMAKE_C_COMPILER={cc}",
                            f"-DCMAKE_CXX_COMPILER={cxx}", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                            "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1", "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1",
                            f"-DLLAMA_CPP_PATCHED={tree}", f"-DPython3_EXECUTABLE={sys.executable}", *launcher],
                           check=True, env=env, stdout=subprocess.DEVNULL)
            stamp.write_text(key + "\n")
            for old in CACHE.glob("sanitizer-*"):   # the keyed folders of earlier versions of this script
                shutil.rmtree(old, ignore_errors=True)
        # the harness sources: copied when they changed (ninja then rebuilds just those)
        for f in SRC_DIR.iterdir():
            dst = root / "src" / "tests" / "c" / "sanitizer" / f.name
            if f.is_file() and (not dst.is_file() or dst.read_bytes() != f.read_bytes()):
                shutil.copy(f, dst)
        r = subprocess.run([_tool("cmake"), "--build", str(bdir), "--target", *targets], env=env,
                           capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-20000:] + r.stderr[-5000:])
        raise SystemExit(f"error: the sanitizer build of {', '.join(targets)} failed (above)")
    if "no work to do" not in r.stdout:
        _log(f"built {', '.join(targets)} in {time.time() - t0:.0f} s")
    return bdir


def sanitizer_env() -> dict[str, str]:
    return dict(os.environ, ASAN_OPTIONS=ASAN, UBSAN_OPTIONS=UBSAN, GGML_NO_BACKTRACE="1",
                ASAN_SYMBOLIZER_PATH=shutil.which("llvm-symbolizer-14") or shutil.which("llvm-symbolizer") or "")


# ---------------------------------------------------------------- seeds


def _reader_tests():
    sys.path.insert(0, str(REPO / "tests" / "formats"))
    import test_gguf_reader
    return test_gguf_reader


def make_seeds(out: Path) -> list[Path]:
    """Real files, small: the reader's seeds, its hostile files, the reliability tests' tiny llama
    (F32, SPM vocabulary), interleaved Q4_0 tensors (ids 31-33) with valid and broken data, and
    the first 64 KiB of the default model when it is present."""
    out.mkdir(parents=True, exist_ok=True)
    seeds: dict[str, bytes] = {}
    for p in sorted((REPO / "tests" / "fuzz" / "gguf_seeds").iterdir()):
        seeds[f"reader-{p.name}"] = p.read_bytes()
    if REGRESSIONS.is_dir():
        for p in sorted(REGRESSIONS.iterdir()):
            seeds[f"regression-{p.name}"] = p.read_bytes()
    r = _reader_tests()
    for i, (name, (data, _)) in enumerate(r.HOSTILE.items()):
        if len(data) <= MAX_LEN:
            seeds[f"hostile-{i:03d}"] = data
    import numpy as np
    from ggml_ext import quants
    w = np.random.default_rng(0).standard_normal((16, 64), dtype=np.float32)
    for tid, name in ((31, "Q4_0_4_4"), (32, "Q4_0_4_8"), (33, "Q4_0_8_8")):
        q = quants.quantize(w, name).tobytes()
        info = [r.tinfo("blk.0.attn_q.weight", [64, 16], tid, 0)]
        seeds[f"interleaved-{name}"] = r.build([r.kv_str("general.architecture", "llama")], info, q)
        bad = bytearray(q)
        bad[0:2] = np.float16(np.inf).tobytes()       # a non-finite scale: validation must say no
        seeds[f"interleaved-{name}-inf"] = r.build([], info, bytes(bad))
    try:
        sys.path.insert(0, str(REPO / "tests"))
        import test_reliability_files as rf
        with tempfile.TemporaryDirectory() as tmp:
            # one layer, few tokens: the whole file stays under MAX_LEN
            seeds["tiny-llama-f32"] = rf.tiny_model(Path(tmp) / "t.gguf")[:MAX_LEN]
    except Exception as e:      # gguf/numpy missing: the other seeds still cover the parser
        _log(f"no tiny-llama seed ({e})")
    for model in sorted((CACHE / "models").rglob("*.gguf"))[:1]:
        with open(model, "rb") as f:
            seeds[f"default-model-head-{model.stem}"] = f.read(MAX_LEN)
    paths = []
    for name, data in seeds.items():
        p = out / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        p.write_bytes(data)
        paths.append(p)
    return paths


def make_ext_seeds(root: Path = REPO / "tests" / "fuzz") -> dict[str, list[Path]]:
    """Write the seeds of ggml-ext's own targets into root/<EXT_SEEDS folder>/ (the committed ones): real
    files of a tiny llama (tests/convert_support.tiny, one KV head of 64 channels), each under MAX_LEN --
    its KV calibrations (nuq2..4, with and without outliers), its QDEC side file (layer 0 of a Q4_0 base),
    and small GGUF files of each of our tensor types made by our quantizers (CB2, CB3, APQ with its tables
    and keys, the interleaved Q4_0 / IQ4_NL layouts, an OOC side-car)."""
    import numpy as np
    sys.path.insert(0, str(REPO / "tests"))
    import convert_support as cs
    from ggml_ext import anyprec, quants
    from ggml_ext.converters import convert
    from ggml_ext.gguf import GGUFWriter
    from ggml_ext.kvquant import calibrate as kv_calibrate
    from ggml_ext.qdec.calibration import calibrate as dec_calibrate
    out: dict[str, list[Path]] = {}

    def put(target: str, name: str, path: Path) -> None:
        data = path.read_bytes()
        assert len(data) <= MAX_LEN, (name, len(data))
        d = root / EXT_SEEDS[target]
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
        out.setdefault(target, []).append(d / name)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = cs.tiny("llama", num_attention_heads=1, num_key_value_heads=1)
        text = tmp / "text.txt"
        text.write_text(" ".join(f"word{i} and some more text {i % 7}." for i in range(3000)))
        for frac in (0.01, 0.0):
            f = tmp / f"kv-{frac}.gguf"
            kv_calibrate(model, str(text), n_samples=2, seq_len=32, bits=(2, 3, 4), outliers=frac,
                         progress=False).save(f, force=True)
            put("fuzz_kv_calib", f"tiny-nuq234-outliers{frac}.gguf", f)
        base = tmp / "base.gguf"
        convert(model, base, "q4_0")
        side = tmp / "dec.gguf"
        dec_calibrate(base, model, str(text), n_samples=2, seq_len=32, layers={0}, progress=False).save(side, force=True)
        put("fuzz_qdec", "tiny-q4_0-layer0.dec.gguf", side)

        rng = np.random.default_rng(0)

        def write(name: str, tensors: list[tuple[str, tuple[int, ...], str, bytes]], kv=()) -> None:
            f = tmp / name
            w = GGUFWriter(f, force=True)
            w.add("general.architecture", "str", "llama")
            w.add("ggml_ext.format_version", "u32", quants.format_version())
            for k, vt, v in kv:
                w.add(k, vt, v)
            for tname, shape, tt, raw in tensors:
                w.add_tensor_info(tname, shape, quants.type_id(tt), len(raw))
            with w:
                for *_, raw in tensors:
                    w.write_tensor(np.frombuffer(raw, np.uint8))
            put("fuzz_ext_tensors", name, f)

        x = rng.standard_normal((4, 256)).astype(np.float32)
        for t in ("CB2", "CB3"):
            write(f"{t.lower()}.gguf", [("blk.0.attn_q.weight", (256, 4), t, quants.quantize(x, t).tobytes())])
        xi = rng.standard_normal((16, 64)).astype(np.float32)
        for t in (*quants.INTERLEAVED, *quants.INTERLEAVED_IQ4_NL):
            write(f"{t.lower()}.gguf", [("blk.0.ffn_up.weight", (64, 16), t, quants.quantize(xi, t).tobytes())])
        xa = rng.standard_normal((4, 64)).astype(np.float32)
        codes, tables = anyprec.quantize(xa, seed=3, parent=8)
        planes, t16 = anyprec.pack(codes, parent=8), anyprec.pack_tables(tables, seed=3, parent=8)
        write("apq-3-8.gguf", [("blk.0.attn_k.weight", (64, 4), "APQ", planes.tobytes()),
                               ("blk.0.attn_k.weight.apq_tables", (t16.size,), "F16", t16.tobytes())],
              kv=[("ggml_ext.anyprec.version", "u32", 1), ("ggml_ext.anyprec.seed_bits", "u32", 3),
                  ("ggml_ext.anyprec.parent_bits", "u32", 8)])
        q = quants.quantize(xi, "Q4_0").tobytes()
        idx = np.array([3, 17], np.int32)
        sv = rng.standard_normal((16, 2)).astype(np.float32)
        write("ooc-q4_0.gguf", [("blk.0.ffn_up.weight", (64, 16), "Q4_0", q),
                                ("blk.0.ffn_up.weight.ooc_idx", (2,), "I32", idx.tobytes()),
                                ("blk.0.ffn_up.weight.ooc_s", (2, 16), "F32", sv.tobytes())],
              kv=[("ggml_ext.ooc.version", "u32", 1)])
    return out


def seed_corpus(target: str, out: Path) -> list[Path]:
    """A fresh corpus of ``target`` in ``out``: ggml-ext's targets take their committed seeds and their
    regressions (tests/fuzz/regressions/<target without fuzz_>-*), the GGUF targets make_seeds'."""
    if target not in EXT_SEEDS:
        return make_seeds(out)
    out.mkdir(parents=True, exist_ok=True)
    files = committed_inputs(target)
    for f in files:
        shutil.copy(f, out / f.name)
    return [out / f.name for f in files]


def committed_inputs(target: str) -> list[Path]:
    """The committed inputs a target replays: its seeds and regressions (ggml-ext's targets), or the GGUF seeds
    and every regression (the GGUF targets)."""
    fuzz = REPO / "tests" / "fuzz"
    if target in EXT_SEEDS:
        tag = target.removeprefix("fuzz_").replace("_", "-")
        return sorted([*(fuzz / EXT_SEEDS[target]).iterdir(), *REGRESSIONS.glob(f"c-{tag}-*")])
    return sorted(p for d in ("gguf_seeds", "regressions") for p in (fuzz / d).iterdir() if p.is_file())


# ---------------------------------------------------------------- fuzzing


def parse_stats(log: str) -> dict:
    """libFuzzer's final stats and last status line."""
    st = {k: int(v) for k, v in re.findall(r"^stat::(\w+):\s+(\d+)", log, re.M)}
    last = [l for l in log.splitlines() if re.match(r"#\d+\s+(INITED|NEW|REDUCE|pulse|DONE)", l)]
    m = re.search(r"cov: (\d+) ft: (\d+) corp: (\d+)", last[-1]) if last else None
    if m:
        st.update(cov=int(m.group(1)), ft=int(m.group(2)), corpus=int(m.group(3)))
    return st


def run(target: str, seconds: int, corpus: Path | None, extra: list[str], workdir: Path) -> dict:
    exe = build(target) / target
    own_corpus = corpus is None
    corpus = corpus or workdir / f"corpus-{target}"
    if not corpus.exists() or not any(corpus.iterdir()):
        seed_corpus(target, corpus)
    n_seeds = len(list(corpus.iterdir()))
    artifacts = workdir / f"artifacts-{target}"
    artifacts.mkdir(parents=True, exist_ok=True)
    args = [str(exe), str(corpus), f"-max_total_time={seconds}", f"-max_len={MAX_LEN}", f"-dict={DICT}",
            "-rss_limit_mb=2048", "-malloc_limit_mb=2048", "-timeout=20", "-print_final_stats=1",
            f"-artifact_prefix={artifacts}/", *extra]
    t0 = time.time()
    from ggml_ext.tools import fresh_rusage
    r = subprocess.run(fresh_rusage(args), capture_output=True, text=True, errors="replace", env=sanitizer_env())
    log = r.stdout + r.stderr
    (workdir / f"{target}.log").write_text(log)
    # libFuzzer's findings (crash-, leak-, timeout-, oom-) apart from its slow-unit- notes: an input that took over
    # -report_slow_units (10 s) but finished is written there too, and is no failure (a starved CPU makes many)
    found = sorted(p.name for p in artifacts.iterdir())
    crashes = [n for n in found if not n.startswith("slow-unit-")]
    slow = [n for n in found if n.startswith("slow-unit-")]
    st = parse_stats(log)
    res = {"target": target, "seconds": round(time.time() - t0, 1), "returncode": r.returncode,
           "execs": st.get("number_of_executed_units", 0),
           "exec_per_s": st.get("average_exec_per_sec", 0), "cov": st.get("cov"), "ft": st.get("ft"),
           "seeds": n_seeds, "corpus": len(list(corpus.iterdir())), "peak_rss_mb": st.get("peak_rss_mb"),
           "crashes": crashes, "slow_units": slow, "log": str(workdir / f"{target}.log"), "corpus_dir": str(corpus),
           "artifacts": str(artifacts)}
    if own_corpus:
        res["corpus_dir"] = str(corpus)
    return res


def replay(target: str, files: list[Path]) -> int:
    exe = build(target) / target
    r = subprocess.run([str(exe), "-runs=1", *map(str, files)], env=sanitizer_env())
    return r.returncode


# ---------------------------------------------------------------- the hostile files under ASan/UBSan

SAN_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "SUMMARY: UndefinedBehavior")
# Hostile files that still fail in this build, with why; each must keep failing (else: remove it here).
# The build keeps assert() on (no NDEBUG), which the release build compiles out.
KNOWN: dict[str, str] = {}


def hostile(subset: int | None, jobs: int) -> dict:
    """load_gguf_model on every file of tests/reliability/test_reliability_files.py (or every N-th)."""
    from concurrent.futures import ThreadPoolExecutor
    exe = build("load_gguf_model") / "load_gguf_model"
    sys.path.insert(0, str(REPO / "tests"))
    import test_reliability_files as rf
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        rf._build_cases(Path(tmp) / "build")
        items = list(rf.CASES.items())
        if subset:
            items = items[::subset]
        files = []
        for i, (name, (data, expect)) in enumerate(items):
            p = Path(tmp) / f"case{i:03d}.gguf"
            p.write_bytes(data)
            files.append((name, p, expect))

        def one(item):
            name, p, expect = item
            try:
                r = subprocess.run([str(exe), str(p)], capture_output=True, text=True, errors="replace", timeout=120,
                                   env=sanitizer_env())
                rc, err = r.returncode, r.stderr
            except subprocess.TimeoutExpired:
                rc, err = "timeout", ""
            san = next((m for m in SAN_MARKERS if m in err), None)
            if (san or rc not in (0, 1)) and name in KNOWN:
                verdict = "known"
            elif san or rc not in (0, 1):
                verdict = "BUG"
            elif name in KNOWN:
                verdict = "known entry passes now: remove it from KNOWN"
            elif expect == "refuse" and rc == 0:
                verdict = "loaded (should refuse)"
            else:
                verdict = "ok"
            tail = "\n".join(err.strip().splitlines()[-25:]) if verdict != "ok" else ""
            return name, {"expect": expect, "rc": rc, "verdict": verdict, "sanitizer": san, "tail": tail}

        t0 = time.time()
        with ThreadPoolExecutor(jobs) as ex:
            for name, res in ex.map(one, files):
                results[name] = res
    bad = {k: v for k, v in results.items() if v["verdict"] not in ("ok", "known")}
    return {"files": len(results), "seconds": round(time.time() - t0, 1),
            "known": sorted(k for k, v in results.items() if v["verdict"] == "known"),
            "refused": sum(v["rc"] == 1 for v in results.values()),
            "loaded": sum(v["rc"] == 0 for v in results.values()), "bad": bad}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("build")
    s.add_argument("targets", nargs="*", help=f"default: all ({', '.join(TARGETS)}, load_gguf_model)")
    s = sub.add_parser("seeds")
    s.add_argument("out", type=Path, nargs="?", help="folder of the GGUF targets' seeds")
    s.add_argument("--ext", action="store_true", help="write the committed seeds of ggml-ext's targets again")
    s = sub.add_parser("run")
    s.add_argument("--target", choices=TARGETS, default="fuzz_gguf")
    s.add_argument("--seconds", type=int, default=60)
    s.add_argument("--corpus", type=Path, help="corpus folder (grows); default: a fresh copy of the seeds")
    s.add_argument("--workdir", type=Path, help="logs and crash inputs (default: a new temporary folder)")
    s.add_argument("--json", action="store_true")
    s.add_argument("libfuzzer_args", nargs="*")
    s = sub.add_parser("replay")
    s.add_argument("--target", choices=TARGETS, default="fuzz_gguf")
    s.add_argument("files", nargs="*", type=Path, help="default: the target's committed inputs")
    s = sub.add_parser("hostile")
    s.add_argument("--subset", type=int, help="only every N-th file")
    s.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    s.add_argument("--json", action="store_true")
    a = ap.parse_args()

    if a.cmd == "build":
        print(build(*a.targets))
    elif a.cmd == "seeds":
        if a.ext:
            for target, paths in make_ext_seeds().items():
                print(f"{target}: {len(paths)} seeds, {sum(p.stat().st_size for p in paths)} bytes")
        if a.out:
            for p in make_seeds(a.out):
                print(p)
    elif a.cmd == "run":
        workdir = a.workdir or Path(tempfile.mkdtemp(prefix="fuzz_gguf_c-"))
        workdir.mkdir(parents=True, exist_ok=True)
        res = run(a.target, a.seconds, a.corpus, a.libfuzzer_args, workdir)
        if a.json:
            print(json.dumps(res, indent=1))
        else:
            print(f"{res['target']}: {res['execs']} execs in {res['seconds']} s ({res['exec_per_s']}/s), "
                  f"cov {res['cov']} ft {res['ft']}, corpus {res['seeds']} -> {res['corpus']}, "
                  f"crashes {len(res['crashes'])}, slow units {len(res['slow_units'])} ({res['artifacts']}), "
                  f"log {res['log']}")
        return 1 if res["crashes"] or res["returncode"] != 0 else 0
    elif a.cmd == "replay":
        return replay(a.target, a.files or committed_inputs(a.target))
    elif a.cmd == "hostile":
        res = hostile(a.subset, a.jobs)
        if a.json:
            print(json.dumps(res, indent=1))
        else:
            print(f"{res['files']} files in {res['seconds']} s: {res['refused']} refused, {res['loaded']} loaded, "
                  f"{len(res['bad'])} bad")
            for name, v in res["bad"].items():
                print(f"--- {name}: {v['verdict']} rc={v['rc']} {v['sanitizer'] or ''}\n{v['tail']}")
        return 1 if res["bad"] else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
