"""Helpers for the converter tests: tiny random models of every architecture, small
SentencePiece tokenizers, logits from transformers and from our llama.cpp.

Everything is built from real components (transformers model classes, the
sentencepiece trainer, llama-cpp-python on our libllama) and seeded, so each run
builds the same bytes.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from functools import lru_cache
from pathlib import Path

import numpy as np

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FF = 128

# A broad text set: scripts, digits, whitespace runs, emoji, code, special-token-like text.
TEXTS = [
    "Hello world! The capital of France is Paris.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\tnewlines\n\n\nand\r\nCRLF\n",
    "Numbers: 3 33 333 3333 33333 3.14159 1,000,000 2024-11-21 0x1F 1e-5",
    "Ünïcödé: café naïve façade Straße Ærøskøbing",
    "Русский текст: нещо на Български, Ελληνικά, עברית, العربية",
    "中文：我想在apple工作1314151天～ 日本語のテキスト、한국어 텍스트",
    "ກະລຸນາ ภาษาไทย कृपया हिन्दी তুমি কেমন আছ",
    "Emoji: 🚀 😶‍🌫️ 🦙🦙 ✅ 👨‍👩‍👧‍👦 🇫🇷",
    "def f(x):\n    return x ** 2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * c; }  // C++",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "''''''```````\"\"\"\"......!!!!!!?????? ------======= <<<>>> ~~~",
    "   \n \n\n \t \t\t \t\n  \n   \n    \n     \n",
    "mixed<|im_start|>user\nHi<|im_end|>\n<start_of_turn>model text<end_of_turn>",
    "a",
    "",
    "URL https://example.com/path?q=1&r=2#frag and email someone@example.org",
]


def default_tokenizer_files(dst: Path) -> None:
    from ggml_ext import assets
    src = assets.path("smollm2-hf")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)


def train_spm(dst: Path, style: str) -> Path:
    """Train a 2000-piece SentencePiece BPE model on the wiki text and save it with its
    Hugging Face tokenizer files in ``dst``. ``style`` "gemma" (no dummy prefix,
    <pad>/<eos>/<bos>/<unk> = 0..3, turn markers) or "llama" (dummy prefix, <unk>/<s>/</s>)."""
    import sentencepiece as spm
    from ggml_ext import assets
    dst.mkdir(parents=True, exist_ok=True)
    text = assets.path("wiki-train").read_text(encoding="utf-8")[:1_500_000]
    common = dict(vocab_size=2000, model_type="bpe", byte_fallback=True, split_digits=True,
                  normalization_rule_name="identity", remove_extra_whitespaces=False,
                  allow_whitespace_only_pieces=True, character_coverage=0.9995, num_threads=1, minloglevel=2,
                  input_sentence_size=0, shuffle_input_sentence=False)
    if style == "gemma":
        extra = dict(add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>",
                     eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
                     user_defined_symbols=["<start_of_turn>", "<end_of_turn>"])
    else:
        extra = dict(add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    prefix = dst / "spm"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()), model_prefix=str(prefix),
                                   **common, **extra)
    model = dst / "tokenizer.model"
    prefix.with_suffix(".model").rename(model)
    prefix.with_suffix(".vocab").unlink()
    from transformers import GemmaTokenizer, LlamaTokenizer
    cls = GemmaTokenizer if style == "gemma" else LlamaTokenizer
    tok = cls.from_pretrained(dst)
    if style == "llama":  # Phi-3 style chat tokens added after the SentencePiece pieces
        tok.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"]})
    tok.save_pretrained(dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg.pop("vocab_file", None)  # points at the training folder
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def _config(arch: str, vocab: int, special: dict, **over):
    from transformers import AutoConfig
    common = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=512,
                  rms_norm_eps=1e-5, **special)
    per_arch = {
        "llama": dict(model_type="llama", tie_word_embeddings=True),
        "mistral": dict(model_type="mistral", tie_word_embeddings=False, sliding_window=None, head_dim=24),
        "qwen2": dict(model_type="qwen2", tie_word_embeddings=False),
        "qwen3": dict(model_type="qwen3", tie_word_embeddings=True, head_dim=32),
        "gemma2": dict(model_type="gemma2", head_dim=32, query_pre_attn_scalar=32, sliding_window=6,
                       layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0),
        "gemma3": dict(model_type="gemma3_text", head_dim=32, query_pre_attn_scalar=32, sliding_window=6,
                       layer_types=["sliding_attention", "full_attention"],
                       rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}),
        "phi3": dict(model_type="phi3", tie_word_embeddings=False, sliding_window=None,
                     original_max_position_embeddings=512, vocab_size=2048),  # padded vocab, like Phi-3's
    }[arch]
    kw = {**common, **per_arch, **over}
    return AutoConfig.for_model(kw.pop("model_type"), **kw)


ARCH_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
                "phi3": "Phi3ForCausalLM"}
TOKENIZER_OF = {"llama": "smollm", "mistral": "llama-spm", "qwen2": "smollm", "qwen3": "smollm",
                "gemma2": "gemma-spm", "gemma3": "gemma-spm", "phi3": "llama-spm"}


def make_tiny(arch: str, dst: Path, tokenizer_dir: Path | None = None, seed: int = 0, dtype: str = "float32",
              **over) -> Path:
    """A tiny random ``arch`` model in ``dst`` (safetensors), with every parameter randomised
    (norms included, so norm conventions show) and the tokenizer files of ``tokenizer_dir``
    (default: the default model's)."""
    import torch
    from transformers import AutoModelForCausalLM
    dst.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is None:
        default_tokenizer_files(dst)
        vocab, special = 49152, dict(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    else:
        for f in tokenizer_dir.iterdir():
            if f.is_file():
                shutil.copy(f, dst / f.name)
        tj = json.loads((dst / "tokenizer.json").read_text())
        if "<bos>" in tj["model"]["vocab"]:  # Gemma style; transformers adds a <mask> beyond the pieces: left out
            vocab = len(tj["model"]["vocab"])
            special = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)
        else:
            vocab = max([*tj["model"]["vocab"].values(), *(a["id"] for a in tj["added_tokens"])]) + 1
            special = dict(bos_token_id=1, eos_token_id=2, pad_token_id=None)
    cfg = _config(arch, vocab, special, **over)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                base = 0.0 if arch.startswith("gemma") and name.endswith("norm.weight") else (
                    1.0 if name.endswith("norm.weight") else 0.0)
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    model.to(getattr(torch, dtype)).save_pretrained(dst)
    return dst


def hf_logits(folder: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].float().numpy()


def gguf_logits_many(path: Path, prompts: list[list[int]], n_ctx: int = 256, **kw) -> list[np.ndarray]:
    """Logits at every position of each prompt (token ids), from our llama.cpp through llama-cpp-python;
    f32 KV cache so that only the weights' type differs from transformers."""
    from ggml_ext.llama_cpp_glue import Llama
    llm = Llama(str(path), logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, type_k=0, type_v=0,
                verbose=False, **kw)
    try:
        out = []
        for ids in prompts:
            llm.reset()
            llm.eval(ids)
            out.append(np.array(llm.scores[: len(ids)], dtype=np.float32))
        return out
    finally:
        llm.close()


def gguf_logits(path: Path, ids: list[int], n_ctx: int = 256, **kw) -> np.ndarray:
    return gguf_logits_many(path, [ids], n_ctx, **kw)[0]


def hf_tokenize(folder: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    return tok.encode(text, add_special_tokens=False)


# --------------------------------------------------------------------------- shared, built once per test run

_WORK: Path | None = None


def work_dir() -> Path:
    """A temp folder for this test run's models and files (removed at exit)."""
    global _WORK
    if _WORK is None:
        import atexit
        import tempfile
        _WORK = Path(tempfile.mkdtemp(prefix="ggml-ext-convert-tests-"))
        atexit.register(shutil.rmtree, _WORK, True)
    return _WORK


_CACHE: dict = {}


def cached(key, build):
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


DEFAULT_HF: Path | None = None  # pytest's --default-hf (conftest.py): the folder, where the asset store is not


def default_hf() -> Path:
    if DEFAULT_HF is not None:
        return DEFAULT_HF
    from ggml_ext import assets
    return assets.path("smollm2-hf")


def default_kv_calibration() -> Path:
    """The default model's KV calibration (`ggml-ext calibrate kv`: 1 x 64 tokens of wiki-train, nuq2/3/4,
    1% outliers), made once and cached under ~/.cache/ggml-ext/tests/ (the KVQuant kernel and cache tests
    share it; "-v3": with the block, rotated and block-scaled key tables)."""
    import os
    from ggml_ext.kvquant import calibrate
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ggml-ext" / "tests"
    path = cache / "kvquant-kernels-smollm2-1x64-v3.kvq.gguf"
    if not path.exists():
        cal = calibrate(default_hf(), "wiki-train", n_samples=1, seq_len=64, bits=(2, 3, 4), progress=False)
        cache.mkdir(parents=True, exist_ok=True)
        cal.save(path, force=True)
    return path


def tool_refused(run) -> str:
    """The message of a llama tool run (`run()`: ggml_ext.tools.perplexity and the like, which raise RuntimeError
    with the tool's output and "exit N") that must fail: an error exit of the tool, not a signal (no abort, no
    crash)."""
    import pytest
    with pytest.raises(RuntimeError) as e:
        run()
    msg = str(e.value)
    code = int(msg.split("exit ", 1)[1].split(")", 1)[0])
    assert 0 < code < 128, msg
    return msg


def kvq_pack_head_block(idx, bits: int):
    """numpy twin of the kvquant head block of 64 indices (docs/formats/kvquant.md, "Inside a head block")."""
    import numpy as np
    out = np.zeros(8 * bits, np.uint8)
    for s, q in enumerate(idx):
        q = int(q)
        if bits == 4:
            out[s % 32] |= q << (4 * (s // 32))
        else:
            out[s % 16] |= (q & 3) << (2 * (s // 16))
            if bits == 3:
                out[16 + s % 8] |= ((q >> 2) & 1) << (s // 8)
    return out


def k_proj_scaled(model: Path, dst: Path, factor: float) -> Path:
    """A copy of `model` with k_proj's weights times `factor`: behind a K norm (Qwen3, Gemma-3) the model is the
    same, but the K a pre-RoPE KVQuant cache holds (before the norm) is `factor` times larger -- read back without
    the norm, attention would see keys `factor` times too long."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    shutil.copytree(model, dst)
    for f in dst.glob("*.safetensors"):
        t = load_file(f)
        save_file({k: v * np.asarray(factor, v.dtype) if "k_proj" in k else v for k, v in t.items()}, f,
                  metadata={"format": "pt"})
    return dst


def tiny_kv_setup(model: Path, dst: Path, bits=(4,)) -> tuple[Path, Path]:
    """(KV calibration, f32 GGUF) of a tiny model for the KVQuant cache tests: `ggml-ext calibrate kv` on 2 x 48
    tokens of a synthetic text (nuq `bits`, 1% outliers) and the model converted to f32, both under `dst`."""
    from ggml_ext.converters import convert
    from ggml_ext.kvquant import calibrate
    text = dst / "kv-text.txt"
    text.write_text(" ".join(f"word{i} and some more text {i % 7}" for i in range(3000)))
    cal, gguf = dst / "kv.gguf", dst / "m.gguf"
    calibrate(model, str(text), n_samples=2, seq_len=48, bits=tuple(bits), progress=False).save(cal, force=True)
    convert(model, gguf, "f32")
    return cal, gguf


def default_converted(out_type: str) -> Path:
    """The default model converted by us to ``out_type`` (once per run)."""
    def build() -> Path:
        from ggml_ext.converters import convert
        out = work_dir() / f"smollm2.{out_type}.gguf"
        convert(default_hf(), out, out_type)
        return out
    return cached(("default", out_type), build)


def spm_tokenizer(style: str) -> Path:
    return cached(("spm", style), lambda: train_spm(work_dir() / f"tok-{style}", style))


def tiny(arch: str, tokenizer: str | None = None, **over) -> Path:
    """The tiny random ``arch`` model (once per run for a given set of overrides); ``tokenizer``
    "smollm", "gemma-spm" or "llama-spm" (default: :data:`TOKENIZER_OF`)."""
    key = ("tiny", arch, tokenizer, json.dumps(over, sort_keys=True))

    def build() -> Path:
        tok = {"smollm": None, "gemma-spm": "gemma", "llama-spm": "llama"}[tokenizer or TOKENIZER_OF[arch]]
        n = sum(1 for k in _CACHE if k[:2] == ("tiny", arch))
        return make_tiny(arch, work_dir() / f"tiny-{arch}-{n}", spm_tokenizer(tok) if tok else None, **over)
    return cached(key, build)


def read_tensor_bytes(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (type name, ggml shape, bytes) of every tensor of a GGUF file (via our safe reader)."""
    from ggml_ext.gguf import read_gguf
    g = read_gguf(path)
    out = {}
    with open(path, "rb") as f:
        for t in g.tensors:
            f.seek(t.file_offset)
            out[t.name] = (t.type_name, t.shape, f.read(t.nbytes))
    return out


def default_sigint() -> None:
    """preexec_fn for a child that must take Ctrl-C: a job started in the background by a
    non-interactive shell (CI, nohup) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt; a real terminal's Ctrl-C reaches the converter with the default."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def code_digest(*modules: str) -> str:
    """What a cached conversion of the default model depends on: the given package modules' bytes (paths
    relative to the ggml_ext package), the built libggml-base (size and mtime) and the default model's
    files (names and sizes). A cache file named by it is remade when any of them changes."""
    import ggml_ext
    from ggml_ext import _locate
    root = Path(ggml_ext.__file__).resolve().parent
    h = hashlib.sha256()
    for rel in modules:
        h.update((root / rel).read_bytes())
    lib = Path(_locate.library("ggml-base"))
    h.update(f"{lib.stat().st_size}:{lib.stat().st_mtime_ns}".encode())
    for f in sorted(Path(default_hf()).glob("*")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def cached_default_conversion(stem: str, digest: str, build) -> Path:
    """A slow conversion of the default model kept across runs under the cache's tests/ folder as
    ``STEM-DIGEST.gguf`` (digest: :func:`code_digest` of what the conversion depends on): ``build(path)``
    writes it when it is missing, after the files of older digests are removed."""
    from ggml_ext import cache
    d = cache.cache_root() / "tests"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{stem}-{digest}.gguf"
    if not path.exists():
        for old in d.glob(f"{stem}-*.gguf"):
            old.unlink()
        build(path)
    return path


def cb2_code_digest() -> str:
    """What the default model's CB2 conversion depends on (its cache key)."""
    return code_digest("methods/act_importance.py", "methods/rtn.py", "converters/pipeline.py", "converters/policy.py",
                       "quants.py", "calibrate/stream.py", "calibrate/collect.py", "calibrate/data.py")


def cached_cb2_file() -> Path:
    """The default model converted with ``--type cb2`` (importance from 4 x 128 calibration tokens),
    cached by :func:`cb2_code_digest`: CB2 ffn_down matrices, IQ4_NL fallbacks elsewhere."""
    from ggml_ext.converters import convert

    def build(path):
        r = convert(default_hf(), path, "cb2", calib_samples=4, calib_seq_len=128, calib_progress=False,
                    warn=lambda w: None)
        assert any("fall back" in w and "blk.0.attn_q.weight" in w for w in r.warnings), r.warnings
    return cached_default_conversion("smollm2-cb2-4x128", cb2_code_digest(), build)


@lru_cache(maxsize=None)
def real_layer(model_dir: str, index: int, what: tuple[str, ...] = ("hessian",), n_samples: int = 8,
               seq_len: int = 128, text: str = "wiki-train") -> dict:
    """Decoder layer ``index`` of a real model, streamed over ``text`` (an asset name; the layers before it
    unquantized): full module name -> (weight float32, {collector: statistic}) for the collectors
    ``what`` (calibrate/collect.py). Cached per process: the methods' tests share one pass. Another
    ``text`` (wiki-test) gives held-out statistics of the same layer."""
    from ggml_ext.calibrate.collect import Collector
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.stream import LayerStream
    tok = tokenize(model_dir, text, n_samples=n_samples, seq_len=seq_len)
    col = Collector(what)
    for i, layer, prefix in LayerStream(model_dir).run(tok.ids, hooks=col.attach, progress=False):
        got = col.take(prefix)
        if i == index:
            return {name: (layer.get_submodule(name[len(prefix) + 1:]).weight.detach().numpy().copy(),
                           {k: r[k] for k in what}) for name, r in got.items()}
    raise ValueError(f"{model_dir} has no decoder layer {index}")


def dec_q4_0_base(default_gguf: Path) -> Path:
    """The default model requantized to Q4_0 by our llama-quantize: the base of the QDEC tests (tests/methods/
    test_dec.py, tests/runtime/test_dec_llama.py), made once under ~/.cache/ggml-ext/tests/dec (atomic rename)."""
    import subprocess

    from ggml_ext import tools
    from ggml_ext.cache import cache_root
    out = cache_root() / "tests" / "dec" / "smollm2-q4_0.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp.gguf")
        subprocess.run(tools.command("llama-quantize", "--allow-requantize", default_gguf, tmp, "Q4_0", "2"),
                       env=tools.tool_env(), check=True, capture_output=True)
        tmp.rename(out)
    return out
