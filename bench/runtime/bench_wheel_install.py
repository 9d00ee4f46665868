#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Release bundles": the offline install time of the wheels `make wheels` wrote to dist/.
"""Time `pip install --no-index --find-links dist ggml-ext[python-bindings]` into a clean venv: the x86_64 wheel
with this Python, and with --userland ROOTFS the aarch64 wheel in a venv of that Debian arm64 userland's Python,
every exec through `proot -q qemu-aarch64-static -cpu cortex-a76` (scripts/arm64_userland.sh makes it).

    bench/runtime/bench_wheel_install.py [--userland ~/.cache/ggml-ext/debian-arm64-bookworm]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DIST = Path(__file__).resolve().parents[2] / "dist"
PIP = ["-m", "pip", "--isolated", "install", "-q", "--no-index", "--find-links", "{dist}", "ggml-ext[python-bindings]"]


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--userland", type=Path, default=None, help="Debian arm64 root for the aarch64 wheel")
    a = ap.parse_args()
    if not any(DIST.glob("ggml_ext-*.whl")):
        raise SystemExit(f"no wheels in {DIST}: run `make dist wheels` first")
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "x86"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        s = timed([str(venv / "bin" / "python"), *(x.format(dist=DIST) for x in PIP)])
        print(f"x86_64 wheel, offline install into a clean venv: {s:.1f} s")
        if a.userland:
            guest = ["proot", "-q", "qemu-aarch64-static -cpu cortex-a76", "-r", str(a.userland), "-w", "/",
                     "-b", f"{DIST}:/dist", "-b", f"{tmp}:/out"]
            subprocess.run([*guest, "/usr/bin/python3", "-m", "venv", "/out/arm"], check=True)
            s = timed([*guest, "/out/arm/bin/python", *(x.format(dist="/dist") for x in PIP)])
            print(f"aarch64 wheel, offline install in the arm64 userland under proot + qemu: {s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
