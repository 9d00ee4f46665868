#!/usr/bin/env python3
# Reproduces docs/RESULTS.md "Codebooks (CB2/CB3)", "Any-precision" and "KVQuant": Arm instruction counts per 1024 MACs.
"""Static instruction counts of the Arm kernels of the codebooks, anyprec and kvquant families next to
upstream's nearest vec_dot, from the disassembly (no Arm machine needed, no timing).

    python3 bench/arm_instruction_counts.py [--family codebooks|anyprec|kvquant] [--march M ...]

Compiles each kernel's source with aarch64-linux-gnu-gcc -O3 -DNDEBUG at each -march (armv8-a,
armv8.2-a+dotprod, armv8.6-a+dotprod+i8mm, armv8.6-a+dotprod+i8mm+sve), ours from ggml_ext/src/arm/ and
upstream's from the pinned tree's ggml/src/ggml-cpu/arch/arm/quants.c, disassembles it with
aarch64-linux-gnu-objdump and finds each kernel's innermost loops that hold multiply-accumulates: a
backward branch within the function is a loop; a loop is innermost when no other MAC-holding loop lies
inside it (the method of bench/interleaved4/bench_q4_0_kernels.py --arm-loops). The count is

    instructions / 1024 MACs = loop body instructions x 1024 / MACs per iteration

where a MAC is one weight (or cached key / value) times one activation (or query / attention weight):
SDOT 16 and SMMLA 32 per NEON instruction, SMULL/SMLAL(2) 8 (upstream's int8 dot product without dotprod), FMLA/FMLS
4 per NEON lane group for the float kernels. An SVE loop's MACs depend on the vector length, which
upstream's SVE paths test at run time (svcntb) to pick a loop: its rows give both readings, 128-bit
(Graviton4, Neoverse N2) / 256-bit (Graviton3, Neoverse V1). Where a loop body holds branches taken or not by a
runtime parameter (APQ's bit width: GCC unrolls the plane loop to the maximum and leaves it early), the
count follows the path that parameter takes. The KV block decoder multiplies nothing: its rows count
instructions per 1024 decoded values (each value then meets the query in one float multiply-add per
query head of ggml's attention). Marches that give the same loops are printed as one row. Prints one
Markdown table.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "ggml_ext" / "src"
MARCHES = ["armv8-a", "armv8.2-a+dotprod", "armv8.6-a+dotprod+i8mm", "armv8.6-a+dotprod+i8mm+sve"]
TOOLS = ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-objdump")

# The KV block decoder with the bit width and the scale source constant, as the runtime's switch
# (kvquant_decode_neon.c) instantiates it: keys take per-channel mid / half, values their block's own.
# flatten: the kernel inlined into each, so its loops are specialised like the switch's own copies.
DECODE_WRAPPERS = """#include "arm/kvquant_decode_neon.c"
#define W(B)                                                                                              \\
    __attribute__((flatten)) void count_decode_k##B(const void * b, int64_t n, size_t bb, const float * t,     \\
                                                    const float * m, const float * h, float * y) {          \\
        ggml_ext_kvquant_block_decode_neon(B, b, n, bb, t, m, h, y);                                        \\
    }                                                                                                       \\
    __attribute__((flatten)) void count_decode_v##B(const void * b, int64_t n, size_t bb, const float * t,     \\
                                                    float * y) {                                            \\
        ggml_ext_kvquant_block_decode_neon(B, b, n, bb, t, 0, 0, y);                                        \\
    }
