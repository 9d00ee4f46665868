"""The default model, ``smollm2-hf``: the SmolLM2 GGUF dequantized to a Hugging Face folder.

transformers reads the GGUF and saves a float32 folder; the folder is then loaded
again in a fresh offline interpreter and must give the same tokens and logits as the
model it was saved from.  Its bytes depend on the transformers version, so it has no
pinned sha256.  torch, transformers and numpy are imported only when it is built.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import _atomic
from .download import Ctx
from .pins import ASSETS, SMOLLM2_MEMBER
from .report import AssetError
from .store import Staged

# The check run on a freshly written HF folder, in a fresh offline interpreter.
_HF_CHECK = r"""
import json, sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, work = sys.argv[1], sys.argv[2]
spec = json.load(open(work + "/spec.json", encoding="utf-8"))
tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
model.eval()
assert tok.chat_template, "the saved tokenizer has no chat template"
enc = tok.apply_chat_template(spec["messages"], add_generation_prompt=True, return_dict=True, return_tensors="pt")
with torch.no_grad():
    logits = model(input_ids=enc["input_ids"]).logits[0].float().numpy()
np.save(work + "/logits.npy", logits)
json.dump({
    "chat_ids": enc["input_ids"][0].tolist(),
    "text_ids": [tok(t)["input_ids"] for t in spec["texts"]],
    "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    "model_class": type(model).__name__,
}, open(work + "/result.json", "w", encoding="utf-8"))
"""

_HF_CHECK_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
_HF_CHECK_TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  Numbers 12345, naïve café, Zürich, 東京, emoji 🙂\n\n\ttabs and\r\nnewlines  ",
]


def check_requirements(todo: list[str]) -> None:
    """Fail early, before any download, when ``smollm2-hf`` is due and cannot be made here."""
    if "smollm2-hf" not in todo:
        return
    needed = ("torch", "transformers", "accelerate", "safetensors", "gguf", "numpy")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise AssetError(
            f"the smollm2-hf asset is made with transformers, which needs {', '.join(needed)}; "
            f"missing here: {', '.join(missing)} (pip install 'ggml-ext[convert]' accelerate)"
        )


def _dtype_kwarg(transformers: Any, dtype: Any) -> dict[str, Any]:
    version = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    return {"dtype": dtype} if version >= (4, 56) else {"torch_dtype": dtype}


@contextlib.contextmanager
def _transformers_quiet(progress: bool) -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    if progress:
        yield
        return
    # transformers' own bars obey disable_progress_bar(); some of its GGUF code uses plain
    # tqdm, which writes to whatever sys.stderr is when the bar is made.
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _load_dequantized(gguf: Path, progress: bool) -> tuple[Any, Any]:
    """Tokenizer and float32 model from ``gguf``, with no GGUF quantizer left on it."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = _dtype_kwarg(transformers, torch.float32)
    try:  # newer transformers keep GGUF blocks packed unless told to dequantize
        from transformers.utils.quantization_config import GgufConfig

        if "dequantize" in inspect.signature(GgufConfig.__init__).parameters:
            kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    with _transformers_quiet(progress):
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, **kwargs)
    model.eval()
    packed = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    odd = sorted({f"{type(p).__name__}/{p.dtype}" for p in model.parameters()
                  if type(p) is not torch.nn.Parameter or p.dtype != torch.float32})
    if packed or odd:
        raise AssetError(f"transformers {transformers.__version__} did not fully dequantize {gguf.name} "
                         f"(modules {packed}, parameters {odd})")
    # save_pretrained refuses a model that still carries its GGUF quantizer; the weights
    # are plain float32 now, so drop it and the quantization config.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    return tok, model


