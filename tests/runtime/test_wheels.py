"""The Python wheels of `make wheels` (scripts/build_wheels.py), installed as a user installs them: into a clean venv,
offline, from dist/ alone (`pip --isolated install --no-index --find-links dist ggml-ext[python-bindings]`).

- llama-cpp-python comes in as the pure wheel built with -DLLAMA_BUILD=OFF: no library of its own, nothing compiled.
- `ggml-ext chat` answers greedily as our native build's llama-cli does (the wheel's libraries are the x86_64
  bundle's, so ggml picks a CPU variant at run time), `ggml-ext serve` answers /v1/chat/completions, and plain
  `from llama_cpp import Llama` generates the same greedy tokens as in the venv of our normal build.
- The aarch64 wheel, in a venv of the Debian arm64 userland (scripts/arm64_userland.sh, every exec through qemu by
  proot): `ggml-ext chat` gives the native x86 answer.

The wheels are not built here (`make wheels` packages the bundles of the slow `make dist`): without them in dist/
these tests skip.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_dist import (DIST, N_TOKENS, PROMPT, VERSION, _bare_env, _proot, _serve, model,  # noqa: F401 - fixtures
                       native_answer, userland)

if not any(DIST.glob(f"ggml_ext-{VERSION}-*.whl")):
    # before any fixture: a clone without wheels pays nothing here (the model fixtures convert a model)
    pytest.skip(f"no ggml-ext wheels in {DIST} (make wheels, after make dist)", allow_module_level=True)

PIP_OFFLINE = ["--isolated", "install", "-q", "--no-index", "--find-links", "{dist}", "ggml-ext[python-bindings]"]
# Greedy tokens from llama-cpp-python's own API, and where its libllama came from.
LLAMA_SCRIPT = """
import json, sys
from llama_cpp import Llama
import llama_cpp
llm = Llama(sys.argv[1], n_ctx=256, n_threads=1, seed=0, verbose=False)
tokens = []
for t in llm.generate(llm.tokenize(sys.argv[2].encode()), temp=0.0):
    tokens.append(t)
    if len(tokens) == int(sys.argv[3]):
        break
print(json.dumps({"lib": str(llama_cpp.llama_cpp._base_path), "tokens": tokens,
                  "text": llm.detokenize(tokens).decode(errors="replace")}))
"""


def _wheel(arch: str) -> Path:
    found = sorted(DIST.glob(f"ggml_ext-{VERSION}-py3-none-manylinux_2_*_{arch}.whl"))
    if not found:
        pytest.skip(f"no {arch} wheel in {DIST} (make wheels, after make dist)")
    return found[-1]


def _pip_offline(dist: Path | str) -> list[str]:
    return [a.format(dist=dist) for a in PIP_OFFLINE]


def _chat_answer(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{' '.join(map(str, proc.args))}\nexit {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1].strip()


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A clean venv with the x86_64 wheel and its requirements, installed from dist/ alone."""
    _wheel("x86_64")
    d = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True, timeout=300)
    r = subprocess.run([str(d / "bin" / "python"), "-m", "pip", *_pip_offline(DIST)], env=_bare_env(),
                       capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    return d


def _site(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


def test_wheel_installs_offline_and_llama_cpp_python_holds_no_library(venv):
    site = _site(venv)
    assert (site / "ggml_ext" / "lib" / "libllama.so").is_file()
    assert any((site / "ggml_ext" / "bin").glob("libggml-cpu-*.so")), "no CPU-variant modules in the wheel"
    infos = sorted(p.name for p in site.glob("llama_cpp_python-*.dist-info"))
    assert infos == ["llama_cpp_python-0.3.36.dist-info"], infos
    elf = [p for p in (site / "llama_cpp").rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
    assert not elf, f"llama-cpp-python carries compiled files: {elf}"


def test_ggml_ext_chat_from_the_wheel_answers_as_the_native_build(venv, model, native_answer, tmp_path):
    proc = subprocess.run([str(venv / "bin" / "ggml-ext"), "chat", str(model), "--prompt", PROMPT, "-n",
                           str(N_TOKENS), "-t", "1"], env=_bare_env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    answer = _chat_answer(proc)
    assert f"loaded CPU backend from {_site(venv) / 'ggml_ext' / 'bin'}" in proc.stderr, proc.stderr[-3000:]
    print(f"\nggml-ext chat from the x86_64 wheel: {answer!r}")
    assert answer == native_answer, f"{answer!r}\nllama-cli, native build: {native_answer!r}"


def test_plain_llama_cpp_from_the_wheel_generates_the_native_build_tokens(venv, model, tmp_path):
    def run(python: Path | str) -> dict:
        r = subprocess.run([str(python), "-c", LLAMA_SCRIPT, str(model), PROMPT, str(N_TOKENS)], env=_bare_env(),
                           cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    wheel, native = run(venv / "bin" / "python"), run(sys.executable)
    assert Path(wheel["lib"]).resolve() == (_site(venv) / "ggml_ext" / "lib").resolve(), wheel["lib"]
    print(f"\nllama_cpp from the x86_64 wheel: {wheel['text']!r} {wheel['tokens']}")
    assert len(wheel["tokens"]) == N_TOKENS
    assert wheel["tokens"] == native["tokens"], f"wheel {wheel}\nnative build {native}"


def test_ggml_ext_serve_from_the_wheel_answers_chat_completions(venv, model, tmp_path):
    from ggml_ext import serve
    port = serve.free_port()
    cmd = [str(venv / "bin" / "ggml-ext"), "serve", str(model), "--port", str(port), "-c", "512", "--", "-t", "1",
           "--no-warmup"]
    content = _serve(cmd, port, tmp_path, 120)
    print(f"\nggml-ext serve from the x86_64 wheel: {content!r}")


@pytest.fixture(scope="module")
def arm_wheel() -> Path:
    return _wheel("aarch64")


def test_aarch64_wheel_chats_on_a_debian_arm64_userland(arm_wheel, userland, model, native_answer, tmp_path):
    """pip installs the aarch64 wheel offline into a venv of Debian's own Python, and its `ggml-ext chat` answers as
    the native x86 build (qemu -cpu cortex-a76: the dotprod variant)."""
    binds = {DIST.resolve(): "/dist", model.parent: "/models", tmp_path: "/out"}

    def guest(*argv: str, timeout: int = 1800) -> subprocess.CompletedProcess:
        return subprocess.run(_proot(userland, "cortex-a76", binds, *argv), env=_bare_env(), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    r = guest("/usr/bin/python3", "-m", "venv", "/out/venv")
    assert r.returncode == 0, r.stdout + r.stderr
    r = guest("/out/venv/bin/python", "-m", "pip", *_pip_offline("/dist"))
    assert r.returncode == 0, r.stdout + r.stderr
    proc = guest("/out/venv/bin/ggml-ext", "chat", f"/models/{model.name}", "--prompt", PROMPT, "-n", str(N_TOKENS),
                 "-t", "1")
    answer = _chat_answer(proc)
    assert "libggml-cpu-armv8.2_2.so" in proc.stderr, proc.stderr[-3000:]
    print(f"aarch64 wheel, Debian arm64 userland, qemu -cpu cortex-a76: {answer!r}")
    assert answer == native_answer, f"{answer!r}\nnative x86: {native_answer!r}"
