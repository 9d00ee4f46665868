"""`ggml-ext imatrix`: importance matrices (mean squared activations per weight column).

    ggml-ext imatrix MODEL.gguf -o model.imatrix                  # our llama-imatrix on wiki-train
    ggml-ext imatrix MODEL.gguf --text FILE -o model.imatrix --chunks 64
    ggml-ext convert HF_DIR -o model.iq4_nl.gguf --type iq4_nl --imatrix model.imatrix

Making one runs our build's ``llama-imatrix`` (``--chunks`` windows of ``--ctx-size``
tokens, GGUF output written atomically). :func:`load` reads what ``llama-imatrix`` of the
pinned llama.cpp writes -- the GGUF format (``<tensor>.in_sum2`` and ``<tensor>.counts``,
F32, ``general.type = imatrix``) and the legacy ``.dat`` format -- into per-tensor
float32 vectors, normalised as ``llama-quantize`` does (sums / counts; a matrix with
zero count gets ones). Malformed files raise :class:`ImatrixError` naming the problem.
"""
from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Imatrix", "ImatrixError", "load", "make", "add_arguments", "main"]

_MAX_ENTRIES = 1 << 20
_MAX_NAME = 4096
_MAX_VALUES = 1 << 30


class ImatrixError(ValueError):
    """An importance-matrix file that cannot be used."""


@dataclass
class Imatrix:
    """Per weight tensor (GGUF name), the importances: shape (n_mat, n_per_row), n_mat > 1 for experts."""

    entries: dict[str, np.ndarray]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    legacy: bool = False
    path: str = ""

    def for_tensor(self, name: str, n_per_row: int) -> np.ndarray | None:
        """The importances of one 2-D weight matrix (``n_per_row`` values), None if the file has none."""
        e = self.entries.get(name)
        if e is None:
            return None
        if e.shape[0] != 1 or e.shape[1] != n_per_row:
            raise ImatrixError(f"{self.path}: entry {name} has {e.shape[0]} x {e.shape[1]} values, expected "
                               f"1 x {n_per_row} (a row length of this tensor)")
        return e[0]


def load(path: str | os.PathLike) -> Imatrix:
    """Read an imatrix file (GGUF or legacy .dat) written by llama-imatrix."""
    p = Path(path)
    if not p.is_file():
        raise ImatrixError(f"imatrix file not found: {p}")
    with open(p, "rb") as f:
        magic = f.read(4)
    im = _load_gguf(p) if magic == b"GGUF" else _load_legacy(p)
    if not im.entries:
        raise ImatrixError(f"{p}: no importance entries")
    for name, e in im.entries.items():
        if not (np.isfinite(e).all() and (e >= 0).all()):
            raise ImatrixError(f"{p}: entry {name} holds NaN, infinite or negative values")
    return im


def _load_gguf(p: Path) -> Imatrix:
    from ..gguf import GGUFError, read_gguf
    try:
        g = read_gguf(p)
    except GGUFError as e:
        raise ImatrixError(f"{p}: not a readable GGUF imatrix: {e}") from None
    if g.kv.get("general.type") not in (None, "imatrix"):
        raise ImatrixError(f"{p}: general.type is {g.kv.get('general.type')!r}, not 'imatrix' (a model file?)")
    sums, counts = {}, {}
    for t in g.tensors:
        for suffix, into in ((".in_sum2", sums), (".counts", counts)):
            if t.name.endswith(suffix):
                if t.type_name != "F32":
                    raise ImatrixError(f"{p}: tensor {t.name} is {t.type_name}, expected F32")
                into[t.name[: -len(suffix)]] = t
    if set(sums) != set(counts):
        odd = sorted(set(sums) ^ set(counts))
        raise ImatrixError(f"{p}: sums and counts do not pair up for {', '.join(odd[:5])}")
    entries: dict[str, np.ndarray] = {}
    with open(p, "rb") as f:
        def read(t) -> np.ndarray:
            f.seek(t.file_offset)
            b = f.read(t.nbytes)
            if len(b) != t.nbytes:
                raise ImatrixError(f"{p}: tensor {t.name} is truncated")
            return np.frombuffer(b, dtype="<f4").astype(np.float32)
        for name, ts in sums.items():
            s, c = read(ts), read(counts[name])
            n_mat = c.size
            if n_mat == 0 or s.size % n_mat or s.size == 0:
                raise ImatrixError(f"{p}: entry {name} has {s.size} sums for {n_mat} counts")
            s = s.reshape(n_mat, -1)
            if not np.isfinite(c).all() or (c < 0).any():
                raise ImatrixError(f"{p}: entry {name} has invalid counts")
            c = np.rint(c)
            e = np.ones_like(s)
            ok = c > 0
            e[ok] = s[ok] / c[ok, None]
            entries[name] = e
    ds = g.kv.get("imatrix.datasets") or []
    return Imatrix(entries, [str(d) for d in ds], int(g.kv.get("imatrix.chunk_count", 0) or 0), False, str(p))


