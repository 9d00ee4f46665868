"""``ggml-ext anyprec``: read a bitplane file (``convert --method anyprec``) and materialise one precision.

``extract FILE --bits B -o OUT.gguf`` writes precision B of every bitplane matrix as an ordinary F16 (or
Q8_0) tensor, every other tensor and key copied as is, so stock llama.cpp runs (and measures the
perplexity of) each precision the file serves: the reference the APQ op is checked against, and the
only way to run a file whose parent precision is not 8 (no ggml type holds it). Our llama.cpp runs an
APQ file directly at any precision (``--apq-bits``; docs/formats/anyprec.md).
``info FILE`` lists the precisions a file serves and the bytes each reads.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._args import int_range
from . import AnyPrecError, dequantize, planes_bytes, planes_type, tables_bytes

__all__ = ["BitplaneFile", "open_file", "extract", "add_arguments", "main"]

TABLES_SUFFIX = ".apq_tables"
FILE_TYPES = {"f16": 1, "q8_0": 7, "f32": 0}  # general.file_type (llama_ftype) of what extract writes


@dataclass
class BitplaneFile:
    path: Path
    gguf: object          # ggml_ext.gguf.GGUFFile
    seed: int
    parent: int
    matrices: list[str]   # names of the bitplane matrices

    def array(self, name: str) -> np.ndarray:
        t = self.gguf.tensor(name)
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.file_offset, shape=(t.nbytes,))

    def dims(self, name: str) -> tuple[int, int]:
        """(n_per_row, n_rows) of bitplane matrix ``name`` (an APQ tensor of that shape, or I8 (k/8, n, P))."""
        s = self.gguf.tensor(name).shape
        return (s[0], s[1]) if len(s) == 2 else (s[0] * 8, s[1])

    def planes(self, name: str) -> np.ndarray:
        """(P, n_rows, n_per_row / 8) uint8."""
        k, n = self.dims(name)
        return self.array(name).reshape(self.parent, n, k // 8)

    def tables(self, name: str) -> np.ndarray:
        return self.array(name + TABLES_SUFFIX).view(np.uint16)

    def weights(self, name: str, bits: int) -> np.ndarray:
        """Precision ``bits`` of matrix ``name`` as float32 (n_rows x n_per_row)."""
        planes = self.planes(name)
        return dequantize(planes[:bits], self.tables(name), planes.shape[2] * 8, bits, self.seed)


def open_file(path: str | os.PathLike) -> BitplaneFile:
    """A bitplane file's header; :class:`AnyPrecError` if it is not one or its tensors do not fit."""
    from ggml_ext.gguf import read_gguf
    g = read_gguf(path)
    if "ggml_ext.anyprec.version" not in g.kv:
        raise AnyPrecError(f"{path}: not an any-precision file (no ggml_ext.anyprec.version; write one with "
                           "ggml-ext convert --method anyprec)")
    from ggml_ext.formats import versions
    why = versions.problem(g.kv, path, g)
    if why:
        raise AnyPrecError(why)
    seed, parent = int(g.kv["ggml_ext.anyprec.seed_bits"]), int(g.kv["ggml_ext.anyprec.parent_bits"])
    names = {t.name for t in g.tensors}
    matrices = []
    for t in g.tensors:
        if t.name + TABLES_SUFFIX not in names:
            continue
        tab = g.tensor(t.name + TABLES_SUFFIX)
        if t.type_name == "I8":
            ok, k = len(t.shape) == 3 and t.shape[2] == parent, t.shape[0] * 8
        else:
            ok, k = t.type_name == planes_type(parent) and len(t.shape) == 2, t.shape[0]
        ok = (ok and tab.type_name == "F16" and len(tab.shape) == 1 and k % 32 == 0
              and tab.shape[0] == t.shape[1] * ((1 << (parent + 1)) - (1 << seed)))
        if not ok:
            raise AnyPrecError(f"{path}: tensor {t.name} ({t.type_name} {list(t.shape)}) with tables "
                               f"{tab.type_name} {list(tab.shape)} is not a {seed}..{parent}-bit bitplane matrix")
        matrices.append(t.name)
    return BitplaneFile(Path(path), g, seed, parent, matrices)


