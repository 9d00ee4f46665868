#!/usr/bin/env python3
"""Python wheels for Linux x86-64 and aarch64, made from the release bundles of `make dist`, plus what they need
to install offline.

    scripts/build_wheels.py [--arch x86_64] [--arch aarch64] [--dist dist] [--aarch64-python 3.11]

writes into dist/:
  ggml_ext-<version>-py3-none-manylinux_2_<N>_<arch>.whl
      python/ggml_ext plus the bundle's lib/, bin/ (tools and CPU-variant backend modules), include/ and
      share/ inside the package, where ggml_ext._locate looks, and the .pth that points plain
      `from llama_cpp import Llama` at them (python/_ggml_ext_llama_cpp_path.py).
  llama_cpp_python-<pinned>-py3-none-any.whl
      llama-cpp-python built with -DLLAMA_BUILD=OFF: its ctypes bindings only, no library (it loads ours), so
      one pure wheel serves every architecture and pip never compiles llama.cpp a second time.
  the binary wheels of both packages' requirements (numpy, tqdm, jinja2, ...) for this Python on x86-64 and for
  the --aarch64-python version on aarch64, so `pip install --no-index --find-links dist ggml-ext[python-bindings]`
  needs no network.

Why from the bundles and not from `pip wheel .`: the source build is tuned for the build machine
(GGML_EXT_NATIVE, -march=native), so its libraries fault on older CPUs; a bundle carries every CPU variant and
ggml picks one at run time, which is what a wheel for any machine of an architecture needs. Nothing is
compiled here. The manylinux tag names the newest glibc symbol version any of the ELF files asks for.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import fetch_llama_cpp  # noqa: E402

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
VERSION = PROJECT["version"]
# The bundle folders carried into the package; VERSION stays out (the wheel's metadata holds it).
BUNDLE_DIRS = ("lib", "bin", "include", "share")
GLIBC = re.compile(rb"GLIBC_2\.([0-9]+)")
# What pip download may fetch for another architecture: manylinux wheels a glibc 2.36 system (Debian 12) can take.
FOREIGN_PLATFORMS = ("manylinux_2_36_{}", "manylinux_2_28_{}", "manylinux_2_17_{}", "manylinux2014_{}")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(path: Path, files: dict[str, tuple[bytes, int]], dist_info: str) -> None:
    """A wheel is a zip whose RECORD lists every other member with its hash; members keep their Unix modes so the
    tools stay executable."""
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(files):
            data, mode = files[name]
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            rows.append((name, _record_hash(data), str(len(data))))
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows([*rows, (f"{dist_info}/RECORD", "", "")])
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        z.writestr(info, record.getvalue(), zipfile.ZIP_DEFLATED)


def metadata() -> str:
    """Core metadata from pyproject.toml: what pip needs to resolve the requirements and extras."""
    lines = ["Metadata-Version: 2.1", f"Name: {PROJECT['name']}", f"Version: {VERSION}",
             f"Summary: {PROJECT['description']}", f"Requires-Python: {PROJECT['requires-python']}",
             f"License: {PROJECT['license']['text']}"]
    lines += [f"Requires-Dist: {r}" for r in PROJECT["dependencies"]]
    for extra, reqs in PROJECT.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + (REPO / PROJECT["readme"]).read_text()


def glibc_minor(files: dict[str, tuple[bytes, int]]) -> int:
    """The newest GLIBC_2.N symbol version any ELF file references (the version strings sit in .gnu.version_r;
    scanning the bytes finds the same names readelf -V lists)."""
    found = [int(m) for data, _ in files.values() if data[:4] == b"\x7fELF" for m in GLIBC.findall(data)]
    if not found:
        raise SystemExit("no ELF file in the bundle references glibc: not a bundle of scripts/dist.sh?")
    return max(found)


def package_wheel(arch: str, dist: Path) -> Path:
    bundle = dist / f"ggml-ext-{VERSION}-linux-{arch}.tar.gz"
    if not bundle.exists():
        raise SystemExit(f"{bundle} missing: `make dist` (DIST_ARCHES={arch}) builds it")
    files: dict[str, tuple[bytes, int]] = {}
    top = f"ggml-ext-{VERSION}-linux-{arch}/"
    with tarfile.open(bundle) as t:
        for m in t.getmembers():
            rel = m.name.removeprefix(top)
            if not m.isfile() or rel.split("/", 1)[0] not in BUNDLE_DIRS:
                continue
            files[f"ggml_ext/{rel}"] = (t.extractfile(m).read(), 0o755 if m.mode & 0o111 else 0o644)
    minor = glibc_minor(files)
    pkg = REPO / "python" / "ggml_ext"
    for p in sorted(pkg.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            files[f"ggml_ext/{p.relative_to(pkg).as_posix()}"] = (p.read_bytes(), 0o644)
    for name in ("_ggml_ext_llama_cpp_path.pth", "_ggml_ext_llama_cpp_path.py"):
        files[name] = ((REPO / "python" / name).read_bytes(), 0o644)
    tag = f"py3-none-manylinux_2_{minor}_{arch}"
    dist_info = f"ggml_ext-{VERSION}.dist-info"
    files[f"{dist_info}/METADATA"] = (metadata().encode(), 0o644)
    files[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: ggml-ext scripts/build_wheels.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
        .encode(), 0o644)
    scripts = "".join(f"{k} = {v}\n" for k, v in PROJECT["scripts"].items())
    files[f"{dist_info}/entry_points.txt"] = (f"[console_scripts]\n{scripts}".encode(), 0o644)
    out = dist / f"ggml_ext-{VERSION}-{tag}.whl"
    for old in dist.glob(f"ggml_ext-{VERSION}-*_{arch}.whl"):
        old.unlink()
    write_wheel(out, files, dist_info)
    return out


def llama_cpp_python_wheel(dist: Path) -> Path:
    """llama-cpp-python from its pinned sdist with -DLLAMA_BUILD=OFF (its CMake step then installs nothing), retagged
    py3-none-any: the build names the build machine's platform although the wheel holds Python files only."""
    version = fetch_llama_cpp.VERSION
    sdist = fetch_llama_cpp.download_sdist(fetch_llama_cpp.cache_root() / "sdist")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF"}
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp,
                        str(sdist)], check=True, env=env)
        (built,) = Path(tmp).glob("llama_cpp_python-*.whl")
        with zipfile.ZipFile(built) as z:
            files = {i.filename: (z.read(i), (i.external_attr >> 16) & 0o777 or 0o644) for i in z.infolist()}
    binaries = [n for n, (data, _) in files.items() if data[:4] == b"\x7fELF"]
    if binaries:
        raise SystemExit(f"llama-cpp-python was built with compiled files ({', '.join(binaries)}); "
                         "-DLLAMA_BUILD=OFF should leave none")
    dist_info = f"llama_cpp_python-{version}.dist-info"
    del files[f"{dist_info}/RECORD"]
    wheel_meta = files[f"{dist_info}/WHEEL"][0].decode()
    files[f"{dist_info}/WHEEL"] = (re.sub(r"(?m)^Root-Is-Purelib: .*$", "Root-Is-Purelib: true",
                                          re.sub(r"(?m)^Tag: .*$", "Tag: py3-none-any", wheel_meta)).encode(), 0o644)
    out = dist / f"llama_cpp_python-{version}-py3-none-any.whl"
    write_wheel(out, files, dist_info)
    return out


