"""Greedy tokens and logits of one GGUF file through our llama.cpp (llama-cpp-python).

Run in a fresh process per file, so that GGML_EXT_RUNTIME_REPACK (read once, at the
first weight) applies:  python q4_0_probe.py MODEL THREADS OUT.npz [N]
Saves the prompt's tokens, N greedy tokens (temperature 0: the prompt runs through the
GEMM path, each new token through the GEMV path) and the logits at every position of
prompt + tokens[:-1] evaluated in one batch.
"""
from __future__ import annotations

import sys

import numpy as np

PROMPT = "The capital of France is"


def main(path: str, threads: int, out: str, n: int = 32) -> None:
    from ggml_ext.llama_cpp_glue import Llama
    llm = Llama(path, n_ctx=256, n_threads=threads, n_threads_batch=threads, seed=0, logits_all=True)
    prompt = llm.tokenize(PROMPT.encode())
    tokens: list[int] = []
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        tokens.append(int(tok))
        if len(tokens) == n:
            break
    seq = prompt + tokens[:-1]
    llm.reset()
    llm.eval(seq)
    np.savez(out, prompt=np.array(prompt), tokens=np.array(tokens), logits=np.array(llm.scores[:len(seq)]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], *(int(a) for a in sys.argv[4:5]))
