"""The release bundles of `make dist` (scripts/dist.sh), run as a user runs them: unpacked into an empty folder,
started from there, nothing installed.

- Each bundle holds the six programs and every library they need but glibc's, found through RPATH $ORIGIN/../lib;
  the CPU backend comes as one module per variant, next to the programs.
- aarch64, under qemu-aarch64-static with one CPU model per level the variants cover: ggml loads the variant
  the CPU calls for (the load log names the file: llama-bench prints it, the tools on common's log keep it below
  their default verbosity), and llama-cli's greedy answer on a Q4_0_4_8 file of the default model is the same
  text as our native x86 build's. The glibc comes from the cross toolchain's sysroot
  (/usr/aarch64-linux-gnu, qemu -L); the last aarch64 test runs it on Debian's own arm64
  userland instead (scripts/arm64_userland.sh: debootstrap, every exec through qemu by proot).
- x86_64, natively: a variant this CPU can run is loaded, the same greedy answer; its llama-server answers
  /v1/chat/completions, and the aarch64 one does under qemu; `ggml-ext chat` (llama-cpp-python) runs on the
  bundle's libraries through GGML_EXT_PREFIX.

The bundles are not built here (`make dist` takes tens of minutes on 2 cores): `make test-arm` builds them and
runs this file; without them these tests skip. qemu's timings mean nothing and are not measured.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import urllib.request
from pathlib import Path

import pytest

import qemu_support as qs
from ggml_ext import tools

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
DIST = Path(os.environ.get("GGML_EXT_DIST", REPO / "dist"))
# Debian's libc6-arm64-cross, installed with the cross compilers; an aarch64 host's own glibc
SYSROOT = Path("/") if qs.AARCH64_HOST else Path("/usr/aarch64-linux-gnu")
PROGRAMS = ("llama-server", "llama-cli", "llama-bench", "llama-perplexity", "llama-quantize", "ggml-rpc-server")
PROMPT = "What is the capital of France? Answer in one sentence."
N_TOKENS = 12
# What a bundle may take from the system (scripts/dist.sh refuses anything else).
SYSTEM_LIBS = re.compile(r"^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|ld-linux-aarch64)\.so\.[0-9]+$")
LOADED = re.compile(r"loaded CPU backend from (\S*)libggml-cpu-([\w.]+)\.so")

# One qemu CPU model per level of upstream's aarch64 variants (ggml/src/CMakeLists.txt), with the variant its
# features call for. Where this qemu lacks the named core (qemu 7.2 stops at neoverse-n1), `max` with SME off
# and the vector length set stands in; its SVE2 cannot be turned off, so the SVE-256 stand-in gets armv8.6_2
# where a real Neoverse V1 (SVE, no SVE2) gets armv8.6_1.
QEMU_MODELS = {
    "armv8.0": [("cortex-a53", "armv8.0_1")],
    "dotprod": [("cortex-a76", "armv8.2_2")],
    "i8mm-sve128": [("neoverse-n2", "armv8.6_2"), ("max,sme=off,sve-default-vector-length=16", "armv8.6_2")],
    "sve256": [("neoverse-v1", "armv8.6_1"), ("max,sme=off,sve-default-vector-length=32", "armv8.6_2")],
}
# x86 variants that leave AVX2 unused: never the pick on a CPU that has it.
X86_BELOW_AVX2 = {"x64", "sse42", "sandybridge", "ivybridge", "piledriver"}


def _tarball(arch: str) -> Path:
    return DIST / f"ggml-ext-{VERSION}-linux-{arch}.tar.gz"


def _unpack(arch: str, tmp_path_factory) -> Path:
    tar = _tarball(arch)
    if not tar.exists():
        pytest.skip(f"{tar.relative_to(REPO) if tar.is_relative_to(REPO) else tar} not built "
                    "(make dist; make test-arm builds it and runs these tests)")
    d = tmp_path_factory.mktemp(f"bundle-{arch}")
    with tarfile.open(tar) as t:
        t.extractall(d, filter="tar")
    root = d / tar.name.removesuffix(".tar.gz")
    assert root.is_dir(), sorted(p.name for p in d.iterdir())
    return root


@pytest.fixture(scope="module")
def x86_bundle(tmp_path_factory) -> Path:
    return _unpack("x86_64", tmp_path_factory)


@pytest.fixture(scope="module")
def arm_bundle(tmp_path_factory) -> Path:
    return _unpack("aarch64", tmp_path_factory)


def _qemu_missing() -> str | None:
    if shutil.which("qemu-aarch64-static") is None:
        if qs.AARCH64_HOST:  # the runs are qemu's CPU models, one per variant level, also on Arm
            return ("qemu-aarch64-static not installed (an aarch64 host's make system-deps installs no qemu; "
                    "apt-get install qemu-user-static runs these here)")
        return "qemu-aarch64-static not installed (make system-deps: qemu-user-static)"
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        return f"no aarch64 glibc in {SYSROOT} (make system-deps: gcc-aarch64-linux-gnu brings libc6-arm64-cross)"
    return None


@functools.cache
def _qemu() -> str:
    """qemu-aarch64-static by its path on the tests' PATH (make test-arm puts one with the Neoverse models first: the
    programs run with a bare environment, whose PATH would find the system's)."""
    return shutil.which("qemu-aarch64-static") or "qemu-aarch64-static"


