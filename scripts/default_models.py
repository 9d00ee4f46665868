#!/usr/bin/env python3
"""GGUF files of the default model (SmolLM2-135M-Instruct) in stock types, cached.

Types our converter writes (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, the
interleaved q4_0_*) come from the dequantized HF folder through `ggml_ext.convert`;
any other llama.cpp type from the f16 file by our llama-quantize -- IQ4_NL included,
so `default_model("IQ4_NL")` is ggml's quantizer, the stock reference (our converter's
iq4_nl uses ggml-ext's quantizer). Files live in <cache>/models/.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ggml_ext import assets, cache, tools  # noqa: E402
from ggml_ext.convert import TYPES, convert  # noqa: E402

NAME = "SmolLM2-135M-Instruct"


def models_dir() -> Path:
    d = cache.cache_root() / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


def default_model(ftype: str = "f16", quantize_tool: Path | None = None) -> Path:
    """Path of the default model at `ftype` (f16, Q8_0, Q4_0, ...), made on first use."""
    out = models_dir() / f"{NAME}-{ftype}.gguf"
    if out.exists():
        return out
    if ftype.lower() in TYPES and ftype.lower() != "iq4_nl":
        convert(assets.path("smollm2-hf"), out, ftype.lower())
        return out
    tmp = out.with_suffix(".tmp")
    quantize = str(quantize_tool) if quantize_tool else tools.command("llama-quantize")[0]
    subprocess.run([quantize, str(default_model("f16")), str(tmp), ftype], env=tools.tool_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp.replace(out)
    return out


def repacked_q4_0(layout: str = "8x8") -> Path:
    """default_model("Q4_0") through `ggml-ext repack --layout LAYOUT`: the very same weights,
    interleaved (a `convert --type q4_0_8_8` file matches it only if both came from the same converter)."""
    from ggml_ext import repack
    src = default_model("Q4_0")
    out = models_dir() / f"{NAME}-Q4_0-repack-{layout}.gguf"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        repack.repack(src, out, layout, force=True)
    return out


if __name__ == "__main__":
    for t in sys.argv[1:] or ["f16"]:
        print(default_model(t))