def extract(path: str | os.PathLike, bits: int, output: str | os.PathLike, type: str = "f16",  # noqa: A002
            force: bool = False, progress: bool = False) -> Path:
    """Write precision ``bits`` of the bitplane file ``path`` as an ordinary GGUF (matrices in ``type``:
    f16 -- exactly the b-bit values, which are fp16 table entries --, f32, the same values with llama.cpp
    multiplying in float32 as the APQ op does, or q8_0). Atomic: on any error no output exists."""
    from ggml_ext import quants
    from ggml_ext.gguf import GGUFWriter
    type = type.lower()  # noqa: A001
    if type not in FILE_TYPES:
        raise AnyPrecError(f"extract writes {', '.join(FILE_TYPES)}, not {type!r}")
    f = open_file(path)
    if not f.seed <= bits <= f.parent:
        raise AnyPrecError(f"{path} serves {f.seed}..{f.parent} bits, not {bits}")
    g = f.gguf
    tname = type.upper()
    mats = set(f.matrices)
    skip = {m + TABLES_SUFFIX for m in mats}
    w = GGUFWriter(output, force=force)
    for key, value in g.kv.items():
        if key.startswith("ggml_ext.anyprec."):
            continue
        if key == "general.file_type":
            value = FILE_TYPES[type]
        w.add(key, g.kv_types[key], value)
    w.add("ggml_ext.anyprec.extracted_bits", "u32", bits)
    for t in g.tensors:
        if t.name in skip:
            continue
        if t.name in mats:
            k, n = f.dims(t.name)
            w.add_tensor_info(t.name, (k, n), quants.type_id(tname), n * quants.row_size(tname, k))
        else:
            w.add_tensor_info(t.name, t.shape, t.type_id, t.nbytes)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(g.tensors) - len(skip), desc=f"extracting {bits} bits", file=sys.stderr, leave=False)
    with w:
        for t in g.tensors:
            if t.name in skip:
                continue
            if t.name in mats:
                rows = f.weights(t.name, bits)
                buf = np.empty(rows.shape[0] * quants.row_size(tname, rows.shape[1]), dtype=np.uint8)
                quants.quantize_rows_into(tname, rows, buf)
                w.write_tensor(buf)
            else:
                w.write_tensor(f.array(t.name))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return Path(output)


def describe(path: str | os.PathLike) -> str:
    """The precisions a bitplane file serves and what each reads."""
    f = open_file(path)
    g = f.gguf
    dims = {m: f.dims(m) for m in f.matrices}
    weights = sum(k * n for k, n in dims.values())
    lines = [f"{path}: any-precision bitplanes, {len(f.matrices)} matrices, {weights} weights, "
             f"precisions {f.seed}..{f.parent} (seed {f.seed}, parent {f.parent})",
             "bits  planes+table bytes read  bits/weight"]
    for b in range(f.seed, f.parent + 1):
        nbytes = sum(planes_bytes(n, k, b) + tables_bytes(n, b) for k, n in dims.values())
        lines.append(f"{b:>4}  {nbytes:>23}  {nbytes * 8 / weights:11.3f}")
    stored = sum(g.tensor(m).nbytes + g.tensor(m + TABLES_SUFFIX).nbytes for m in f.matrices)
    lines.append(f"stored (all precisions): {stored} bytes, {stored * 8 / weights:.3f} bits/weight")
    runnable = all(g.tensor(m).type_name != "I8" for m in f.matrices)
    lines.append(f"runs in ggml-ext's llama.cpp at --apq-bits {f.seed}..{f.parent} (default {f.parent})" if runnable
                 else f"parent {f.parent} has no ggml type (APQ is parent 8): `ggml-ext anyprec extract` only")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="anyprec_cmd", metavar="CMD", required=True)
    e = sub.add_parser("extract", help="write one precision of a bitplane file as an ordinary F16/Q8_0 GGUF "
                                       "(interim: until the bitplane op, for stock llama.cpp)")
    e.add_argument("file", metavar="FILE", help="bitplane GGUF (ggml-ext convert --method anyprec)")
    e.add_argument("--bits", type=int_range(1, 8), required=True, help="the precision to materialise")
    e.add_argument("-o", "--output", required=True, metavar="OUT.gguf")
    e.add_argument("--type", default="f16", choices=tuple(FILE_TYPES), help="type of the matrices (default f16)")
    e.add_argument("--force", action="store_true", help="replace OUT.gguf if it exists")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    i = sub.add_parser("info", help="the precisions a bitplane file serves and the bytes each reads")
    i.add_argument("file", metavar="FILE")


def main(args: argparse.Namespace) -> int:
    from ggml_ext.gguf import GGUFError, GGUFWriteError
    try:
        if args.anyprec_cmd == "info":
            print(describe(args.file))
            return 0
        out = extract(args.file, args.bits, args.output, args.type, force=args.force, progress=not args.quiet)
    except (AnyPrecError, GGUFError, GGUFWriteError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({args.bits} bits, {args.type})")
    return 0
