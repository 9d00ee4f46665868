"""Our patched llama.cpp on Arm, end to end: scripts/build_aarch64.sh cross-builds it (the same
CMakeLists, patch series and ggml_ext sources; static; cached under ~/.cache/ggml-ext) and
llama-cli runs the default model under qemu-aarch64-static in plain Q4_0 and in each
interleaved layout.

- armv8.6-a+dotprod+i8mm build under `-cpu max`: every layout answers the question with
  "Paris"; qemu's translation log (-d in_asm, filtered to the kernels' address ranges) shows
  that our NEON dotprod GEMVs and dotprod / i8mm GEMMs ran on the interleaved files and
  upstream's runtime-repack kernels did not, and the reverse for plain Q4_0.
- the same for IQ4_NL (our converter) and its interleaved layouts: our table-lookup (TBL)
  dotprod GEMVs and i8mm GEMMs run the IQ4_NL_4_4 / 4_8 / 8_8 files, "Paris" each time.
- armv8-a build under `-cpu cortex-a53` (no dotprod, no i8mm): a Q4_0_8_8 file runs on our
  scalar kernels. The kernels are chosen from the compiler's target flags
  (formats/interleaved4/interleaved4_impl.h), so "any file on any CPU" means a build for that CPU's baseline.
- armv8.6-a+dotprod+i8mm+sve build under `-cpu max` with 256-bit SVE vectors (Graviton3's
  width): a Q4_0_8_8 file runs our SVE-256 GEMV and SVE SMMLA GEMM and answers "Paris".
- the codebook type CB2 (the default model's ``--type cb2`` file: CB2 ffn_down, IQ4_NL elsewhere):
  llama-perplexity under `-cpu max` runs our NEON dotprod codebook kernel (its address read from
  the binary's ``ggml_ext_codebooks_impl_neon_dotprod`` table, traced as above) and scores within 1.5% of
  our native x86 build (AVX2 kernel) on the same file.
- llama-perplexity on 2 windows of 128 tokens: Q4_0_4_8 (our i8mm GEMM) within 1% of plain
  Q4_0 (upstream's runtime repack into the same layout) under qemu, and plain Q4_0 under qemu
  within 1.5% of our native x86 build.

Greedy answers are compared with plain Q4_0 under the same build and with the native x86
run, and printed (-s shows them); identical text is not asserted: Q8_0 activations turn float
rounding differences between kernel paths into whole quantization steps (see
test_interleaved4_q4_0_gguf.py). The qemu runs go in parallel, one per core; qemu's timings
mean nothing and are not measured here.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import convert_support as cs
import qemu_support as qs
from ggml_ext import tools

pytestmark = pytest.mark.qemu

REPO = Path(__file__).resolve().parents[2]
PROMPT = "What is the capital of France? Answer in one sentence."
N_TOKENS = 12
QEMU_THREADS = 1
PPL_FILES = ("Q4_0", "Q4_0_4_8")
# One layout on the baseline build: the scalar kernels of all three share one driver, and each
# is checked against the reference under qemu armv8-a by test_interleaved4_kernels.py;
# 8x8 is the x86 layout, the file most likely to meet a small Arm core.
BASELINE_FILES = ("Q4_0_8_8",)
LAYOUTS = {"Q4_0_4_4": "4x4", "Q4_0_4_8": "4x8", "Q4_0_8_8": "8x8"}
FAST = "armv8.6-a+dotprod+i8mm"   # scripts/build_aarch64.sh's default
BASELINE = "armv8-a"
SVE = "armv8.6-a+dotprod+i8mm+sve"
SVE256_CPU = "max,sve-default-vector-length=32"   # bytes: Graviton3's 256-bit SVE
OURS_SVE = {"gemv_q4_0_8x8_sve256", "gemm_q4_0_8x8_sve256"}
# Which of our kernels each layout must run (GEMV: one activation row; GEMM: the prompt).
OURS_FAST = {
    "Q4_0_4_4": {"gemv_q4_0_4x4_dotprod", "gemm_q4_0_4x4_dotprod"},
    "Q4_0_4_8": {"gemv_q4_0_4x8_dotprod", "gemm_q4_0_4x8_i8mm"},
    "Q4_0_8_8": {"gemv_q4_0_8x8_dotprod", "gemm_q4_0_8x8_i8mm"},
}
IQ4_LAYOUTS = {"IQ4_NL_4_4": "4x4", "IQ4_NL_4_8": "4x8", "IQ4_NL_8_8": "8x8"}
OURS_FAST_IQ4 = {
    "IQ4_NL_4_4": {"gemv_iq4_nl_4x4_dotprod", "gemm_iq4_nl_4x4_dotprod"},
    "IQ4_NL_4_8": {"gemv_iq4_nl_4x8_dotprod", "gemm_iq4_nl_4x8_i8mm"},
    "IQ4_NL_8_8": {"gemv_iq4_nl_8x8_dotprod", "gemm_iq4_nl_8x8_i8mm"},
}
OURS_BASELINE = {name: {f"gemv_q4_0_{lay}_generic", f"gemm_q4_0_{lay}_generic"} for name, lay in LAYOUTS.items()}
# Our kernel entry points (arm/ and generic/) and upstream's repack GEMV/GEMM for Q4_0.
TRACED = re.compile(r"^(gem[mv]_(q4_0|iq4_nl)_[48]x[48]_(dotprod|i8mm|generic|sve256)"
                    r"|ggml_gem[mv]_(q4_0|iq4_nl)_[48]x[48]_q8_0)$")
UPSTREAM = re.compile(r"^ggml_gem[mv]_(q4_0|iq4_nl)_")


# binutils for aarch64 objects: the cross ones, or the host's own on an aarch64 host (scripts/build_aarch64.sh
# builds natively there)
BINUTILS = "" if qs.AARCH64_HOST else "aarch64-linux-gnu-"


def _missing_tools() -> list[str]:
    cc = ("gcc", "g++") if qs.AARCH64_HOST else ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++")
    return [t for t in (*cc, f"{BINUTILS}nm", "qemu-aarch64-static", "flock") if shutil.which(t) is None]


@pytest.fixture(scope="module", autouse=True)
def _needs_cross_tools():
    missing = _missing_tools()
    if missing and qs.AARCH64_HOST:
        # the runs are qemu's CPU models (cortex-a53, SVE-256, ...) and its translation log, also on Arm
        pytest.skip(f"{', '.join(missing)} not installed (an aarch64 host's make system-deps installs no qemu; "
                    "apt-get install qemu-user-static runs these here)")
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (make system-deps: gcc-aarch64-linux-gnu, "
                    "g++-aarch64-linux-gnu, qemu-user-static)")


def _build(march: str) -> Path:
    """The cached cross build's bin folder (built on first use: minutes; afterwards a no-op)."""
    r = subprocess.run(["bash", str(REPO / "scripts" / "build_aarch64.sh"), march], capture_output=True, text=True,
                       env={**tools.tool_env(), "PYTHON": sys.executable}, timeout=3600)
    assert r.returncode == 0, f"scripts/build_aarch64.sh {march} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fast_bin() -> Path:
    return _build(FAST)