def _load_legacy(p: Path) -> Imatrix:
    data = p.read_bytes()
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ImatrixError(f"{p}: truncated legacy imatrix (reading {what} at byte {pos})")
        b = data[pos:pos + n]
        pos += n
        return b

    def i32(what: str) -> int:
        return struct.unpack("<i", take(4, what))[0]

    n = i32("the entry count")
    if not 1 <= n <= _MAX_ENTRIES:
        raise ImatrixError(f"{p}: neither a GGUF nor a legacy imatrix (entry count {n})")
    entries: dict[str, np.ndarray] = {}
    for i in range(n):
        ln = i32(f"entry {i}'s name length")
        if not 1 <= ln <= _MAX_NAME:
            raise ImatrixError(f"{p}: entry {i} has a name length of {ln}")
        try:
            name = take(ln, f"entry {i}'s name").decode()
        except UnicodeDecodeError:
            raise ImatrixError(f"{p}: entry {i}'s name is not UTF-8") from None
        ncall = i32(f"{name}'s call count")
        nval = i32(f"{name}'s value count")
        if not 1 <= nval <= _MAX_VALUES:
            raise ImatrixError(f"{p}: entry {name} has {nval} values")
        v = np.frombuffer(take(4 * nval, f"{name}'s values"), dtype="<f4").astype(np.float32)
        entries[name] = (v / ncall if ncall > 0 else v).reshape(1, -1)
    chunks, datasets = 0, []
    if len(data) - pos >= 8:  # optional trailer: chunk count, dataset name
        chunks = i32("the chunk count")
        ln = i32("the dataset name length")
        if 0 < ln <= len(data) - pos:
            datasets = [take(ln, "the dataset name").decode(errors="replace")]
    return Imatrix(entries, datasets, chunks, True, str(p))


def make(model: str | os.PathLike, output: str | os.PathLike, text: str | os.PathLike | None = None,
         chunks: int = 32, n_ctx: int = 512, threads: int | None = None, force: bool = False,
         echo: bool = False) -> Path:
    """Run our llama-imatrix on ``model`` over ``text`` (default: the wiki-train asset); GGUF output."""
    from .. import assets, tools
    out = Path(output)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists (use --force to replace it)")
    text = Path(text) if text is not None else assets.path("wiki-train")
    for f in (Path(model), text):
        if not f.is_file():
            raise FileNotFoundError(f"not found: {f}")
    if chunks < 1 or n_ctx < 8:
        raise ValueError("--chunks must be >= 1 and --ctx-size >= 8")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".imatrix-", dir=out.parent) as tmp:
        tmp_out = Path(tmp) / "imatrix.gguf"
        args = ["-m", model, "-f", text, "-o", tmp_out, "--output-format", "gguf", "--chunks", str(chunks),
                "-c", str(n_ctx), "--no-ppl"]
        if threads:
            args += ["-t", str(threads)]
        proc = subprocess.run(tools.command("llama-imatrix", *args), env=tools.tool_env(),
                              stdout=None if echo else subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace")
        if proc.returncode != 0 or not tmp_out.is_file():
            tail = "\n".join((proc.stdout or "").strip().splitlines()[-15:])
            raise RuntimeError(f"llama-imatrix failed (exit {proc.returncode}):\n{tail}")
        load(tmp_out)  # what we hand out must be readable
        os.replace(tmp_out, out)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF model (f16 or better: the activations of the full-precision model)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.imatrix", help="file to write (GGUF imatrix)")
    p.add_argument("--text", default=None, help="calibration text (default: the wiki-train asset)")
    p.add_argument("--chunks", type=int, default=32, help="windows of --ctx-size tokens to run (default 32)")
    p.add_argument("-c", "--ctx-size", type=int, default=512)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("-v", "--verbose", action="store_true", help="show llama-imatrix's output")


def main(args: argparse.Namespace) -> int:
    try:
        out = make(args.model, args.output, args.text, args.chunks, args.ctx_size, args.threads, args.force,
                   args.verbose)
        im = load(out)
    except (FileNotFoundError, FileExistsError, RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{out}: {len(im.entries)} tensors, {im.chunk_count} chunks of {args.ctx_size} tokens")
    return 0