W(4)
W(3)
W(2)
"""


@dataclass
class Kernel:
    family: str
    label: str       # what the row names
    source: str      # "ours:<file in ggml_ext/src/arm>", "upstream" (arch/arm/quants.c) or "decode"
    fn: str
    kind: str = "int"   # which instructions multiply-accumulate: int, float, decode (values, not MACs)
    scale: float = 1.0  # MACs per counted lane (kvquant's K scores: 6 FMAs of 4 lanes per 8 MACs)
    bits: int | None = None  # runtime bit width the loop's own branches are resolved with
    note: str = ""
    decode_tbl: bool = False  # codebooks: also count the weight-decode loop (amortised over the rows)


KERNELS = [
    Kernel("codebooks", "ours CB2 (mm_cb2)", "ours:codebooks_neon.c", "mm_cb2", decode_tbl=True),
    Kernel("codebooks", "ours CB3 (mm_cb3)", "ours:codebooks_neon.c", "mm_cb3", decode_tbl=True),
    Kernel("codebooks", "upstream Q2_K vec_dot", "upstream", "ggml_vec_dot_q2_K_q8_K"),
    Kernel("codebooks", "upstream Q3_K vec_dot", "upstream", "ggml_vec_dot_q3_K_q8_K"),
    Kernel("anyprec", "ours APQ GEMV, 3 bits", "ours:anyprec_neon.c", "ggml_ext_anyprec_gemv_neon", "float", bits=3,
           note="fp32 FMA on table values"),
    Kernel("anyprec", "ours APQ GEMV, 4 bits", "ours:anyprec_neon.c", "ggml_ext_anyprec_gemv_neon", "float", bits=4,
           note="fp32 FMA on table values"),
    Kernel("anyprec", "upstream Q3_K vec_dot", "upstream", "ggml_vec_dot_q3_K_q8_K"),
    Kernel("anyprec", "upstream Q4_K vec_dot", "upstream", "ggml_vec_dot_q4_K_q8_K"),
    Kernel("kvquant", "ours NUQ4 K scores (k_scores)", "ours:kvquant_neon.c", "k_scores", "float", scale=1 / 3,
           note="rotary folded in: 6 FMAs of 4 lanes per 8 MACs"),
    Kernel("kvquant", "ours NUQ4 V accumulate (v_accumulate)", "ours:kvquant_neon.c", "v_accumulate", "float"),
    *(Kernel("kvquant", f"ours NUQ{b} {kv} block decode", "decode", f"count_decode_{kv[0].lower()}{b}", "decode",
             note="per 1024 decoded values")
      for b in (4, 3, 2) for kv in ("K", "V")),
    Kernel("kvquant", "upstream Q8_0 vec_dot (KV q8_0)", "upstream", "ggml_vec_dot_q8_0_q8_0"),
    Kernel("kvquant", "upstream Q4_0 vec_dot (KV q4_0)", "upstream", "ggml_vec_dot_q4_0_q8_0"),
]

BRANCH = re.compile(r"^(b\.\w+|b|cbn?z|tbn?z)$")


def macs_of(kind: str, op: str, args: str) -> float:
    """Multiply-accumulates (decode: values) of one instruction."""
    # SVE (z registers) counted at 128 bits; mac_loops marks the loop for its 256-bit reading
    if kind == "int":
        if op == "sdot":
            return 16
        if op == "smmla":
            return 32
        if op in ("smull", "smull2", "smlal", "smlal2") and re.match(r"\s*v\d+\.8h", args):
            return 8
    elif kind == "float":
        if op in ("fmla", "fmls") and re.match(r"\s*(v\d+\.4s|z\d+\.s)", args):
            return 4
    elif kind == "decode":
        if op == "fmul" and re.match(r"\s*v\d+\.4s", args):
            return 4  # the decoder's value * half, one per four values
    return 0


def disassemble(obj: Path) -> str:
    return subprocess.run(["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", str(obj)],
                          check=True, capture_output=True, text=True).stdout


def function(dis: str, fn: str) -> list[tuple[int, str, str]] | None:
    m = re.search(r"<%s>:\n(.*?)(?:\n\n|\Z)" % re.escape(fn), dis, re.S)
    if not m:
        return None
    return [(int(a, 16), op, args) for a, op, args in re.findall(r"^\s*([0-9a-f]+):\s+(\S+)[ \t]*(.*)$", m.group(1), re.M)]


def target(args: str) -> int | None:
    t = re.search(r"\b([0-9a-f]+) <", args)
    return int(t.group(1), 16) if t else None


def traced(body: list[tuple[int, str, str]], bits: int) -> list[tuple[int, str, str]]:
    """The instructions one iteration executes when every `cmp wN, #imm` + b.eq/b.ne inside the loop tests bits."""
    at = {a: i for i, (a, _, _) in enumerate(body)}
    path, i, last = [], 0, None
    while i < len(body):
        a, op, args = body[i]
        path.append(body[i])
        if i == len(body) - 1:
            break
        nxt = i + 1
        t = target(args) if BRANCH.match(op) else None
        if t is not None and t in at and at[t] > i:
            if op == "b":
                nxt = at[t]
            elif op in ("b.eq", "b.ne") and last and re.match(r"w\d+, #0x([0-9a-f]+)$", last):
                imm = int(re.match(r"w\d+, #0x([0-9a-f]+)$", last).group(1), 16)
                if (bits == imm) == (op == "b.eq"):
                    nxt = at[t]
        last = args.strip() if op == "cmp" else last
        i = nxt
    return path


def mac_loops(ins: list[tuple[int, str, str]], kind: str, scale: float, bits: int | None):
    """(instructions, MACs, SVE?) per iteration of each innermost loop of the function that holds MACs; an SVE
    loop's MACs at 128-bit vectors."""
    loops = []
    for a, op, args in ins:
        t = target(args) if BRANCH.match(op) else None
        if t is not None and t <= a:
            body = [x for x in ins if t <= x[0] <= a]
            if bits is not None:
                body = traced(body, bits)
            counted = [(o, s) for _, o, s in body if macs_of(kind, o, s)]
            macs = sum(macs_of(kind, o, s) for o, s in counted) * scale
            if macs:
                loops.append((t, a, len(body), macs, any(s.lstrip().startswith("z") for _, s in counted)))
    inner = [x for x in loops if not any(y is not x and x[0] <= y[0] and y[1] <= x[1] for y in loops)]
    return sorted({(n, macs, sve) for _, _, n, macs, sve in inner}, key=lambda x: (-x[1], x[0]))