@pytest.fixture(scope="module")
def baseline_bin() -> Path:
    return _build(BASELINE)


@pytest.fixture(scope="module")
def sve_bin() -> Path:
    return _build(SVE)


@pytest.fixture(scope="module")
def models(tmp_path_factory, iq4_nl_files) -> dict[str, Path]:
    """The default model converted to Q4_0 by our converter, and repacked into each layout; the
    same for IQ4_NL (conftest's iq4_nl_files)."""
    import ggml_ext
    from ggml_ext import assets, repack
    d = tmp_path_factory.mktemp("arm_models")
    out = {"Q4_0": d / "smollm2-q4_0.gguf"}
    ggml_ext.convert(assets.path("smollm2-hf"), out["Q4_0"], "q4_0")
    for name, layout in LAYOUTS.items():
        out[name] = d / f"smollm2-{name.lower()}.gguf"
        repack.repack(out["Q4_0"], out[name], layout)
    out["IQ4_NL"] = iq4_nl_files["iq4_nl"]
    out.update({name: iq4_nl_files[name] for name in IQ4_LAYOUTS})
    return out


@pytest.fixture(scope="module")
def text_slice(wiki_test, tmp_path_factory) -> Path:
    """The head of wiki-test: enough for 2 windows of 128 tokens, little for qemu to tokenize."""
    p = tmp_path_factory.mktemp("arm_text") / "wiki-head.txt"
    p.write_text(Path(wiki_test).read_text(encoding="utf-8")[:6000], encoding="utf-8")
    return p


