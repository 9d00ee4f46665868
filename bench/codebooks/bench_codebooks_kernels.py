#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Codebooks (CB2/CB3)": CPU GEMV / GEMM against ggml's Q2_K / Q3_K vec_dot.
"""Build and run the codebook kernels' GEMV microbenchmark (bench/codebooks/bench_codebooks_kernels.c): CB2 / CB3 x
Q8_K with every SIMD implementation compiled in, against ggml's own Q2_K / Q3_K vec_dot, one thread, the
1-token decode product of one weight matrix, timed interleaved (best of --reps).

    python3 bench/codebooks/bench_codebooks_kernels.py [--old REF] [--march native] [-- --rows 4096 --cols 11008 --reps 30]
    python3 bench/codebooks/bench_codebooks_kernels.py --old REF -- --rows 512 --act-rows 16   # a 16-row GEMM instead

Compiles ggml_ext's codebook sources with the benchmark (gcc -O3 -DNDEBUG) and links ggml (ggml-base,
ggml-cpu) of the installed build (GGML_EXT_PREFIX, else the installed package): the stock types run ggml's
unmodified CPU kernels there. --old REF also compiles the AVX2 kernel of git revision REF (renamed) and times
it beside the current one, for a before/after in the same run.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "python"))
from kernel_sources import CODEBOOKS as SOURCES, SRC  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", metavar="REF", help="also time the AVX2 kernel of this git revision")
    ap.add_argument("--march", default="native")
    ap.add_argument("args", nargs="*", help="arguments of the benchmark (after --)")
    ns = ap.parse_args()
    from ggml_ext import _locate

    lib, inc = _locate.lib_dir(), _locate.prefix() / "include"
    with tempfile.TemporaryDirectory() as td:
        srcs = [str(Path(__file__).resolve().with_suffix(".c")), *map(str, SOURCES)]
        defs = []
        if ns.old:
            old = Path(td) / "codebooks_avx2_old.c"
            old.write_text(subprocess.run(["git", "-C", str(REPO), "show", f"{ns.old}:ggml_ext/src/x86/codebooks_avx2.c"],
                                          check=True, capture_output=True, text=True).stdout)
            obj = Path(td) / "old.o"
            subprocess.run(["gcc", "-std=gnu11", "-O3", "-DNDEBUG", f"-march={ns.march}", f"-I{REPO / 'ggml_ext/include'}",
                            f"-I{SRC}", "-Dggml_ext_cb_impl_avx2=ggml_ext_codebooks_impl_avx2_old", "-c", str(old), "-o", str(obj)],
                           check=True)
            srcs.append(str(obj))
            defs.append("-DBENCH_OLD_AVX2")
        exe = Path(td) / "bench"
        subprocess.run(["gcc", "-std=gnu11", "-O3", "-DNDEBUG", f"-march={ns.march}", *defs, f"-I{REPO / 'ggml_ext/include'}",
                        f"-I{SRC}", f"-I{inc}", *srcs, f"-L{lib}", "-lggml-cpu", "-lggml-base", "-lm",
                        "-Wl,-rpath," + str(lib), "-o", str(exe)], check=True)
        if ns.old:
            print(f"(CB2 / CB3 avx2 with the same name twice: the second row is revision {ns.old})")
        return subprocess.run([str(exe), *ns.args]).returncode


if __name__ == "__main__":
    sys.exit(main())
