"""`ggml-ext chat`: talk to a GGUF model through llama-cpp-python on our libllama.

Uses the chat template stored in the file. Streams tokens as they come.
Exits non-zero when the model fails to load (upstream's llama-cli exits 0).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from ._args import int_range
from .llama_cpp_glue import BindingError, Llama


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    p.add_argument("-p", "--prompt", help="one-shot: answer this prompt and exit")
    p.add_argument("-s", "--system", help="system message")
    p.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens per answer (default 256)")
    p.add_argument("-c", "--ctx-size", type=int, default=2048, help="context size (default 2048)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--temp", type=float, default=0.0, help="temperature (default 0: greedy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--apq-bits", type=int_range(1, 8), default=None, metavar="B",
                   help="precision of an any-precision file (convert --method anyprec; default: its highest)")


def stream_reply(llm, messages: list[dict], max_tokens: int, temperature: float) -> Iterator[str]:
    for chunk in llm.create_chat_completion(messages=messages, max_tokens=max_tokens,
                                            temperature=temperature, stream=True):
        piece = chunk["choices"][0]["delta"].get("content")
        if piece:
            yield piece


def main(args: argparse.Namespace) -> int:
    try:
        llm = Llama(args.model, n_ctx=args.ctx_size, n_threads=args.threads, seed=args.seed, apq_bits=args.apq_bits)
    except (BindingError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError) as e:
        print(f"error: failed to load {args.model}: {e}", file=sys.stderr)
        return 1
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []

    def answer(text: str) -> None:
        messages.append({"role": "user", "content": text})
        reply = []
        for piece in stream_reply(llm, messages, args.max_tokens, args.temp):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})

    if args.prompt is not None:
        answer(args.prompt)
        return 0
    interactive = sys.stdin.isatty()
    if interactive:
        print("ggml-ext chat: empty line or Ctrl-D to quit", file=sys.stderr)
    try:
        while True:
            if interactive:
                sys.stderr.write("> ")
                sys.stderr.flush()
            line = sys.stdin.readline()
            if not line or not line.strip():
                return 0
            answer(line.strip())
    except KeyboardInterrupt:
        return 130