def _fix_tokenizer_config(folder: Path) -> None:
    """Keep the chat template inside tokenizer_config.json, and drop load-time flags."""
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    jinja = folder / "chat_template.jinja"
    if not cfg.get("chat_template") and jinja.is_file():
        cfg["chat_template"] = jinja.read_text(encoding="utf-8")
    jinja.unlink(missing_ok=True)
    if not cfg.get("chat_template"):
        raise AssetError("the GGUF's tokenizer came without a chat template")
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg_file.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _save(model: Any, tok: Any, folder: Path, progress: bool) -> None:
    with _transformers_quiet(progress):
        model.save_pretrained(str(folder))
        tok.save_pretrained(str(folder), save_jinja_files=False)
    _fix_tokenizer_config(folder)
    for required in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        if not (folder / required).is_file():
            raise AssetError(f"saving the smollm2-hf folder did not write {required}")


def _check_reload(folder: Path, check: Path, ref_chat: list[int], ref_texts: list[list[int]],
                  ref_logits: Any) -> float:
    """Load ``folder`` offline in a fresh interpreter; it must match the reference.

    Returns the largest absolute logit difference (at most 1e-3).
    """
    import numpy as np

    check.mkdir()
    _atomic.write_json(check / "spec.json", {"messages": _HF_CHECK_MESSAGES, "texts": _HF_CHECK_TEXTS})
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", _HF_CHECK, str(folder), str(check)], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-20:])
        raise AssetError(f"the written smollm2-hf folder does not load with transformers:\n{tail}")
    result = json.loads((check / "result.json").read_text(encoding="utf-8"))
    logits = np.load(check / "logits.npy")
    if result["chat_ids"] != ref_chat or result["text_ids"] != ref_texts:
        raise AssetError("the saved smollm2-hf tokenizer tokenizes differently from the GGUF's")
    if result["dtypes"] != ["torch.float32"]:
        raise AssetError(f"the saved smollm2-hf folder loads as {result['dtypes']}, expected float32")
    max_diff = float(np.abs(logits - ref_logits).max()) if logits.shape == ref_logits.shape else float("inf")
    if not max_diff <= 1e-3:
        raise AssetError(f"the saved smollm2-hf folder gives different logits (max |diff| {max_diff})")
    return max_diff


def build_smollm2_hf(ctx: Ctx, targets: list[str]) -> dict[str, Staged]:
    import torch
    import transformers

    gguf = ctx.adir / ASSETS["smollm2-gguf"].relpath
    folder = ctx.work / "smollm2-hf"
    ctx.ui.say(f"smollm2-hf: dequantizing {gguf.name} with transformers {transformers.__version__}")
    tok, model = _load_dequantized(gguf, ctx.ui.progress)
    _save(model, tok, folder, ctx.ui.progress)

    # Reference from the in-memory model, then the same from the saved folder, offline.
    enc = tok.apply_chat_template(_HF_CHECK_MESSAGES, add_generation_prompt=True, return_dict=True,
                                  return_tensors="pt")
    with torch.no_grad():
        ref_logits = model(input_ids=enc["input_ids"]).logits[0].float().numpy()
    ref_chat = enc["input_ids"][0].tolist()
    ref_texts = [tok(t)["input_ids"] for t in _HF_CHECK_TEXTS]
    n_params = sum(p.numel() for p in model.parameters())
    del model  # free it before a second copy loads in the check
    ctx.ui.say("smollm2-hf: checking that the folder loads with transformers (offline)")
    max_diff = _check_reload(folder, ctx.work / "check", ref_chat, ref_texts, ref_logits)
    files = {f"smollm2-hf/{p.relative_to(folder).as_posix()}": p for p in sorted(folder.rglob("*")) if p.is_file()}
    return {"smollm2-hf": Staged(
        files=files,
        stats={"parameters": n_params, "dtype": "float32", "prompt_tokens_checked": len(ref_chat),
               "max_abs_logit_diff_after_reload": max_diff,
               "greedy_first_token": tok.decode([int(ref_logits[-1].argmax())])},
        extra={"derived_from": "smollm2-gguf", "source_member": SMOLLM2_MEMBER,
               "made_with": {"transformers": transformers.__version__, "torch": torch.__version__}},
    )}
