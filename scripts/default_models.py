#!/usr/bin/env python3
"""GGUF files of the default model (SmolLM2-135M-Instruct) in stock types, cached.

f16 comes from the dequantized HF folder through the pinned llama.cpp's
convert_hf_to_gguf.py (a reference tool until our converter lands); other types
from f16 by our llama-quantize. Files live in <cache>/models/.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch_llama_cpp  # noqa: E402

from ggml_ext import assets, cache, tools  # noqa: E402

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
    tmp = out.with_suffix(".tmp")
    if ftype == "f16":
        tree = fetch_llama_cpp.pristine_tree()
        env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"), HF_HUB_OFFLINE="1")
        subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(assets.path("smollm2-hf")),
                        "--outtype", "f16", "--outfile", str(tmp)], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        quantize = str(quantize_tool) if quantize_tool else tools.command("llama-quantize")[0]
        subprocess.run([quantize, str(default_model("f16")), str(tmp), ftype], env=tools.tool_env(), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp.replace(out)
    return out


if __name__ == "__main__":
    for t in sys.argv[1:] or ["f16"]:
        print(default_model(t))
