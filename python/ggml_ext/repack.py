"""`ggml-ext repack`: a GGUF file's Q4_0 or IQ4_NL weight matrices in an interleaved layout, or back.

    ggml-ext repack model-q4_0.gguf model-q4_0_8_8.gguf --layout 8x8
    ggml-ext repack model-q4_0.gguf model-fast.gguf              # --layout auto: best for this CPU
    ggml-ext repack model-q4_0.gguf model-g3.gguf --target graviton3   # best for another CPU
    ggml-ext repack model-q4_0_8_8.gguf model-q4_0.gguf --layout q4_0
    ggml-ext repack model-iq4_nl.gguf model-iq4_nl_8_8.gguf --layout 8x8
    ggml-ext repack model-iq4_nl_8_8.gguf model-iq4_nl.gguf --layout iq4_nl

Layouts (ggml-ext's restored types, byte-compatible with llama.cpp's 2024 files):
``4x4`` = Q4_0_4_4 (Arm NEON dotprod), ``4x8`` = Q4_0_4_8 (Arm i8mm), ``8x8`` =
Q4_0_8_8 (x86 AVX2, Arm SVE-256). ``auto`` picks from this machine's CPU: AVX2 ->
8x8, SVE with 256-bit vectors and i8mm -> 8x8, i8mm -> 4x8, dotprod -> 4x4; ``--target``
picks for a named CPU instead (ggml_ext.targets, docs/ARM.md). ``q4_0`` turns interleaved
Q4_0 tensors back into Q4_0.
IQ4_NL matrices take the same layouts (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8: the same
interleave without the XOR); ``iq4_nl`` turns them back. A layout applies to the Q4_0
and the IQ4_NL matrices of a file alike.

An interleaved tensor has exactly the size of the Q4_0 tensor it came from, so the
output is the input file with each converted tensor's type id and data rewritten in
place: metadata, offsets and every other tensor stay byte for byte the same, and
repacking then unpacking gives back the original file. The tensors converted are the
2-D Q4_0 matrices of the blocks (``blk.*``) and ``output.weight`` whose row count divides
by the layout's N; ``token_embd.weight`` stays Q4_0 because llama.cpp reads it with
``get_rows``, which needs a plain type. ``general.file_type`` follows: 2 (mostly Q4_0)
becomes 33/34/35 (the 2024 LLAMA_FTYPE_MOSTLY_Q4_0_4_4/4_8/8_8, what ``convert --type
q4_0_8_8`` writes) and back; any other value is left as it was (interleaved IQ4_NL
never had a file type of its own: an IQ4_NL file stays 25, MOSTLY_IQ4_NL).
The files are loaded (and mmap-ed, no copy) by our llama.cpp only.
"""
from __future__ import annotations

import argparse
import mmap
import os
import platform
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import _atomic, formats, quants, targets
from .gguf import GGUFError, read_gguf

__all__ = ["LAYOUTS", "Q4_0_LAYOUTS", "IQ4_LAYOUTS", "RepackError", "RepackResult", "auto_layout", "repack", "add_arguments", "main"]

#: interleaved layout -> the type a Q4_0 / an IQ4_NL matrix becomes (the registry's interleaved4 rows)
Q4_0_LAYOUTS = {t.layout_name: t.name for t in formats.family("interleaved4", "Q4_0")}
IQ4_LAYOUTS = {t.layout_name: t.name for t in formats.family("interleaved4", "IQ4_NL")}
#: --layout value -> target ggml type name (of a Q4_0 matrix for the interleaved ones)
LAYOUTS = {**Q4_0_LAYOUTS, "q4_0": "Q4_0", "iq4_nl": "IQ4_NL"}
_ROWS = {t.layout_name: t.row_group for t in formats.family("interleaved4", "Q4_0")}
#: general.file_type (llama_ftype) of a file mostly of each type
FILE_TYPES = {"Q4_0": 2, "Q4_0_4_4": 33, "Q4_0_4_8": 34, "Q4_0_8_8": 35}


class RepackError(ValueError):
    """The file or the requested layout cannot be repacked."""


@dataclass
class RepackResult:
    path: Path
    type_name: str                    # target type
    converted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)   # candidate matrices left as they were, with the reason

    def __str__(self) -> str:
        return (f"{self.path}: {len(self.converted)} tensors -> {self.type_name}"
                + (f", {len(self.kept)} kept" if self.kept else ""))


