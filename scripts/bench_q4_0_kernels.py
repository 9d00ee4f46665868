#!/usr/bin/env python3
"""Build and run the interleaved Q4_0 / IQ4_NL kernel microbenchmark (scripts/bench_q4_0_kernels.c).

    python3 scripts/bench_q4_0_kernels.py [--no-ggml] [--march native] [-- bench args...]
    python3 scripts/bench_q4_0_kernels.py -- --family iq4_nl     # the interleaved IQ4_NL kernels

Compiles ggml_ext's Q4_0 sources with the benchmark (gcc -O2 -march=native) into a
temporary folder; with the installed package's libggml it also times ggml's own Q4_0
paths (plain vec_dot and the CPU_REPACK buffer) through the public graph API, and on x86
it compiles the pinned llama.cpp tree's arch/x86/repack.cpp as is (g++ -O3, same -march)
to time upstream's Q4_0_8_8 kernels on the same bytes as ours. Prints a
Markdown table: GEMV in GB/s of weights, GEMM in GOPS, one thread. Arguments after `--`
go to the benchmark (--tokens T, --reps R, --gemm-reps R, --shape MxK ...).

    python3 scripts/bench_q4_0_kernels.py --arm-loops

needs no Arm machine: it cross-compiles our Arm kernels and the pinned tree's
arch/arm/repack.cpp (aarch64-linux-gnu-gcc/g++ -O3 -march=armv8.6-a+dotprod+i8mm) and
counts, with aarch64-linux-gnu-objdump, the instructions of each kernel's innermost
loop per 1024 multiply-accumulates (SDOT: 16, SMMLA: 32 per instruction).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from kernel_sources import Q4_0_INTERLEAVED as SOURCES, SRC  # noqa: E402


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


ARM_MARCH = "armv8.6-a+dotprod+i8mm"
ARM_OURS = ["gemv_q4_0_4x4_dotprod", "gemv_q4_0_4x8_dotprod", "gemv_q4_0_8x8_dotprod", "gemm_q4_0_4x4_dotprod",
            "gemm_q4_0_4x8_i8mm", "gemm_q4_0_8x8_i8mm", "gemm_q4_0_4x8_dotprod", "gemm_q4_0_8x8_dotprod"]
ARM_OURS += ["gemv_iq4_nl_4x4_dotprod", "gemv_iq4_nl_4x8_dotprod", "gemv_iq4_nl_8x8_dotprod", "gemm_iq4_nl_4x4_dotprod",
             "gemm_iq4_nl_4x8_i8mm", "gemm_iq4_nl_8x8_i8mm", "gemm_iq4_nl_4x8_dotprod", "gemm_iq4_nl_8x8_dotprod"]
ARM_UPSTREAM = [f"ggml_{k}_q4_0_{l}_q8_0" for k in ("gemv", "gemm") for l in ("4x4", "4x8", "8x8")]
ARM_UPSTREAM += [f"ggml_{k}_iq4_nl_4x4_q8_0" for k in ("gemv", "gemm")]


def innermost_dot_loops(obj: Path, fn: str) -> list[tuple[int, int, int]]:
    """(instructions, sdot, smmla) of each innermost backward-branch loop of fn holding dot products."""
    out = subprocess.run(["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", str(obj)],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"<%s>:\n(.*?)(?:\n\n|\Z)" % re.escape(fn), out, re.S)
    if not m:
        return []
    ins = [(int(a, 16), op) for a, op in re.findall(r"^\s*([0-9a-f]+):\s+(\S+)", m.group(1), re.M)]
    targets = re.findall(r"^\s*([0-9a-f]+):\s+(b\.\w+|b|cbn?z|tbn?z)\s.*?\b([0-9a-f]+) <", m.group(1), re.M)
    loops = []
    for a, _, t in targets:
        lo, hi = int(t, 16), int(a, 16)
        if lo <= hi:
            body = [op for addr, op in ins if lo <= addr <= hi]
            nd, nm = body.count("sdot"), body.count("smmla")
            if nd or nm:
                loops.append((lo, hi, len(body), nd, nm))
    inner = [x for x in loops if not any(y is not x and x[0] <= y[0] and y[1] <= x[1] for y in loops)]
    return [(n, nd, nm) for _, _, n, nd, nm in inner]


def arm_loops(args, tmp: Path) -> int:
    tree = Path(subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_llama_cpp.py"), "tree"],
                               check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    ggml = tree / "ggml"
    ours, up = tmp / "ours_arm.o", tmp / "upstream_arm_repack.o"
    objs = []
    for name in ("q4_0_interleaved.c", "q4_0_interleaved_i8mm.c"):
        objs.append(tmp / name.replace(".c", ".o"))
        subprocess.run(["aarch64-linux-gnu-gcc", "-std=gnu11", "-O3", f"-march={ARM_MARCH}",
                        f"-I{REPO / 'ggml_ext' / 'include'}", f"-I{SRC}", "-c", str(SRC / "arm" / name), "-o",
                        str(objs[-1])], check=True)
    subprocess.run(["aarch64-linux-gnu-ld", "-r", "-o", str(ours), *map(str, objs)], check=True)
    subprocess.run(["aarch64-linux-gnu-g++", "-std=c++17", "-O3", "-DNDEBUG", f"-march={ARM_MARCH}",
                    f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}", "-c",
                    str(ggml / "src" / "ggml-cpu" / "arch" / "arm" / "repack.cpp"), "-o", str(up)], check=True)
    print(f"| kernel ({ARM_MARCH}, -O3) | loop instructions | SDOT | SMMLA | MACs / iteration | instructions / 1024 MACs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for who, obj, fns in (("ours", ours, ARM_OURS), ("upstream", up, ARM_UPSTREAM)):
        for fn in fns:
            loops = innermost_dot_loops(obj, fn)
            if not loops:
                print(f"| {who} {fn} | no SIMD loop (scalar fallback on this target) | | | | |")
            for n, nd, nm in sorted(loops, key=lambda x: -(x[1] * 16 + x[2] * 32)):
                macs = nd * 16 + nm * 32
                print(f"| {who} {fn} | {n} | {nd} | {nm} | {macs} | {n * 1024 / macs:.0f} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-ggml", action="store_true", help="do not time ggml's own kernels")
    ap.add_argument("--march", default="native")
    ap.add_argument("--no-upstream", action="store_true", help="do not build the pinned tree's x86 kernels")
    ap.add_argument("--cc", default=os.environ.get("CC", "gcc"))
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--arm-loops", action="store_true", help="count Arm inner-loop instructions instead (no timing)")
    ap.add_argument("bench_args", nargs="*", help="arguments for the benchmark program (after --)")
    args = ap.parse_args()
    if args.arm_loops:
        with tempfile.TemporaryDirectory(prefix="bench_q4_0_arm_") as tmp:
            return arm_loops(args, Path(tmp))

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