def _symbols(exe: Path) -> dict[str, tuple[int, int]]:
    """Traced functions of the static executable: name -> (address, size)."""
    r = subprocess.run([f"{BINUTILS}nm", "-S", "--defined-only", str(exe)], capture_output=True, text=True,
                       check=True)
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT" and TRACED.match(parts[3]):
            out[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return out


def _cli_args(model: Path, out: Path, threads: int) -> list[str]:
    return ["-m", str(model), "-p", PROMPT, "-st", "-n", str(N_TOKENS), "--temp", "0", "--seed", "0", "-c", "256",
            "-t", str(threads), "--no-warmup", "--simple-io", "-o", str(out)]


def _ppl_args(model: Path, text: Path, threads: int) -> list[str]:
    return ["-m", str(model), "-f", str(text), "-c", "128", "--chunks", "2", "--no-warmup", "-t", str(threads)]


def _check(proc: subprocess.CompletedProcess) -> str:
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, proc.args))}\nexit {proc.returncode}:\n{log[-3000:]}"
    return log


def _answer(proc: subprocess.CompletedProcess, out: Path) -> str:
    _check(proc)
    text = out.read_text(encoding="utf-8")
    assert "Assistant:\n" in text, text
    return text.split("Assistant:\n", 1)[1].strip()


def _ppl(proc: subprocess.CompletedProcess) -> float:
    log = _check(proc)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    assert m, log[-3000:]
    return float(m.group(1))


def _qemu_cli(bin_dir: Path, cpu: str, model: Path, tmp: Path) -> tuple[str, set[str]]:
    """llama-cli's greedy answer under qemu, and which traced functions were translated (= ran)."""
    exe = bin_dir / "llama-cli"
    syms = _symbols(exe)
    assert len(syms) >= 6, f"kernel symbols not found in {exe}: {sorted(syms)}"
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", cpu)
    log, out = tmp / f"{model.stem}-{tag}.in_asm", tmp / f"{model.stem}-{tag}.txt"
    ranges = ",".join(f"{a:#x}+{s:#x}" for a, s in syms.values())
    cmd = ["qemu-aarch64-static", "-cpu", cpu, "-d", "in_asm", "-dfilter", ranges, "-D", str(log), str(exe),
           *_cli_args(model, out, QEMU_THREADS)]
    answer = _answer(subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL), out)
    pcs = {int(m, 16) for m in re.findall(r"^(0x[0-9a-f]+):", log.read_text(errors="replace"), re.M)}
    ran = {name for name, (a, s) in syms.items() if any(a <= pc < a + s for pc in pcs)}
    return answer, ran


def _impl_kernels(exe: Path, table: str) -> dict[int, int]:
    """The functions a family's kernel table (a ``struct { name; ...; fn[] }`` in .data.rel.ro of the
    static, non-PIE executable) points to: address -> size. Static kernels share names across
    implementations (mm_cb2 in arm/ and generic/), so the table says which one is NEON's."""
    nm = subprocess.run([f"{BINUTILS}nm", "-S", "--defined-only", str(exe)], capture_output=True, text=True,
                        check=True).stdout.splitlines()
    sizes = {int(p[0], 16): int(p[1], 16) for p in (line.split() for line in nm) if len(p) == 4 and p[2] in "tT"}
    entry = [p for p in (line.split() for line in nm) if len(p) == 4 and p[3] == table]
    assert entry, f"{table} not in {exe}"
    addr, size = int(entry[0][0], 16), int(entry[0][1], 16)
    dump = subprocess.run([f"{BINUTILS}objdump", "-s", f"--start-address={addr:#x}",
                           f"--stop-address={addr + size:#x}", str(exe)], capture_output=True, text=True, check=True)
    raw = b"".join(bytes.fromhex("".join(m.split()[1:5])) for m in dump.stdout.splitlines()
                   if re.match(r"^ [0-9a-f]+ ", m))
    ptrs = struct.unpack_from(f"<{len(raw) // 8}Q", raw)
    return {p: sizes[p] for p in ptrs if p in sizes}