@functools.cache
def _qemu_cpus() -> set[str]:
    out = subprocess.run([_qemu(), "-cpu", "help"], capture_output=True, text=True).stdout
    return set(out.split())


def _qemu_model(level: str) -> tuple[str, str]:
    """(qemu -cpu argument, expected variant) for one level: the named core where this qemu has it."""
    named, *stand_in = QEMU_MODELS[level]
    return named if named[0] in _qemu_cpus() or not stand_in else stand_in[0]


def _cli_args(model: Path, out: Path) -> list[str]:
    return ["-m", str(model), "-p", PROMPT, "-st", "-n", str(N_TOKENS), "--temp", "0", "--seed", "0", "-c", "256",
            "-t", "1", "--no-warmup", "--simple-io", "-o", str(out)]


def _answer(proc: subprocess.CompletedProcess, out: Path) -> tuple[str, str]:
    """(the greedy answer, the load log)."""
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, proc.args))}\nexit {proc.returncode}:\n{log[-3000:]}"
    text = out.read_text(encoding="utf-8")
    assert "Assistant:\n" in text, text
    return text.split("Assistant:\n", 1)[1].strip(), log


def _load_log(bench: list[str]) -> str:
    """What the bundle's backend loader says at start (llama-bench --version: the same loader as every tool)."""
    proc = subprocess.run([*bench, "--version"], env=_bare_env(), capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def _variant(log: str, bundle: Path) -> str:
    m = LOADED.search(log)
    assert m, f"no CPU backend load in the log:\n{log[-3000:]}"
    assert Path(m.group(1)).resolve() == (bundle / "bin").resolve(), f"loaded from outside the bundle: {m.group(0)}"
    return m.group(2)


def _bare_env() -> dict[str, str]:
    """No LD_LIBRARY_PATH or anything else pointing at our installed build: the bundle must find its own."""
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def model(q4_0_files) -> Path:
    """The default model converted to Q4_0 by our converter and repacked to Q4_0_4_8 (conftest)."""
    return q4_0_files["Q4_0_4_8"]


@pytest.fixture(scope="module")
def native_answer(model, tool_env, tmp_path_factory) -> str:
    """Our native x86 build's (the installed package's) greedy answer: the reference."""
    out = tmp_path_factory.mktemp("native") / "answer.txt"
    proc = subprocess.run(tools.command("llama-cli", *_cli_args(model, out)), env=tool_env, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    return _answer(proc, out)[0]


@pytest.fixture(scope="module")
def qemu_runs(arm_bundle, model, tmp_path_factory) -> dict:
    """llama-cli of the aarch64 bundle under every qemu model at once, one per core; level -> (cpu, expected
    variant, answer, log) or the exception."""
    if why := _qemu_missing():
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("qemu")

    def run(level: str):
        cpu, expected = _qemu_model(level)
        out = tmp / f"{level}.txt"
        qemu = [_qemu(), "-cpu", cpu, "-L", str(SYSROOT)]
        proc = subprocess.run([*qemu, str(arm_bundle / "bin" / "llama-cli"), *_cli_args(model, out)], env=_bare_env(),
                              cwd=tmp, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        return cpu, expected, _answer(proc, out)[0], _load_log([*qemu, str(arm_bundle / "bin" / "llama-bench")])

    return qs.run_parallel({level: (run, level) for level in QEMU_MODELS})


def _elf(path: Path) -> tuple[int, list[str], str] | None:
    """(e_machine, NEEDED, RUNPATH/RPATH) of an ELF file, None for anything else."""
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        return None
    r = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", r)
    rpath = re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.+)\]", r)
    return int.from_bytes(head[18:20], "little"), needed, rpath[0] if rpath else ""


@pytest.mark.parametrize("arch,machine", [("x86_64", 62), ("aarch64", 183)])
def test_bundle_holds_every_library_it_needs(arch, machine, tmp_path_factory):
    if shutil.which("readelf") is None:
        pytest.skip("readelf not installed (binutils)")
    root = _unpack(arch, tmp_path_factory)
    for p in PROGRAMS:
        assert (root / "bin" / p).is_file(), f"{p} missing from the bundle"
    variants = sorted(p.name for p in (root / "bin").glob("libggml-cpu-*.so"))
    assert len(variants) >= 2, variants
    inside = {p.name for p in (root / "lib").iterdir()} | {p.name for p in (root / "bin").iterdir()}
    for f in [*(root / "bin").iterdir(), *(root / "lib").iterdir()]:
        elf = _elf(f)
        if elf is None:
            continue
        m, needed, rpath = elf
        assert m == machine, f"{f.name}: e_machine {m}"
        outside = [n for n in needed if n not in inside and not SYSTEM_LIBS.match(n)]
        assert not outside, f"{f.name} needs {outside} from outside the bundle"
        if any(n in inside for n in needed):
            assert "$ORIGIN/../lib" in rpath.split(":") or "$ORIGIN" in rpath.split(":"), f"{f.name}: RPATH {rpath!r}"


@pytest.mark.parametrize("level", QEMU_MODELS)
def test_aarch64_bundle_picks_the_variant_and_answers_as_x86(qemu_runs, arm_bundle, native_answer, level):
    cpu, expected, answer, log = qs.result(qemu_runs, level)
    variant = _variant(log, arm_bundle)
    print(f"\n{level}: qemu -cpu {cpu} -> libggml-cpu-{variant}.so; answer {answer!r}; "
          f"same as native x86: {answer == native_answer}")
    assert variant == expected, f"qemu -cpu {cpu}: loaded {variant}, expected {expected}"
    assert answer == native_answer, f"qemu -cpu {cpu} ({variant}): {answer!r}\nnative x86: {native_answer!r}"


def test_x86_bundle_picks_a_variant_and_answers_as_the_native_build(x86_bundle, model, native_answer, tmp_path):
    out = tmp_path / "answer.txt"
    proc = subprocess.run([str(x86_bundle / "bin" / "llama-cli"), *_cli_args(model, out)], env=_bare_env(),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    answer = _answer(proc, out)[0]
    variant = _variant(_load_log([str(x86_bundle / "bin" / "llama-bench")]), x86_bundle)
    flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    print(f"\nx86_64 bundle: libggml-cpu-{variant}.so; answer {answer!r}; same as native: {answer == native_answer}")
    if "avx2" in flags:
        assert variant not in X86_BELOW_AVX2, f"an AVX2 CPU got the {variant} variant"
    assert answer == native_answer, f"bundle ({variant}): {answer!r}\nnative build: {native_answer!r}"


def test_python_package_chats_on_the_x86_bundle_libraries(x86_bundle, model, native_answer, tmp_path):
    """`ggml-ext chat` (llama-cpp-python) on the bundle's libraries (GGML_EXT_PREFIX): the package points ggml at
    bin/, where the CPU variants are (llama_cpp_glue), and answers greedily as llama-cli does."""
    env = {**_bare_env(), "GGML_EXT_PREFIX": str(x86_bundle)}
    proc = subprocess.run([sys.executable, "-m", "ggml_ext.cli", "chat", str(model), "--prompt", PROMPT, "-n",
                           str(N_TOKENS), "-t", "1"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    variant = _variant(proc.stdout + proc.stderr, x86_bundle)
    answer = proc.stdout.strip().splitlines()[-1].strip()
    print(f"\nggml-ext chat on the x86_64 bundle ({variant}): {answer!r}")
    assert answer == native_answer, f"{answer!r}\nllama-cli, native build: {native_answer!r}"


def _chat(port: int, proc: subprocess.Popen, log: Path, load_s: float) -> dict:
    """POST /v1/chat/completions once the server is up (serve.wait_ready: /health answers 200)."""
    from ggml_ext import serve
    url = f"http://127.0.0.1:{port}"
    try:
        serve.wait_ready(proc, url, load_s)  # load_s guards against a hang; it is no timing check
    except (RuntimeError, TimeoutError) as e:
        raise AssertionError(f"{e}:\n{log.read_text()[-3000:]}") from None
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=max(60.0, load_s)) as r:
        assert r.status == 200
        return json.loads(r.read())


def _serve(cmd: list[str], port: int, tmp: Path, load_s: float) -> str:
    log = tmp / "server.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=_bare_env(), cwd=tmp, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            reply = _chat(port, proc, log, load_s)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    content = reply["choices"][0]["message"]["content"]
    assert content.strip(), reply
    return content


def _server_args(model: Path, port: int) -> list[str]:
    return ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-t", "1", "--no-warmup"]


def test_x86_bundle_server_answers_chat_completions(x86_bundle, model, tmp_path):
    from ggml_ext import serve
    port = serve.free_port()
    content = _serve([str(x86_bundle / "bin" / "llama-server"), *_server_args(model, port)], port, tmp_path, 120)
    print(f"\nx86_64 bundle llama-server: {content!r}")


def test_aarch64_bundle_server_answers_chat_completions_under_qemu(arm_bundle, model, tmp_path):
    if why := _qemu_missing():
        pytest.skip(why)
    from ggml_ext import serve
    port = serve.free_port()
    cmd = [_qemu(), "-cpu", "cortex-a76", "-L", str(SYSROOT), str(arm_bundle / "bin" / "llama-server"),
           *_server_args(model, port)]
    content = _serve(cmd, port, tmp_path, 900)
    print(f"\naarch64 bundle llama-server under qemu -cpu cortex-a76: {content!r}")


@pytest.fixture(scope="module")
def userland() -> Path:
    """The Debian arm64 userland of scripts/arm64_userland.sh (made on first use: minutes, Debian's mirror)."""
    missing = [t for t in ("proot", "qemu-aarch64-static", "debootstrap") if shutil.which(t) is None
               and not Path("/usr/sbin", t).exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install proot debootstrap qemu-user-static)")
    root = Path(os.environ.get("GGML_EXT_CACHE", Path.home() / ".cache" / "ggml-ext")) / "debian-arm64-bookworm"
    if not (root / ".complete").exists() and os.environ.get("GGML_EXT_ARM_USERLAND") != "make":
        # tens of minutes under qemu: made by `make test-arm` only, reused by any later run
        pytest.skip(f"no Debian arm64 userland in {root} (make test-arm makes it: scripts/arm64_userland.sh)")
    r = subprocess.run(["bash", str(REPO / "scripts" / "arm64_userland.sh")], capture_output=True, text=True,
                       timeout=3600)
    if r.returncode != 0:
        pytest.skip(f"no Debian arm64 userland (scripts/arm64_userland.sh; Debian's mirror unreachable?):\n"
                    f"{r.stderr[-1500:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def _proot(root: Path, cpu: str, binds: dict[Path, str], *argv: str) -> list[str]:
    cmd = ["proot", "-q", f"{_qemu()} -cpu {cpu}", "-r", str(root), "-w", "/"]
    for host, guest in binds.items():
        cmd += ["-b", f"{host}:{guest}"]
    return [*cmd, *argv]


def test_aarch64_bundle_runs_on_a_debian_arm64_userland(arm_bundle, userland, model, native_answer, tmp_path):
    """The bundle on Debian's own arm64 glibc (every exec through qemu, proot): its libraries resolve to the
    bundle's lib/ and glibc to the userland's; the greedy answer is the native x86 build's."""
    binds = {arm_bundle: "/opt/bundle", model.parent: "/models", tmp_path: "/out"}
    # the dynamic loader's own listing (what ldd runs; ldd's `test -r` is refused under proot's qemu)
    ldd = subprocess.run(_proot(userland, "cortex-a76", binds, "/lib/ld-linux-aarch64.so.1", "--list",
                                "/opt/bundle/bin/llama-cli"),
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert ldd.returncode == 0, ldd.stdout + ldd.stderr
    print(f"\nlibraries under the Debian arm64 userland:\n{ldd.stdout}")
    assert re.search(r"libllama\.so => /opt/bundle/bin/\.\./lib/libllama\.so", ldd.stdout), ldd.stdout
    assert re.search(r"libc\.so\.6 => /lib/aarch64-linux-gnu/libc\.so\.6", ldd.stdout), ldd.stdout
    args = _cli_args(Path("/models") / model.name, Path("/out/answer.txt"))
    proc = subprocess.run(_proot(userland, "cortex-a76", binds, "/opt/bundle/bin/llama-cli", *args), env=_bare_env(),
                          capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    answer = _answer(proc, tmp_path / "answer.txt")[0]
    log = _load_log(_proot(userland, "cortex-a76", binds, "/opt/bundle/bin/llama-bench"))
    m = LOADED.search(log)
    assert m and m.group(1).startswith("/opt/bundle/bin/") and m.group(2) == "armv8.2_2", log[-3000:]
    print(f"Debian arm64 userland, qemu -cpu cortex-a76: libggml-cpu-{m.group(2)}.so; answer {answer!r}")
    assert answer == native_answer, f"{answer!r}\nnative x86: {native_answer!r}"


def test_dist_refuses_an_unknown_architecture():
    r = subprocess.run(["bash", str(REPO / "scripts" / "dist.sh"), "mips"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHON": os.environ.get("PYTHON", "python3")})
    assert r.returncode == 2 and "unknown architecture 'mips'" in r.stderr, r.stderr