def requirements(wheels: list[Path]) -> list[str]:
    """The unconditional requirements of the wheels (and ggml-ext's python-bindings extra), minus the wheels
    themselves."""
    reqs = []
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            meta = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in meta.split("\n\n", 1)[0].splitlines():
            if not line.startswith("Requires-Dist: "):
                continue
            req = line.removeprefix("Requires-Dist: ")
            name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
            if name in ("llama-cpp-python", "ggml-ext"):
                continue
            if ";" not in req:
                reqs.append(req)
            elif "sys_platform" not in req and "platform_system" not in req and "extra ==" not in req:
                reqs.append(req)
    return sorted(set(reqs))


def download(reqs: list[str], dist: Path, arch: str, foreign_python: str) -> None:
    """Binary wheels of reqs into dist: for the running Python on its own architecture, else for foreign_python."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(dist), *reqs]
    if arch != os.uname().machine:
        plats = [a for p in FOREIGN_PLATFORMS for a in ("--platform", p.format(arch))]
        cmd += [*plats, "--python-version", foreign_python, "--implementation", "cp"]
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", action="append", choices=("x86_64", "aarch64"))
    ap.add_argument("--dist", type=Path, default=REPO / "dist")
    ap.add_argument("--aarch64-python", default="3.11",
                    help="the Python version requirements are fetched for on the architecture not running this "
                         "(Debian 12's: 3.11)")
    args = ap.parse_args()
    arches = args.arch or ["x86_64", "aarch64"]
    args.dist.mkdir(parents=True, exist_ok=True)
    built = [package_wheel(a, args.dist) for a in arches]
    lcp = llama_cpp_python_wheel(args.dist)
    reqs = requirements([*built, lcp])
    for a in arches:
        download(reqs, args.dist, a, args.aarch64_python)
    for w in [*built, lcp]:
        print(f"{w.relative_to(REPO) if w.is_relative_to(REPO) else w}  {w.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