def _qemu_ppl_traced(bin_dir: Path, model: Path, text: Path, kernels: dict[int, int], tmp: Path) -> tuple[float, bool]:
    """llama-perplexity under qemu -cpu max, and whether any of ``kernels`` (address -> size) ran."""
    log = tmp / f"{model.stem}-ppl.in_asm"
    ranges = ",".join(f"{a:#x}+{s:#x}" for a, s in kernels.items())
    cmd = ["qemu-aarch64-static", "-cpu", "max", "-d", "in_asm", "-dfilter", ranges, "-D", str(log),
           str(bin_dir / "llama-perplexity"), *_ppl_args(model, text, QEMU_THREADS)]
    ppl = _ppl(subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL))
    pcs = {int(m, 16) for m in re.findall(r"^(0x[0-9a-f]+):", log.read_text(errors="replace"), re.M)}
    return ppl, any(a <= pc < a + s for pc in pcs for a, s in kernels.items())


def _qemu_ppl(bin_dir: Path, model: Path, text: Path) -> float:
    cmd = ["qemu-aarch64-static", "-cpu", "max", str(bin_dir / "llama-perplexity"),
           *_ppl_args(model, text, QEMU_THREADS)]
    return _ppl(subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL))


@pytest.fixture(scope="module")
def cb2_model() -> Path:
    return cs.cached_cb2_file()


@pytest.fixture(scope="module")
def qemu(fast_bin, baseline_bin, sve_bin, models, cb2_model, text_slice, tmp_path_factory):
    """Every qemu run of the module at once, one per core (each single-threaded: ggml's spinning
    worker threads only slow qemu down on a shared machine). Values are results or the exception."""
    tmp = tmp_path_factory.mktemp("arm_qemu")
    jobs = {("max", name): (_qemu_cli, fast_bin, "max", path, tmp) for name, path in models.items()}
    jobs.update({("cortex-a53", name): (_qemu_cli, baseline_bin, "cortex-a53", models[name], tmp)
                 for name in BASELINE_FILES})
    jobs[("sve256", "Q4_0_8_8")] = (_qemu_cli, sve_bin, SVE256_CPU, models["Q4_0_8_8"], tmp)
    jobs.update({("ppl", name): (_qemu_ppl, fast_bin, models[name], text_slice) for name in PPL_FILES})
    neon_cb = _impl_kernels(fast_bin / "llama-perplexity", "ggml_ext_codebooks_impl_neon_dotprod")
    jobs[("ppl", "CB2")] = (_qemu_ppl_traced, fast_bin, cb2_model, text_slice, neon_cb, tmp)
    return qs.run_parallel(jobs)


_get = qs.result


