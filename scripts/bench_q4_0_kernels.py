#!/usr/bin/env python3
"""Build and run the interleaved Q4_0 kernel microbenchmark (scripts/bench_q4_0_kernels.c).

    python3 scripts/bench_q4_0_kernels.py [--no-ggml] [--march native] [-- bench args...]

Compiles ggml_ext's Q4_0 sources with the benchmark (gcc -O2 -march=native) into a
temporary folder; with the installed package's libggml it also times ggml's own Q4_0
paths (plain vec_dot and the CPU_REPACK buffer) through the public graph API, and on x86
it compiles the pinned llama.cpp tree's arch/x86/repack.cpp as is (g++ -O3, same -march)
to time upstream's Q4_0_8_8 kernels on the same bytes as ours. Prints a
Markdown table: GEMV in GB/s of weights, GEMM in GOPS, one thread. Arguments after `--`
go to the benchmark (--tokens T, --reps R, --gemm-reps R, --shape MxK ...).
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "ggml_ext" / "src"
SOURCES = [
    SRC / "q4_0_interleaved_dispatch.c",
    SRC / "generic" / "q4_0_interleaved.c",
    SRC / "x86" / "q4_0_interleaved.c",
    SRC / "x86" / "q4_0_interleaved_avx512.c",
    SRC / "arm" / "q4_0_interleaved.c",
]


def ggml_prefix() -> Path | None:
    sys.path.insert(0, str(REPO / "python"))
    try:
        from ggml_ext import _locate

        prefix = _locate.prefix()
    except Exception as e:  # not installed: ours only
        print(f"note: no installed ggml ({e}); timing ours only", file=sys.stderr)
        return None
    if (prefix / "include" / "ggml-cpu.h").is_file():
        return prefix
    print(f"note: {prefix} has no ggml headers; timing ours only", file=sys.stderr)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-ggml", action="store_true", help="do not time ggml's own kernels")
    ap.add_argument("--march", default="native")
    ap.add_argument("--no-upstream", action="store_true", help="do not build the pinned tree's x86 kernels")
    ap.add_argument("--cc", default=os.environ.get("CC", "gcc"))
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("bench_args", nargs="*", help="arguments for the benchmark program (after --)")
    args = ap.parse_args()

    cmd = [args.cc, "-std=c11", "-O2", f"-march={args.march}", f"-I{REPO / 'ggml_ext' / 'include'}", f"-I{SRC}",
           str(REPO / "scripts" / "bench_q4_0_kernels.c"), *map(str, SOURCES)]
    prefix = None if args.no_ggml else ggml_prefix()
    if prefix is not None:
        lib = prefix / "lib"
        cmd += ["-DWITH_GGML", f"-I{prefix / 'include'}", f"-L{lib}", f"-Wl,-rpath,{lib}",
                "-lggml", "-lggml-base", "-lggml-cpu"]
    with tempfile.TemporaryDirectory(prefix="bench_q4_0_") as tmp:
        exe = Path(tmp) / "bench_q4_0_kernels"
        if not args.no_upstream and platform.machine() in ("x86_64", "AMD64"):
            tree = Path(subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_llama_cpp.py"), "tree"],
                                       check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            ggml = tree / "ggml"
            obj = Path(tmp) / "upstream_x86_repack.o"
            subprocess.run([args.cxx, "-std=c++17", "-O3", "-DNDEBUG", f"-march={args.march}",
                            f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}", "-c",
                            str(ggml / "src" / "ggml-cpu" / "arch" / "x86" / "repack.cpp"), "-o", str(obj)], check=True)
            cmd += ["-DWITH_UPSTREAM", str(obj), "-lstdc++"]
        subprocess.run([*cmd, "-lm", "-o", str(exe)], check=True)
        return subprocess.run([str(exe), *args.bench_args]).returncode


if __name__ == "__main__":
    sys.exit(main())