def decode_loop(ins: list[tuple[int, str, str]]) -> tuple[int, int] | None:
    """Codebooks: (instructions, TBL lookups) of the innermost MAC-free loop holding the table lookups."""
    loops = []
    for a, op, args in ins:
        t = target(args) if BRANCH.match(op) else None
        if t is not None and t <= a:
            body = [x for x in ins if t <= x[0] <= a]
            if any(o == "tbl" for _, o, _ in body) and not any(macs_of("int", o, s) for _, o, s in body):
                loops.append((t, a, len(body), sum(o == "tbl" for _, o, _ in body)))
    inner = [x for x in loops if not any(y is not x and x[0] <= y[0] and y[1] <= x[1] for y in loops)]
    return (inner[0][2], inner[0][3]) if inner else None


def pinned_tree() -> Path:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_llama_cpp.py"), "tree"],
                         check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def compile_obj(src: Path, march: str, includes: list[Path], out: Path) -> Path:
    subprocess.run(["aarch64-linux-gnu-gcc", "-std=gnu11", "-O3", "-DNDEBUG", f"-march={march}",
                    *(f"-I{i}" for i in includes), "-c", str(src), "-o", str(out)], check=True)
    return out


def rows(kernels: list[Kernel], marches: list[str], tmp: Path, ggml: Path | None) -> list[list[str]]:
    ours_inc = [REPO / "ggml_ext" / "include", SRC]
    up_inc = [ggml / "include", ggml / "src", ggml / "src" / "ggml-cpu"] if ggml else []
    wrapper = tmp / "decode_wrappers.c"
    wrapper.write_text(DECODE_WRAPPERS)
    dis: dict[tuple[str, str], str] = {}
    out = []
    for k in kernels:
        results: dict[str, tuple] = {}
        for march in marches:
            key = (k.source, march)
            if key not in dis:
                stem = re.sub(r"\W", "_", f"{k.source}_{march}")
                if k.source == "upstream":
                    src, inc = ggml / "src" / "ggml-cpu" / "arch" / "arm" / "quants.c", up_inc
                elif k.source == "decode":
                    src, inc = wrapper, ours_inc
                else:
                    src, inc = SRC / "arm" / k.source.split(":", 1)[1], ours_inc
                dis[key] = disassemble(compile_obj(src, march, inc, tmp / f"{stem}.o"))
            ins = function(dis[key], k.fn)
            if ins is None:
                results[march] = ("absent",)
                continue
            loops = mac_loops(ins, k.kind, k.scale, k.bits)
            dec = decode_loop(ins) if k.decode_tbl else None
            results[march] = (tuple(loops), dec)
        groups: dict[tuple, list[str]] = {}
        for march, r in results.items():
            groups.setdefault(r, []).append(march)
        for r, ms in groups.items():
            march = ", ".join(ms)
            if r == ("absent",):
                out.append([k.family, k.label, march, "no NEON kernel at this -march (generic C)", "", "", ""])
                continue
            loops, dec = r
            if not loops:
                out.append([k.family, k.label, march, "no multiply-accumulate loop found", "", "", ""])
                continue
            for j, (n, macs, sve) in enumerate(loops):
                note = k.note if j == 0 else "another innermost loop (tail, other row count or vector length)"
                if j == 0 and dec:
                    d = dec[0] * 16 // dec[1]  # one lookup per 16 weights: 16 sub-groups a 256-weight block
                    note = (f"+ weight decode {d} instructions per 256-weight block: "
                            f"+{4 * d:.0f} / 1024 MACs at 1 row, +{4 * d / 8:.0f} at 8 rows")
                if sve:  # 128-bit / 256-bit vectors
                    macs_s, per_k = f"SVE {macs:.4g} / {2 * macs:.4g}", f"{n * 1024 / macs:.0f} / {n * 512 / macs:.0f}"
                else:
                    macs_s, per_k = f"{macs:.4g}", f"{n * 1024 / macs:.0f}"
                out.append([k.family, k.label, march, str(n), macs_s, per_k, note])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", choices=sorted({k.family for k in KERNELS}),
                    help="only these families (default: all)")
    ap.add_argument("--march", action="append", help=f"only these -march levels (default: {', '.join(MARCHES)})")
    args = ap.parse_args()
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        print(f"needs {', '.join(missing)} (Debian: apt-get install gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu)",
              file=sys.stderr)
        return 2
    kernels = [k for k in KERNELS if not args.family or k.family in args.family]
    ggml = pinned_tree() / "ggml" if any(k.source == "upstream" for k in kernels) else None
    with tempfile.TemporaryDirectory(prefix="arm_counts_") as tmp:
        table = rows(kernels, args.march or MARCHES, Path(tmp), ggml)
    print("Innermost multiply-accumulate loops, GCC -O3 (static count, no timing): "
          "instructions / 1024 MACs = loop instructions x 1024 / MACs per iteration.")
    print("| family | kernel | -march | loop instructions | MACs / iteration | instructions / 1024 MACs | note |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in table:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
