#!/usr/bin/env python3
# Device runs: rebuilds the assets (HF folders, tokenizers) on the GPU machine for the scripts beside it.
"""The test models on the device machine, which has no PyPI: join carried pieces, check, dequantize.

The device takes at most 64 MiB per call, so the models' GGUF files travel in pieces
(``split -b 50000000 -d FILE PREFIX``: ``sm_part00``, ``sm_part01`` for the default model,
``gm_part00`` .. ``gm_part04`` for Gemma-3-270M) over several calls on one warm machine; each
call leaves its pieces in DEST. Once every piece of a model is there, this joins them, checks the
sha256 the asset pins (``ggml_ext.assets.pins``) and writes the same float32 Hugging Face folder the
``smollm2-hf`` / ``gemma3-hf`` assets are (``ggml_ext.assets.hf_folder``), with the device's
transformers (it needs the ``gguf`` package: carry its wheel, see docs/DEVELOPING.md "Device").

The device's transformers (5.17) makes a broken Gemma-3 tokenizer from the GGUF (no ``<bos>``, text cut
into single characters: perplexity 678 instead of 12 at 32K tokens), so the tokenizer files of the
folders made here travel too: a carried ``smollm2-hf/`` or ``gemma3-hf/`` folder holding ``tokenizer*``
files replaces the device's own. Every folder's tokenization of a probe sentence is printed for the log.

Usage (device, repository root):  python3 bench/device/device_assets.py DEST [PIECES_DIR ...]
Prints the folders that are ready (DEST/smollm2-hf, DEST/gemma3-hf).
"""
from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from ggml_ext.assets import hf_folder, pins  # noqa: E402

MODELS = {  # piece prefix -> (GGUF asset, HF folder asset, file name)
    "sm_part": ("smollm2-gguf", "smollm2-hf", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gm_part": ("gemma3-270m-gguf", "gemma3-hf", pins.GEMMA_NAME),
}
PIECES = {"sm_part": 2, "gm_part": 5}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv: list[str]) -> int:
    dest = Path(argv[0])
    dest.mkdir(parents=True, exist_ok=True)
    for src in map(Path, argv[1:]):  # this call's pieces: keep them for the next call's join
        for piece in src.glob("*_part*"):
            shutil.copyfile(piece, dest / piece.name)
        for hf_asset in ("smollm2-hf", "gemma3-hf"):  # tokenizer files made by this machine's transformers
            for f in (src / hf_asset).glob("tokenizer*"):
                (dest / "tokenizers" / hf_asset).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest / "tokenizers" / hf_asset / f.name)
    for prefix, (gguf_asset, hf_asset, name) in MODELS.items():
        folder = dest / hf_asset
        if (folder / "model.safetensors").is_file():
            ready(folder, dest / "tokenizers" / hf_asset)
            continue
        pieces = sorted(dest.glob(prefix + "*"))
        if len(pieces) < PIECES[prefix]:
            print(f"{hf_asset}: {len(pieces)} of {PIECES[prefix]} pieces so far")
            continue
        gguf = dest / name
        with gguf.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as f:
                    shutil.copyfileobj(f, out)
        want = pins.OUTPUT_SHA256[gguf_asset]
        if sha256(gguf) != want:
            print(f"{gguf}: sha256 differs from the pinned {want}: pieces missing or damaged", file=sys.stderr)
            return 1
        spec = hf_folder.HF_FOLDERS[hf_asset]
        tok, model = hf_folder._load_dequantized(gguf, progress=False)
        tmp = dest / (hf_asset + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        hf_folder._save(spec, model, tok, tmp, progress=False)
        tmp.rename(folder)
        ready(folder, dest / "tokenizers" / hf_asset)
    return 0


def ready(folder: Path, tokenizer_files: Path) -> None:
    """Put the carried tokenizer files (if any) into ``folder``; say how it tokenizes a probe."""
    from transformers import AutoTokenizer

    for f in sorted(tokenizer_files.glob("tokenizer*")):
        shutil.copyfile(f, folder / f.name)
    ids = AutoTokenizer.from_pretrained(folder).encode("The capital of France is Paris.")
    print(f"ready: {folder} (tokenizer files {'carried' if tokenizer_files.is_dir() else 'made here'}; "
          f"probe -> {ids[:8]})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