def _cpu_features() -> set[str]:
    feats: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    feats.update(value.split())
    except OSError:
        pass
    return feats


def _sve_vector_bytes() -> int | None:
    """The SVE vector length Linux gives new processes, in bytes (None without SVE)."""
    try:
        return int(Path("/proc/sys/abi/sve_default_vector_length").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def auto_layout(features: set[str] | None = None, machine: str | None = None, sve_bytes: int | None = None) -> str:
    """The layout whose kernels this CPU runs fastest: x86 AVX2 -> 8x8; Arm SVE-256 with i8mm
    -> 8x8, i8mm -> 4x8, dotprod -> 4x4 (the choices of ggml_ext.targets for the named CPUs)."""
    feats = _cpu_features() if features is None else features
    machine = (machine or platform.machine()).lower()
    if machine in ("x86_64", "amd64", "i686", "i386"):
        if "avx2" in feats:
            return "8x8"
    elif machine in ("aarch64", "arm64"):
        if sve_bytes is None and features is None:
            sve_bytes = _sve_vector_bytes()
        if {"sve", "svei8mm"} <= feats and sve_bytes == 32:
            return "8x8"
        if "i8mm" in feats:
            return "4x8"
        if "asimddp" in feats:
            return "4x4"
    raise RepackError(f"no interleaved layout has SIMD kernels for this CPU ({machine}); "
                      "choose one with --layout 4x4|4x8|8x8 (the generic kernels run any of them)")


def _candidate(name: str) -> bool:
    return name.startswith("blk.") or name == "output.weight"


def _file_type_offset(header: bytes) -> int | None:
    """Position of general.file_type's uint32 value in the metadata, if it is stored as one."""
    key = b"general.file_type"
    pattern = struct.pack("<Q", len(key)) + key + struct.pack("<I", 4)  # GGUF value type 4: uint32
    at = header.find(pattern)
    if at < 0 or header.find(pattern, at + 1) >= 0:
        return None
    return at + len(pattern)


def repack(input: str | os.PathLike, output: str | os.PathLike, layout: str = "auto", *,  # noqa: A002
           force: bool = False, target: str | None = None) -> RepackResult:
    """Rewrite ``input``'s Q4_0 / IQ4_NL matrices as ``layout``, those interleaved in another layout included (or, for
    ``layout="q4_0"`` / ``"iq4_nl"``, interleaved ones as the plain type).
    ``target`` (a ggml_ext.targets name, with ``layout="auto"``) picks the layout for that CPU."""
    if target is not None:
        if layout != "auto":
            raise RepackError(f"--target {target} chooses the layout: give --layout {layout} or --target, not both")
        try:
            layout = targets.target(target).layout
        except ValueError as e:
            raise RepackError(str(e)) from None
    layout = auto_layout() if layout == "auto" else layout
    if layout not in LAYOUTS:
        raise RepackError(f"unknown layout {layout!r}; choose from auto, {', '.join(LAYOUTS)}")
    to_type = LAYOUTS[layout]
    src, out = Path(input), Path(output)
    if out.exists() and not force:
        raise RepackError(f"{out} exists (use --force to replace it)")
    if out.exists() and src.resolve() == out.resolve():
        raise RepackError("input and output are the same file")
    try:
        info = read_gguf(src)
    except (OSError, GGUFError) as e:
        raise RepackError(f"{src}: {e}") from None
    from .formats import versions
    why = versions.problem(info.kv, src, info)
    if why:  # a newer ggml-ext's blocks may differ from the ones this build rewrites
        raise RepackError(why)

    result = RepackResult(out, to_type if layout in ("q4_0", "iq4_nl") else f"{to_type}/{IQ4_LAYOUTS[layout]}")
    jobs = []  # (tensor, from type, to type)
    for t in info.tensors:
        if not _candidate(t.name) or len(t.shape) != 2:
            continue
        if layout in ("q4_0", "iq4_nl"):
            if t.type_name in (quants.INTERLEAVED if layout == "q4_0" else quants.INTERLEAVED_IQ4_NL):
                jobs.append((t, t.type_name, to_type))
            continue
        # plain Q4_0 / IQ4_NL, or already interleaved in another layout (unpacked, then interleaved again)
        plain = ("Q4_0" if t.type_name in quants.INTERLEAVED else
                 "IQ4_NL" if t.type_name in quants.INTERLEAVED_IQ4_NL else t.type_name)
        if plain not in ("Q4_0", "IQ4_NL"):
            continue
        want = to_type if plain == "Q4_0" else IQ4_LAYOUTS[layout]
        if t.type_name == want:
            result.kept.append(f"{t.name}: already {want}")
            continue
        n = _ROWS[layout]
        if t.shape[1] % n:
            result.kept.append(f"{t.name}: {t.shape[1]} rows, not a multiple of {n}")
            continue
        jobs.append((t, t.type_name, want))
    if jobs and layout not in ("q4_0", "iq4_nl"):
        result.type_name = "/".join(sorted({to for _, _, to in jobs}))

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _atomic.temp_file(out)   # named for this process; removes a dead run's leftover
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        with open(src, "rb") as fin, open(tmp, "r+b") as fout:
            mm = mmap.mmap(fin.fileno(), 0, access=mmap.ACCESS_READ) if info.file_size else None
            try:
                ft_at = _file_type_offset(mm[:info.data_offset]) if mm is not None else None
                q4_jobs = [j for j in jobs if {"Q4_0", *quants.INTERLEAVED} & {j[1], j[2]}]
                if q4_jobs and ft_at is not None:
                    old = struct.unpack("<I", mm[ft_at:ft_at + 4])[0]
                    if old in FILE_TYPES.values() and old != FILE_TYPES[to_type]:
                        fout.seek(ft_at)
                        fout.write(struct.pack("<I", FILE_TYPES[to_type]))
                for t, from_type, to_type in jobs:
                    data = mm[t.file_offset:t.file_offset + t.nbytes]
                    if from_type in quants.INTERLEAVED and to_type in quants.INTERLEAVED:  # layout to layout
                        data = quants.unpack_q4_0(from_type, data, t.shape[1], t.shape[0]).tobytes()
                        from_type = "Q4_0"
                    elif from_type in quants.INTERLEAVED_IQ4_NL and to_type in quants.INTERLEAVED_IQ4_NL:
                        data = quants.unpack_iq4_nl(from_type, data, t.shape[1], t.shape[0]).tobytes()
                        from_type = "IQ4_NL"
                    if to_type == "Q4_0":
                        new = quants.unpack_q4_0(from_type, data, t.shape[1], t.shape[0])
                    elif to_type == "IQ4_NL":
                        new = quants.unpack_iq4_nl(from_type, data, t.shape[1], t.shape[0])
                    elif from_type == "IQ4_NL":
                        new = quants.repack_iq4_nl(to_type, data, t.shape[1], t.shape[0])
                    else:
                        new = quants.repack_q4_0(to_type, data, t.shape[1], t.shape[0])
                    fout.seek(t.file_offset)
                    fout.write(new.tobytes())
                    fout.seek(t.type_field_offset)
                    fout.write(struct.pack("<i", quants.type_id(to_type)))
                    result.converted.append(t.name)
            finally:
                if mm is not None:
                    mm.close()
            fout.flush()
            os.fsync(fout.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN.gguf",
                   help="GGUF file with Q4_0 or IQ4_NL matrices, plain or interleaved in another layout")
    p.add_argument("output", metavar="OUT.gguf", help="file to write")
    p.add_argument("--layout", default="auto", choices=["auto", *LAYOUTS], type=str.lower,
                   help=", ".join(f"{lay} ({q} / {IQ4_LAYOUTS[lay]})" for lay, q in Q4_0_LAYOUTS.items())
                   + ", auto (from this CPU), q4_0 / iq4_nl (back to the plain type); default auto")
    p.add_argument("--target", metavar="CPU", type=str.lower,
                   help="choose the layout for this CPU instead of the one running: " + ", ".join(
                       f"{t.name} ({t.layout})" for t in targets.TARGETS.values()) + " (docs/ARM.md)")
    p.add_argument("--force", action="store_true", help="replace OUT.gguf if it exists")


def main(args: argparse.Namespace) -> int:
    try:
        result = repack(args.input, args.output, args.layout, force=args.force, target=args.target)
    except RepackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for k in result.kept:
        print(f"kept: {k}", file=sys.stderr)
    print(result)
    return 0
