"""GGUF models dequantized to Hugging Face folders: ``smollm2-hf`` (the default model), ``gemma3-hf`` and
``qwen2.5-coder-1.5b-hf``.

transformers reads the GGUF and saves a float32 folder; the folder is then loaded
again in a fresh offline interpreter and must give the same tokens and logits as the
model it was saved from.  Their bytes depend on the transformers version, so they have
no pinned sha256.  torch, transformers and numpy are imported only when one is built.

Each folder is described by an :class:`HfFolder` in :data:`HF_FOLDERS`: the GGUF asset
it is made from, and whether its tokenizer must carry a chat template (SmolLM2-Instruct's
does, and the check prompts through it; Gemma-3-270M base has none, and the check
prompts with plain text).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _atomic
from .download import Ctx
from .pins import ASSETS, GEMMA_NAME, OUTPUT_SHA256, QWEN_NAME, SMOLLM2_MEMBER
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
if spec["messages"] is not None:
    assert tok.chat_template, "the saved tokenizer has no chat template"
    enc = tok.apply_chat_template(spec["messages"], add_generation_prompt=True, return_dict=True,
                                  return_tensors="pt")
else:
    enc = tok(spec["prompt"], return_tensors="pt")
with torch.no_grad():
    logits = model(input_ids=enc["input_ids"]).logits[0].float().numpy()
np.save(work + "/logits.npy", logits)
json.dump({
    "prompt_ids": enc["input_ids"][0].tolist(),
    "text_ids": [tok(t)["input_ids"] for t in spec["texts"]],
    "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    "model_class": type(model).__name__,
}, open(work + "/result.json", "w", encoding="utf-8"))
"""

_HF_CHECK_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
_HF_CHECK_PROMPT = "The capital of France is"  # for a folder without a chat template
_HF_CHECK_TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  Numbers 12345, naïve café, Zürich, 東京, emoji 🙂\n\n\ttabs and\r\nnewlines  ",
]


@dataclass(frozen=True)
class HfFolder:
    """One Hugging Face folder asset: which GGUF asset it is dequantized from, and how it is checked."""

    name: str  # the asset (and its folder under assets_dir())
    source: str  # the GGUF asset it is made from (in its Asset.requires)
    chat_template: bool  # the tokenizer must carry a chat template; the check prompts through it
    extra: dict[str, Any] = field(default_factory=dict)  # more of the marker, after "derived_from"


HF_FOLDERS: dict[str, HfFolder] = {
    f.name: f
    for f in (
        HfFolder("smollm2-hf", "smollm2-gguf", chat_template=True, extra={"source_member": SMOLLM2_MEMBER}),
        # Gemma-3-270M base: its GGUF has no tokenizer.chat_template.
        HfFolder("gemma3-hf", "gemma3-270m-gguf", chat_template=False,
                 extra={"source_file": GEMMA_NAME, "source_sha256": OUTPUT_SHA256["gemma3-270m-gguf"]}),
        HfFolder("qwen2.5-coder-1.5b-hf", "qwen2.5-coder-1.5b-gguf", chat_template=True,
                 extra={"source_file": QWEN_NAME, "source_sha256": OUTPUT_SHA256["qwen2.5-coder-1.5b-gguf"]}),
    )
}