@pytest.fixture(scope="module")
def native(models, text_slice, tmp_path_factory, tool_env, threads):
    """Our native (x86) build on the same files: the answer and the perplexity of plain Q4_0."""
    out = tmp_path_factory.mktemp("native") / "q4_0.txt"
    run = dict(env=tool_env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    answer = _answer(subprocess.run(tools.command("llama-cli", *_cli_args(models["Q4_0"], out, threads)), **run), out)
    ppl_cmd = tools.command("llama-perplexity", *_ppl_args(models["Q4_0"], text_slice, threads))
    ppl = _ppl(subprocess.run(ppl_cmd, **run))
    return answer, ppl


def _elf_machine_and_interp(exe: Path) -> tuple[int, bool]:
    with open(exe, "rb") as f:
        head = f.read(64)
        assert head[:4] == b"\x7fELF" and head[4] == 2, f"{exe} is not a 64-bit ELF file"
        machine = struct.unpack_from("<H", head, 18)[0]
        phoff, phentsize, phnum = struct.unpack_from("<Q", head, 32)[0], *struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        ph = f.read(phentsize * phnum)
    interp = any(struct.unpack_from("<I", ph, i * phentsize)[0] == 3 for i in range(phnum))  # PT_INTERP
    return machine, interp


@pytest.mark.parametrize("march", [FAST, BASELINE])
def test_cross_build_is_static_aarch64(fast_bin, baseline_bin, march):
    bin_dir = fast_bin if march == FAST else baseline_bin
    for tool in ("llama-cli", "llama-perplexity"):
        machine, interp = _elf_machine_and_interp(bin_dir / tool)
        assert machine == 183, f"{tool}: e_machine {machine}, not EM_AARCH64"
        assert not interp, f"{tool} is dynamically linked"
    assert (bin_dir.parent / "march").read_text().strip() == march


def test_rebuild_with_nothing_changed_is_a_no_op(fast_bin):
    """The stamp (the output folder's key) matches: no configure, no build, same folder."""
    logs = [fast_bin.parents[1] / f for f in ("configure.log", "build.log")]
    before = [p.stat().st_mtime_ns for p in logs]
    r = subprocess.run(["bash", str(REPO / "scripts" / "build_aarch64.sh")], capture_output=True, text=True,
                       env={**tools.tool_env(), "PYTHON": sys.executable}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert Path(r.stdout.strip()) == fast_bin
    assert [p.stat().st_mtime_ns for p in logs] == before, "the stamped build ran cmake again"


def test_build_refuses_a_bad_march():
    r = subprocess.run(["bash", str(REPO / "scripts" / "build_aarch64.sh"), "armv8-a; true"], capture_output=True,
                       text=True, env={**tools.tool_env(), "PYTHON": sys.executable}, timeout=60)
    assert r.returncode == 2 and "bad -march 'armv8-a; true'" in r.stderr, r.stderr
    assert not r.stdout


@pytest.mark.parametrize("name", ["IQ4_NL", *IQ4_LAYOUTS])
def test_iq4_nl_files_answer_under_qemu_cpu_max(qemu, name):
    answer, ran = _get(qemu, ("max", name))
    plain = _get(qemu, ("max", "IQ4_NL"))[0]
    print(f"\n{name} (qemu -cpu max, {FAST}): {answer!r}\n  same text as IQ4_NL under qemu: {answer == plain}")
    assert "Paris" in answer, answer
    if name in OURS_FAST_IQ4:
        assert OURS_FAST_IQ4[name] <= ran, f"expected {sorted(OURS_FAST_IQ4[name])} to run, traced {sorted(ran)}"
        assert not {f for f in ran if UPSTREAM.match(f) or f.endswith("_generic")}, sorted(ran)


@pytest.mark.parametrize("name", ["Q4_0", *LAYOUTS])
def test_llama_cli_answers_under_qemu_cpu_max(qemu, native, name):
    answer, _ = _get(qemu, ("max", name))
    q4_0 = _get(qemu, ("max", "Q4_0"))[0]
    print(f"\n{name} (qemu -cpu max, {FAST}): {answer!r}\n  same text as Q4_0 under qemu: {answer == q4_0}; "
          f"as native x86 Q4_0: {answer == native[0]}")
    assert "Paris" in answer, answer


@pytest.mark.parametrize("name", LAYOUTS)
def test_our_neon_kernels_run_the_interleaved_files(qemu, name):
    _, ran = _get(qemu, ("max", name))
    assert OURS_FAST[name] <= ran, f"expected {sorted(OURS_FAST[name])} to run, traced {sorted(ran)}"
    assert not {f for f in ran if UPSTREAM.match(f)}, f"upstream's repack kernels ran on an interleaved file: {ran}"
    assert not {f for f in ran if f.endswith("_generic")}, f"a scalar kernel ran beside the NEON ones: {sorted(ran)}"


def test_plain_q4_0_runs_upstreams_runtime_repack_not_ours(qemu):
    _, ran = _get(qemu, ("max", "Q4_0"))
    assert {f for f in ran if UPSTREAM.match(f)}, f"upstream's repack kernels did not run: {sorted(ran)}"
    assert not {f for f in ran if not UPSTREAM.match(f)}, f"our kernels ran on a plain Q4_0 file: {sorted(ran)}"


@pytest.mark.parametrize("name", BASELINE_FILES)
def test_baseline_build_on_a_cpu_without_dotprod(qemu, name):
    """armv8-a build under -cpu cortex-a53: our scalar kernels, a sensible answer."""
    answer, ran = _get(qemu, ("cortex-a53", name))
    print(f"\n{name} (qemu -cpu cortex-a53, {BASELINE}): {answer!r}\n  same text as under -cpu max: "
          f"{answer == _get(qemu, ('max', name))[0]}")
    assert OURS_BASELINE[name] <= ran, f"expected {sorted(OURS_BASELINE[name])} to run, traced {sorted(ran)}"
    assert not {f for f in ran if not f.endswith("_generic")}, f"a SIMD kernel ran: {sorted(ran)}"
    assert "Paris" in answer, answer


def test_sve256_kernels_run_a_q4_0_8_8_file(qemu):
    """+sve build, 256-bit vectors: the dispatcher takes our SVE kernels (only at that width)."""
    answer, ran = _get(qemu, ("sve256", "Q4_0_8_8"))
    print(f"\nQ4_0_8_8 (qemu -cpu {SVE256_CPU}, {SVE}): {answer!r}")
    assert OURS_SVE <= ran, f"expected {sorted(OURS_SVE)} to run, traced {sorted(ran)}"
    assert not {f for f in ran if UPSTREAM.match(f) or f.endswith("_generic")}, sorted(ran)
    assert "Paris" in answer, answer


def test_perplexity_under_qemu_matches_q4_0_and_native_x86(qemu, native):
    """2 windows of 128 tokens (64 scored each): our i8mm GEMM on Q4_0_4_8 against upstream's
    runtime repack of the same Q4_0 into the same layout (measured 0.1% apart), and against
    our x86 build (0.6%); a wrong kernel lands far outside 1.5%."""
    ppl = {name: _get(qemu, ("ppl", name)) for name in PPL_FILES}
    print(f"\nperplexity, 2 x 128 tokens: qemu {ppl}, native x86 Q4_0 {native[1]:.4f}")
    assert abs(ppl["Q4_0_4_8"] - ppl["Q4_0"]) <= 0.01 * ppl["Q4_0"], ppl
    assert abs(ppl["Q4_0"] - native[1]) <= 0.015 * native[1], (ppl, native[1])


def test_cb2_file_under_qemu_runs_our_neon_codebook_kernel_and_matches_x86(qemu, cb2_model, text_slice, tool_env,
                                                                          threads):
    """The codebook type end to end on Arm: llama-perplexity of the CB2 file under -cpu max (our NEON
    dotprod kernel, merged codebook+code index, one TBL per 16 weights, SDOT) against our x86 build's
    AVX2 kernel on the same file and windows; both use Q8_K activations, so they agree to rounding
    (a decoding error in either kernel gives a perplexity off by far more than 1.5%)."""
    ppl, ran = _get(qemu, ("ppl", "CB2"))
    run = dict(env=tool_env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    x86 = _ppl(subprocess.run(tools.command("llama-perplexity", *_ppl_args(cb2_model, text_slice, threads)), **run))
    print(f"\nCB2 file, 2 x 128 tokens: qemu (NEON) {ppl:.4f}, native x86 {x86:.4f}; NEON kernel ran: {ran}")
    assert ran, "the NEON codebook kernel (ggml_ext_codebooks_impl_neon_dotprod) was not traced"
    assert abs(ppl - x86) <= 0.015 * x86, (ppl, x86)
