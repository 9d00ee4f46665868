"""Greedy tokens and logits of one GGUF file through our llama.cpp (llama-cpp-python).

Run in a fresh process per file and path, so that GGML_EXT_RUNTIME_REPACK (read once, at
the first weight) and the extra-buffer switch apply to this run only:

    python q4_0_probe.py MODEL THREADS OUT.npz [--n N] [--seq SEQ.npy] [--plain]

Without --seq: the prompt's tokens, N greedy tokens (temperature 0: the prompt runs
through the GEMM path, each new token through the GEMV path) and the logits at every
position of prompt + tokens[:-1] evaluated in one batch. With --seq: only the logits at
every position of that token sequence (one batch). --plain turns off llama.cpp's extra
buffer types (no runtime repack: stock Q4_0 / IQ4_NL run ggml's plain vec_dot kernels).

`run()` is the in-test entry point: it starts this script and returns the arrays.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

PROMPT = "The capital of France is"
# GGML_EXT_RUNTIME_REPACK=0: plain Q4_0 weights go to upstream's runtime repack, not ours.
UPSTREAM_REPACK = {"GGML_EXT_RUNTIME_REPACK": "0"}


def _llama(path: str, threads: int, plain: bool):
    from ggml_ext.llama_cpp_glue import Llama, load_llama_cpp
    load_llama_cpp()
    import llama_cpp.llama as llama_mod
    default_params = llama_mod.llama_cpp.llama_model_default_params

    def params():
        p = default_params()
        p.use_extra_bufts = not plain
        return p

    llama_mod.llama_cpp.llama_model_default_params = params
    try:
        return Llama(path, n_ctx=256, n_threads=threads, n_threads_batch=threads, seed=0, logits_all=True)
    finally:
        llama_mod.llama_cpp.llama_model_default_params = default_params


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("threads", type=int)
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seq", help=".npy file of token ids: only the forced logits along them")
    ap.add_argument("--plain", action="store_true", help="no extra buffer types (no runtime repack)")
    a = ap.parse_args(argv)
    llm = _llama(a.model, a.threads, a.plain)
    if a.seq:
        seq = [int(t) for t in np.load(a.seq)]
        llm.reset()
        llm.eval(seq)
        np.savez(a.out, logits=np.array(llm.scores[:len(seq)]))
        return
    prompt = llm.tokenize(PROMPT.encode())
    tokens: list[int] = []
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        tokens.append(int(tok))
        if len(tokens) == a.n:
            break
    seq = prompt + tokens[:-1]
    llm.reset()
    llm.eval(seq)
    np.savez(a.out, prompt=np.array(prompt), tokens=np.array(tokens), logits=np.array(llm.scores[:len(seq)]))


def run(path, threads: int, tmp_path: Path, *, seq=None, plain: bool = False, env: dict | None = None,
        n: int = 32) -> dict[str, np.ndarray]:
    """This script in a fresh process; returns its arrays (prompt, tokens, logits or only logits)."""
    tag = f"{Path(path).stem}-{threads}-{int(plain)}-{'-'.join(f'{k}={v}' for k, v in (env or {}).items())}"
    out = tmp_path / f"probe-{tag}-{'seq' if seq is not None else 'greedy'}.npz"
    args = [sys.executable, __file__, str(path), str(threads), str(out), "--n", str(n)]
    if seq is not None:
        np.save(tmp_path / f"seq-{tag}.npy", np.asarray(seq, dtype=np.int64))
        args += ["--seq", str(tmp_path / f"seq-{tag}.npy")]
    if plain:
        args.append("--plain")
    proc = subprocess.run(args, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


# ---------------------------------------------------------------- comparison with stock paths

CLEAR_MARGIN = 0.5  # logits: a top-1 choice at least this far ahead of the runner-up is "clear"


def stock_reference(path, threads: int, tmp_path: Path) -> dict:
    """The stock file through upstream's code: its greedy tokens and the logits along them with
    upstream's runtime repack (GGML_EXT_RUNTIME_REPACK=0, so never our kernels) and with no
    repack at all (ggml's plain vec_dot). The distance between those two stock paths is the
    noise floor an interleaved file of ours is held to."""
    g = run(path, threads, tmp_path, env=UPSTREAM_REPACK)
    prompt, tokens = g["prompt"].tolist(), g["tokens"].tolist()
    seq = prompt + tokens[:-1]
    at = slice(len(prompt) - 1, len(seq))
    ref = g["logits"][at]
    plain = run(path, threads, tmp_path, seq=seq, plain=True, env=UPSTREAM_REPACK)["logits"][at]
    noise = np.abs(plain - ref)
    return dict(prompt=prompt, tokens=tokens, seq=seq, at=at, ref=ref, plain=plain,
                noise_mean=float(noise.mean()), noise_max=float(noise.max()))


def assert_close_to_stock(ours: np.ndarray, reference: dict, label: str) -> None:
    """Our logits along the stock greedy tokens lie as far from stock's repack path as stock's own
    plain path does (mean |dlogit| within 1.5x; the single largest |dlogit| within 2x: a maximum
    over ~1.5 M logits is set by the one position where a rounding step of the next layer's Q8_0
    activations flips, so it varies more from draw to draw than the mean), and pick stock's
    top-1 token wherever that choice is clear.

    Which positions are clear depends on the model, the CPU and the thread count (a 32-token
    continuation of a 135M model wanders into near-ties), so nothing here presumes how many
    there are: the bounds above hold at every position, the top-1 check wherever it is
    meaningful."""
    ref, plain = reference["ref"], reference["plain"]
    diff = np.abs(ours - ref)
    assert diff.mean() <= 1.5 * reference["noise_mean"], (label, diff.mean(), reference["noise_mean"])
    assert diff.max() <= 2.0 * reference["noise_max"], (label, diff.max(), reference["noise_max"])
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > CLEAR_MARGIN
    assert (ours.argmax(1) == ref.argmax(1))[clear].all(), (label, np.flatnonzero(clear & (ours.argmax(1) != ref.argmax(1))))
    agree = int((ours.argmax(1) == ref.argmax(1)).sum())
    print(f"\n{label}: mean |dlogit| vs stock repack {diff.mean():.4f}, vs stock plain "
          f"{np.abs(ours - plain).mean():.4f} (stock paths apart {reference['noise_mean']:.4f}); max "
          f"{diff.max():.4f} ({reference['noise_max']:.4f}); clear positions {int(clear.sum())}/{len(ref)}, "
          f"top-1 agreement {agree}/{len(ref)}")


if __name__ == "__main__":
    main()
