#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Interleaved Q4_0" and "IQ4_NL": standalone GEMV / GEMM against upstream's kernels, the roofline, Arm instruction counts.
"""Build and run the interleaved Q4_0 / IQ4_NL kernel microbenchmark (bench/interleaved4/bench_q4_0_kernels.c).

    python3 bench/interleaved4/bench_q4_0_kernels.py [--no-ggml] [--march native] [-- bench args...]
    python3 bench/interleaved4/bench_q4_0_kernels.py -- --family iq4_nl     # the interleaved IQ4_NL kernels

Compiles ggml_ext's Q4_0 sources with the benchmark (gcc -O3 -DNDEBUG -march=native, the
flags of our Release build) into a temporary folder; with the pristine upstream build of
`make upstream` (else, with a note, our installed package under GGML_EXT_RUNTIME_REPACK=0)
it also times ggml's own Q4_0 paths (plain vec_dot and upstream's CPU_REPACK buffer)
through the public graph API, and on x86 it compiles the pinned llama.cpp tree's
arch/x86/repack.cpp as is (g++ -O3 -DNDEBUG, same -march) to time upstream's Q4_0_8_8
kernels on the same bytes as ours. Prints a
Markdown table: GEMV in GB/s of weights, GEMM in GOPS, one thread. Arguments after `--`
go to the benchmark (--tokens T, --reps R, --gemm-reps R, --shape MxK ...).

    python3 bench/interleaved4/bench_q4_0_kernels.py --roofline [--model-shapes FILE.gguf]

measures in the same run the int8 multiply-accumulate peak of one core (vpdpbusd zmm and
AVX2 vpmaddubsw + vpmaddwd chains) and the read bandwidth of 1 and 2 threads, then GEMV on
cold weights as GB/s and % of that bandwidth and GEMM (512 tokens) as GOPS and % of both
peaks, for our Q4_0_8_8 kernels and upstream's, on the Llama shapes and, with
--model-shapes, the block matrices of a GGUF file (default: the default model's Q4_0 file).

    python3 bench/interleaved4/bench_q4_0_kernels.py --arm-loops

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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from kernel_sources import INTERLEAVED4 as SOURCES, SRC  # noqa: E402


def model_shapes(path: str) -> list[str]:
    """'MxK' of the distinct 2-D block matrices (blk.*) of a GGUF file whose M divides by 8."""
    sys.path.insert(0, str(REPO / "python"))
    from ggml_ext.gguf import read_gguf

    if path == "default":
        sys.path.insert(0, str(REPO / "scripts"))
        from default_models import default_model

        path = str(default_model("Q4_0"))
    info = read_gguf(path)
    seen: list[str] = []
    for t in info.tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2 and t.shape[1] % 8 == 0:
            sh = f"{t.shape[1]}x{t.shape[0]}"
            if sh not in seen:
                seen.append(sh)
    print(f"shapes of {path}: {', '.join(seen)}", file=sys.stderr)
    return seen


def pristine_ggml() -> tuple[Path, Path] | None:
    """(include dir, lib dir) of the pristine upstream build (`make upstream`), if it exists."""
    sys.path.insert(0, str(REPO / "scripts"))
    import fetch_llama_cpp
    tree = Path(subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_llama_cpp.py"), "tree"],
                               check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    lib = tree.parent / f"upstream-{fetch_llama_cpp.COMMIT}" / "bin"
    return (tree / "ggml" / "include", lib) if (lib / "libggml-cpu.so").is_file() else None


def ggml_prefix() -> Path | None:
    """Our installed package (its libggml), the fallback for the ggml columns."""
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
ARM_SVE_MARCH = "armv8.6-a+dotprod+i8mm+sve"  # what -mcpu=neoverse-v1 enables for these kernels
ARM_OLD_MARCH = "armv8.2-a+dotprod"             # the old Q4_0 x Q8_0 path: SDOT, no i8mm
ARM_OURS = ["gemv_q4_0_4x4_dotprod", "gemv_q4_0_4x8_dotprod", "gemv_q4_0_8x8_dotprod", "gemm_q4_0_4x4_dotprod",
            "gemm_q4_0_4x8_i8mm", "gemm_q4_0_8x8_i8mm", "gemm_q4_0_4x8_dotprod", "gemm_q4_0_8x8_dotprod"]
ARM_OURS += ["gemv_iq4_nl_4x4_dotprod", "gemv_iq4_nl_4x8_dotprod", "gemv_iq4_nl_8x8_dotprod", "gemm_iq4_nl_4x4_dotprod",
             "gemm_iq4_nl_4x8_i8mm", "gemm_iq4_nl_8x8_i8mm", "gemm_iq4_nl_4x8_dotprod", "gemm_iq4_nl_8x8_dotprod"]
ARM_OURS_SVE = ["gemv_q4_0_8x8_sve256", "gemm_q4_0_8x8_sve256"]
ARM_UPSTREAM = [f"ggml_{k}_q4_0_{l}_q8_0" for k in ("gemv", "gemm") for l in ("4x4", "4x8", "8x8")]
ARM_UPSTREAM += [f"ggml_{k}_iq4_nl_4x4_q8_0" for k in ("gemv", "gemm")]
ARM_OLD = ["ggml_vec_dot_q4_0_q8_0"]
# int8 multiply-accumulates per instruction: NEON (v registers) SDOT 16, SMMLA 32; SVE (z
# registers) at 256 bits, the only vector length our and upstream's SVE kernels run at: 32, 64
MACS = {("sdot", False): 16, ("smmla", False): 32, ("sdot", True): 32, ("smmla", True): 64}


def innermost_dot_loops(obj: Path, fn: str) -> list[tuple[int, int, int]]:
    """(instructions, MAC instructions, MACs) of each innermost backward-branch loop of fn holding dot products."""
    out = subprocess.run(["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", str(obj)],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"<%s>:\n(.*?)(?:\n\n|\Z)" % re.escape(fn), out, re.S)
    if not m:
        return []
    ins = [(int(a, 16), op, args) for a, op, args in re.findall(r"^\s*([0-9a-f]+):\s+(\S+)[ \t]*(.*)$", m.group(1), re.M)]
    targets = re.findall(r"^\s*([0-9a-f]+):\s+(b\.\w+|b|cbn?z|tbn?z)\s.*?\b([0-9a-f]+) <", m.group(1), re.M)
    loops = []
    for a, _, t in targets:
        lo, hi = int(t, 16), int(a, 16)
        if lo <= hi:
            body = [(op, args) for addr, op, args in ins if lo <= addr <= hi]
            dots = [MACS[(op, args.lstrip().startswith("z"))] for op, args in body if op in ("sdot", "smmla")]
            if dots:
                loops.append((lo, hi, len(body), len(dots), sum(dots)))
    inner = [x for x in loops if not any(y is not x and x[0] <= y[0] and y[1] <= x[1] for y in loops)]
    return [(n, nd, macs) for _, _, n, nd, macs in inner]


def _cross_obj(cc: str, std: str, march: str, includes: list[Path], src: Path, out: Path) -> Path:
    subprocess.run([cc, std, "-O3", "-DNDEBUG", f"-march={march}", *(f"-I{i}" for i in includes), "-c", str(src),
                    "-o", str(out)], check=True)
    return out


def arm_loops(args, tmp: Path) -> int:
    tree = Path(subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_llama_cpp.py"), "tree"],
                               check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    ggml = tree / "ggml"
    ours_inc = [REPO / "ggml_ext" / "include", SRC]
    up_inc = [ggml / "include", ggml / "src", ggml / "src" / "ggml-cpu"]
    objs = [_cross_obj("aarch64-linux-gnu-gcc", "-std=gnu11", ARM_MARCH, ours_inc, SRC / "arm" / n, tmp / n.replace(".c", ".o"))
            for n in ("interleaved4_neon.c", "interleaved4_i8mm.c")]
    ours = tmp / "ours_arm.o"
    subprocess.run(["aarch64-linux-gnu-ld", "-r", "-o", str(ours), *map(str, objs)], check=True)
    ours_sve = _cross_obj("aarch64-linux-gnu-gcc", "-std=gnu11", ARM_SVE_MARCH, ours_inc,
                          SRC / "arm" / "interleaved4_sve.c", tmp / "ours_sve.o")
    repack = ggml / "src" / "ggml-cpu" / "arch" / "arm" / "repack.cpp"
    up = _cross_obj("aarch64-linux-gnu-g++", "-std=c++17", ARM_MARCH, up_inc, repack, tmp / "up.o")
    up_sve = _cross_obj("aarch64-linux-gnu-g++", "-std=c++17", ARM_SVE_MARCH, up_inc, repack, tmp / "up_sve.o")
    quants = ggml / "src" / "ggml-cpu" / "arch" / "arm" / "quants.c"
    old = _cross_obj("aarch64-linux-gnu-gcc", "-std=gnu11", ARM_OLD_MARCH, up_inc, quants, tmp / "old.o")
    old_mm = _cross_obj("aarch64-linux-gnu-gcc", "-std=gnu11", ARM_MARCH, up_inc, quants, tmp / "old_i8mm.o")
    print("Innermost loops (GCC -O3); MACs: SDOT 16 / SMMLA 32 per NEON instruction, 32 / 64 per SVE-256 one.")
    print("| kernel | -march | loop instructions | MAC instructions | MAC share | MACs / iteration | instructions / 1024 MACs |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    per_kmac: dict[str, float] = {}
    for who, obj, march, fns in (("ours", ours, ARM_MARCH, ARM_OURS), ("ours", ours_sve, ARM_SVE_MARCH, ARM_OURS_SVE),
                                 ("upstream", up, ARM_MARCH, ARM_UPSTREAM[:5]),
                                 ("upstream", up_sve, ARM_SVE_MARCH, ARM_UPSTREAM[2::3]),
                                 ("upstream (old path)", old, ARM_OLD_MARCH, ARM_OLD),
                                 ("upstream (old path)", old_mm, ARM_MARCH, ARM_OLD)):
        for fn in fns:
            loops = innermost_dot_loops(obj, fn)
            if not loops:
                print(f"| {who} {fn} | {march} | no SIMD loop (scalar fallback on this target) | | | | |")
            for n, nd, macs in sorted(loops, key=lambda x: -x[2]):
                print(f"| {who} {fn} | {march} | {n} | {nd} | {nd / n:.0%} | {macs} | {n * 1024 / macs:.0f} |")
                key = f"{who} {fn} {march}"
                per_kmac[key] = min(per_kmac.get(key, 1e9), n * 1024 / macs)
    olds = [(m, per_kmac.get(f"upstream (old path) ggml_vec_dot_q4_0_q8_0 {m}")) for m in (ARM_OLD_MARCH, ARM_MARCH)]
    if all(v for _, v in olds):
        print("\nInstructions per MAC of the old Q4_0 x Q8_0 vec_dot (" +
              ", ".join(f"{m}: {v:.0f} / 1024 MACs" for m, v in olds) + ") over each GEMM kernel's best loop:")
        print("\n| GEMM kernel | -march | instructions / 1024 MACs | old dotprod vec_dot / this | old i8mm vec_dot / this |")
        print("| --- | --- | ---: | ---: | ---: |")
        for key, v in per_kmac.items():
            if "gemm" in key:
                who_fn, march = key.rsplit(" ", 1)
                print(f"| {who_fn} | {march} | {v:.0f} | {olds[0][1] / v:.2f}x | {olds[1][1] / v:.2f}x |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-ggml", action="store_true", help="do not time ggml's own kernels")
    ap.add_argument("--march", default="native")
    ap.add_argument("--no-upstream", action="store_true", help="do not build the pinned tree's x86 kernels")
    ap.add_argument("--cc", default=os.environ.get("CC", "gcc"))
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--arm-loops", action="store_true", help="count Arm inner-loop instructions instead (no timing)")
    ap.add_argument("--roofline", action="store_true", help="peak int8 rate, read bandwidth, and the kernels against them")
    ap.add_argument("--model-shapes", metavar="FILE.gguf", nargs="?", const="default",
                    help="with --roofline: add the block matrices' shapes of this GGUF (default: the default model)")
    ap.add_argument("bench_args", nargs="*", help="arguments for the benchmark program (after --)")
    args = ap.parse_args()
    if args.arm_loops:
        with tempfile.TemporaryDirectory(prefix="bench_q4_0_arm_") as tmp:
            return arm_loops(args, Path(tmp))

    cmd = [args.cc, "-std=c11", "-O3", "-DNDEBUG", f"-march={args.march}", f"-I{REPO / 'ggml_ext' / 'include'}",
           f"-I{SRC}", str(Path(__file__).resolve().with_suffix(".c")), *map(str, SOURCES)]
    env = dict(os.environ)
    if not args.no_ggml:
        # ggml's own paths from the pristine build: our build's runtime repack would route
        # plain Q4_0 through our kernels, and the "upstream" column must not time ours.
        ggml = pristine_ggml()
        if ggml is None and (prefix := ggml_prefix()) is not None:
            print("note: no pristine upstream build (make upstream); ggml columns from our build with "
                  "GGML_EXT_RUNTIME_REPACK=0 (upstream's code paths, compiled in our build)", file=sys.stderr)
            ggml = (prefix / "include", prefix / "lib")
            env["GGML_EXT_RUNTIME_REPACK"] = "0"
        if ggml is not None:
            inc, lib = ggml
            print(f"ggml columns: {lib}", file=sys.stderr)
            cmd += ["-DWITH_GGML", f"-I{inc}", f"-L{lib}", f"-Wl,-rpath,{lib}", "-lggml", "-lggml-base", "-lggml-cpu"]
    bench_args = list(args.bench_args)
    if args.roofline:
        shapes = ["4096x4096", "11008x4096", "4096x11008", "14336x4096"]
        if args.model_shapes:
            shapes += model_shapes(args.model_shapes)
        bench_args = ["--roofline", *[a for sh in shapes for a in ("--shape", sh)], *bench_args]
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
        subprocess.run([*cmd, "-lm", "-pthread", "-o", str(exe)], check=True)
        return subprocess.run([str(exe), *bench_args], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