def check_requirements(todo: list[str]) -> None:
    """Fail early, before any download, when a Hugging Face folder is due and cannot be made here."""
    due = [name for name in HF_FOLDERS if name in todo]
    if not due:
        return
    needed = ("torch", "transformers", "accelerate", "safetensors", "gguf", "numpy")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        which = f"the {due[0]} asset is" if len(due) == 1 else f"the {' and '.join(due)} assets are"
        raise AssetError(
            f"{which} made with transformers, which needs {', '.join(needed)}; "
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


def _fix_tokenizer_config(spec: HfFolder, folder: Path) -> None:
    """Keep the chat template (if any) inside tokenizer_config.json, and drop load-time flags."""
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    jinja = folder / "chat_template.jinja"
    if not cfg.get("chat_template") and jinja.is_file():
        cfg["chat_template"] = jinja.read_text(encoding="utf-8")
    jinja.unlink(missing_ok=True)
    if spec.chat_template and not cfg.get("chat_template"):
        raise AssetError(f"the {spec.source} GGUF's tokenizer came without a chat template, "
                         f"which the {spec.name} asset needs")
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg_file.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _save(spec: HfFolder, model: Any, tok: Any, folder: Path, progress: bool) -> None:
    with _transformers_quiet(progress):
        model.save_pretrained(str(folder))
        tok.save_pretrained(str(folder), save_jinja_files=False)
    _fix_tokenizer_config(spec, folder)
    for required in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        if not (folder / required).is_file():
            raise AssetError(f"saving the {spec.name} folder did not write {required}")


def _encode_prompt(spec: HfFolder, tok: Any) -> Any:
    """The check's prompt: the chat message through the chat template, or plain text (with BOS)."""
    if spec.chat_template:
        return tok.apply_chat_template(_HF_CHECK_MESSAGES, add_generation_prompt=True, return_dict=True,
                                       return_tensors="pt")
    return tok(_HF_CHECK_PROMPT, return_tensors="pt")


def _check_reload(spec: HfFolder, folder: Path, check: Path, ref_prompt: list[int], ref_texts: list[list[int]],
                  ref_logits: Any) -> float:
    """Load ``folder`` offline in a fresh interpreter; it must match the reference.

    Returns the largest absolute logit difference (at most 1e-3).
    """
    import numpy as np

    check.mkdir()
    _atomic.write_json(check / "spec.json", {"messages": _HF_CHECK_MESSAGES if spec.chat_template else None,
                                              "prompt": _HF_CHECK_PROMPT, "texts": _HF_CHECK_TEXTS})
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", _HF_CHECK, str(folder), str(check)], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-20:])
        raise AssetError(f"the written {spec.name} folder does not load with transformers:\n{tail}")
    result = json.loads((check / "result.json").read_text(encoding="utf-8"))
    logits = np.load(check / "logits.npy")
    if result["prompt_ids"] != ref_prompt or result["text_ids"] != ref_texts:
        raise AssetError(f"the saved {spec.name} tokenizer tokenizes differently from the {spec.source} GGUF's")
    if result["dtypes"] != ["torch.float32"]:
        raise AssetError(f"the saved {spec.name} folder loads as {result['dtypes']}, expected float32")
    max_diff = float(np.abs(logits - ref_logits).max()) if logits.shape == ref_logits.shape else float("inf")
    if not max_diff <= 1e-3:
        raise AssetError(f"the saved {spec.name} folder gives different logits (max |diff| {max_diff})")
    return max_diff


def build_hf_folder(ctx: Ctx, targets: list[str]) -> dict[str, Staged]:
    """Make each asset of ``targets`` (names in :data:`HF_FOLDERS`) from its GGUF asset."""
    return {name: _build_one(ctx, HF_FOLDERS[name]) for name in targets}


def _build_one(ctx: Ctx, spec: HfFolder) -> Staged:
    import torch
    import transformers

    gguf = ctx.adir / ASSETS[spec.source].relpath
    folder = ctx.work / spec.name
    ctx.ui.say(f"{spec.name}: dequantizing {gguf.name} with transformers {transformers.__version__}")
    tok, model = _load_dequantized(gguf, ctx.ui.progress)
    _save(spec, model, tok, folder, ctx.ui.progress)

    # Reference from the in-memory model, then the same from the saved folder, offline.
    enc = _encode_prompt(spec, tok)
    with torch.no_grad():
        ref_logits = model(input_ids=enc["input_ids"]).logits[0].float().numpy()
    ref_prompt = enc["input_ids"][0].tolist()
    ref_texts = [tok(t)["input_ids"] for t in _HF_CHECK_TEXTS]
    n_params = sum(p.numel() for p in model.parameters())
    del model  # free it before a second copy loads in the check
    ctx.ui.say(f"{spec.name}: checking that the folder loads with transformers (offline)")
    max_diff = _check_reload(spec, folder, ctx.work / f"check-{spec.name}", ref_prompt, ref_texts, ref_logits)
    rel = ASSETS[spec.name].relpath
    files = {f"{rel}/{p.relative_to(folder).as_posix()}": p for p in sorted(folder.rglob("*")) if p.is_file()}
    return Staged(
        files=files,
        stats={"parameters": n_params, "dtype": "float32", "prompt_tokens_checked": len(ref_prompt),
               "max_abs_logit_diff_after_reload": max_diff,
               "greedy_first_token": tok.decode([int(ref_logits[-1].argmax())])},
        extra={"derived_from": spec.source, **spec.extra,
               "made_with": {"transformers": transformers.__version__, "torch": torch.__version__}},
    )
