"""One small table per supported architecture: names, shapes, metadata, transforms.

Adding an architecture means adding one :class:`Arch` to :data:`ARCHS`: which
Hugging Face tensor goes to which GGUF tensor (and with what shape), which
``config.json`` values become which GGUF keys, and the weight transforms
llama.cpp's graph for that architecture expects. The GGUF names and keys are the
pinned llama.cpp's (``src/llama-arch.cpp``, ``src/models/<arch>.cpp``).

Transforms, and why:

* **Q/K permutation** (``llama`` graph, Llama and Mistral): Hugging Face rotates
  the two halves of each head (``rotate_half``); llama.cpp's ``llama`` graph uses
  the interleaved (GPT-J) rotation, so the rows of ``q_proj``/``k_proj`` are
  reordered per head from ``[x0..x(d/2-1), y0..]`` to ``[x0, y0, x1, y1, ...]``.
  Qwen2/3, Gemma and Phi-3 run with NEOX rotation in llama.cpp: no permutation.
* **Gemma norms**: Gemma's RMSNorm multiplies by ``1 + weight``; llama.cpp
  multiplies by the weight, so 1 is added to every ``*norm.weight`` (the q/k norms
  of Gemma 3 included). The embedding scale ``sqrt(hidden_size)`` is applied by
  llama.cpp's Gemma graphs themselves, so the embedding is written as it is.
* **Tied embeddings**: a tied model has no ``output.weight``; llama.cpp then uses
  ``token_embd.weight`` for the output layer. Gemma 2 is always tied in llama.cpp.
* **RoPE scaling**: ``linear`` and ``yarn`` become ``rope.scaling.*`` keys;
  ``llama3`` becomes the ``rope_freqs.weight`` tensor of per-frequency divisors;
  Phi-3 ``longrope`` becomes ``rope_factors_long/short.weight`` and an attention factor.
* **Sliding windows** (Gemma 2/3): ``attention.sliding_window`` and the per-layer
  ``attention.sliding_window_pattern`` (from ``layer_types``), the local RoPE base
  as ``rope.freq_base_swa``.
* **Phi-3 fused tensors**: ``qkv_proj`` and ``gate_up_proj`` are kept fused
  (``attn_qkv``, and ``ffn_up`` of twice the FFN width), as llama.cpp's ``phi3``
  graph loads them.

Configurations llama.cpp would silently run differently from transformers (an
attention scale it does not read, a RoPE scaling it does not implement, sliding
windows on an architecture where llama.cpp ignores them) are refused with a
:class:`ConversionError`, or warned about where only long contexts are affected.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .errors import ConversionError

__all__ = ["Arch", "ARCHS", "HParams", "Plan", "find_arch", "supported_architectures", "permute_qk", "Meta"]

Meta = list[tuple[str, str, Any]]  # (key, GGUF value type, value)
_MISSING = object()
_U31 = 2**31 - 1
_MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS


def _int(v: Any, what: str, lo: int = 1, hi: int = _U31) -> int:
    """``v`` as an int in lo..hi (an integral float is accepted), else a ConversionError."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ConversionError(f"{what} must be an integer in {lo}..{hi}, not {v!r}")
    return v


def _float(v: Any, what: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise ConversionError(f"{what} must be a finite number, not {v!r}")
    return float(v)


def _rope_num(rp: dict, key: str, default: Any = _MISSING) -> float:
    """A number of the RoPE parameters (rope_scaling / rope_parameters)."""
    if rp.get(key) is None:
        if default is _MISSING:
            raise ConversionError(f"config.json: RoPE scaling {rp.get('rope_type')!r} has no {key}")
        return default
    return _float(rp[key], f"config.json: RoPE parameter {key}")


class HParams:
    """config.json with the lookups every table needs."""

    def __init__(self, config: dict[str, Any], warn: Callable[[str], None]):
        self.cfg = config
        self.warn = warn

    def get(self, *keys: str, default: Any = _MISSING) -> Any:
        for k in keys:
            if self.cfg.get(k) is not None:
                return self.cfg[k]
        if default is _MISSING:
            raise ConversionError(f"config.json has no {' / '.join(keys)}")
        return default

    def get_int(self, *keys: str, default: Any = _MISSING, lo: int = 1, hi: int = 0) -> Any:
        """An integer value in lo..hi (hi 0: what fits GGUF's u32 and llama.cpp's int32); the default as it is."""
        v = self.get(*keys, default=default)
        return v if v is default else _int(v, f"config.json: {keys[0]}", lo, hi or _U31)

    def get_float(self, *keys: str, default: Any = _MISSING) -> Any:
        """A finite number, as float; the default as it is."""
        v = self.get(*keys, default=default)
        return v if v is default else _float(v, f"config.json: {keys[0]}")

    @property
    def n_layer(self) -> int:
        return self.get_int("num_hidden_layers", hi=_MAX_LAYERS)

    @property
    def n_embd(self) -> int:
        return self.get_int("hidden_size")

    @property
    def n_head(self) -> int:
        return self.get_int("num_attention_heads")

    @property
    def n_head_kv(self) -> int:
        return self.get_int("num_key_value_heads", default=self.n_head)

    @property
    def head_dim(self) -> int:
        hd = self.get_int("head_dim", default=None)
        hd = hd if hd is not None else self.n_embd // self.n_head
        if hd < 2 or hd % 2:
            raise ConversionError(f"config.json: head dimension {hd} (head_dim, or hidden_size / "
                                  "num_attention_heads) must be even and at least 2 for RoPE")
        return hd

    @property
    def n_ff(self) -> int:
        return self.get_int("intermediate_size")

    @property
    def vocab_size(self) -> int:
        return self.get_int("vocab_size")

    def rope(self, kind: str = "full_attention") -> dict[str, Any]:
        """RoPE parameters of one attention kind, from ``rope_parameters`` (transformers 5)
        or the older ``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq``."""
        rp = self.cfg.get("rope_parameters")
        if isinstance(rp, dict) and ("full_attention" in rp or "sliding_attention" in rp):
            out = rp.get(kind) or rp.get("full_attention") or {}
        elif isinstance(rp, dict):
            out = rp
        else:
            out = self.cfg.get("rope_scaling") or {}
        if not isinstance(out, dict):
            raise ConversionError(f"config.json: the RoPE parameters are not a JSON object: {out!r}")
        out = dict(out)
        if not isinstance(rp, dict):
            theta = self.cfg.get("rope_theta")
            if kind == "sliding_attention" and self.cfg.get("rope_local_base_freq") is not None:
                out = {"rope_theta": self.cfg["rope_local_base_freq"]}  # scaling applies to global layers only
            elif theta is not None:
                out.setdefault("rope_theta", theta)
        if "rope_type" not in out and "type" in out:
            out["rope_type"] = out["type"]
        if not isinstance(out.get("rope_type") or "", str):
            raise ConversionError(f"config.json: RoPE type {out['rope_type']!r} is not a string")
        out.setdefault("rope_theta", 10000.0)
        return out


# --------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Arch:
    """How one Hugging Face architecture becomes one llama.cpp architecture."""

    hf_class: str
    gguf_arch: str
    # HF name -> GGUF name for tensors outside the layers, and for the part of a layer
    # tensor's name after "model.layers.{i}." (GGUF: after "blk.{i}.")
    global_map: dict[str, str]
    layer_map: dict[str, str]
    # HF name (global or layer suffix) -> expected PyTorch shape; tensors marked optional may be absent
    shapes: Callable[[HParams], dict[str, tuple[int, ...]]]
    optional: frozenset[str] = frozenset()
    metadata: Callable[[HParams], Meta] = lambda hp: []
    extra_tensors: Callable[[HParams], list[tuple[str, np.ndarray]]] = lambda hp: []
    permute_qk: bool = False
    norm_offset: float = 0.0
    tie_default: bool = False  # transformers' tie_word_embeddings default for this class
    always_tied: bool = False  # llama.cpp has no output.weight for it
    rope_types: frozenset[str] = frozenset({"default", "linear", "yarn"})
    ignore: tuple[str, ...] = ()  # regexes of HF tensors that carry nothing (e.g. cached inv_freq)
    notes: str = ""

    def gguf_name(self, hf_name: str) -> str | None:
        if hf_name in self.global_map:
            return self.global_map[hf_name]
        m = _LAYER_RE.match(hf_name)
        if m and m.group(2) in self.layer_map:
            return f"blk.{int(m.group(1))}.{self.layer_map[m.group(2)]}"
        return None


_LAYER_RE = re.compile(r"^model\.layers\.([0-9]{1,9})\.(.+)$")
_IGNORE_COMMON = (r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$", r"^model\.rotary_emb\.inv_freq$")

_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

_ATTN = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
}
_QKV_BIAS = {
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
_MLP = {
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_MLP_BIAS = {"mlp.gate_proj.bias": "ffn_gate.bias", "mlp.up_proj.bias": "ffn_up.bias", "mlp.down_proj.bias": "ffn_down.bias"}
_QK_NORM = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
_PRE_POST = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight"}
_GEMMA_NORMS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def _base_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    d, q, kv, ff, v = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.n_ff, hp.vocab_size
    return {
        "model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d),
        "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
        "pre_feedforward_layernorm.weight": (d,), "post_feedforward_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d), "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, q), "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.bias": (kv,), "self_attn.o_proj.bias": (d,),
        "self_attn.q_norm.weight": (hp.head_dim,), "self_attn.k_norm.weight": (hp.head_dim,),
        "mlp.gate_proj.weight": (ff, d), "mlp.up_proj.weight": (ff, d), "mlp.down_proj.weight": (d, ff),
        "mlp.gate_proj.bias": (ff,), "mlp.up_proj.bias": (ff,), "mlp.down_proj.bias": (d,),
        "self_attn.qkv_proj.weight": (q + 2 * kv, d), "mlp.gate_up_proj.weight": (2 * ff, d),
    }


def _common_meta(arch: str, hp: HParams, rope_dims: int | None = None) -> Meta:
    p = f"{arch}."
    meta: Meta = [
        (p + "vocab_size", "u32", hp.vocab_size),
        (p + "context_length", "u32", hp.get_int("max_position_embeddings")),
        (p + "embedding_length", "u32", hp.n_embd),
        (p + "block_count", "u32", hp.n_layer),
        (p + "feed_forward_length", "u32", hp.n_ff),
        (p + "attention.head_count", "u32", hp.n_head),
        (p + "attention.head_count_kv", "u32", hp.n_head_kv),
        (p + "attention.layer_norm_rms_epsilon", "f32", hp.get_float("rms_norm_eps")),
        (p + "attention.key_length", "u32", hp.head_dim),
        (p + "attention.value_length", "u32", hp.head_dim),
        (p + "rope.dimension_count", "u32", rope_dims if rope_dims is not None else hp.head_dim),
        (p + "rope.freq_base", "f32", _rope_num(hp.rope(), "rope_theta")),
    ]
    return meta + _rope_scaling_meta(arch, hp)


def _rope_scaling_meta(arch: str, hp: HParams) -> Meta:
    rp = hp.rope()
    kind = (rp.get("rope_type") or "default").lower()
    p = f"{arch}.rope.scaling."
    if kind == "linear":
        return [(p + "type", "str", "linear"), (p + "factor", "f32", _rope_num(rp, "factor"))]
    if kind == "yarn":
        orig = rp.get("original_max_position_embeddings", hp.get("original_max_position_embeddings", default=None))
        if orig is None:
            raise ConversionError("YaRN RoPE scaling without original_max_position_embeddings")
        meta: Meta = [(p + "type", "str", "yarn"), (p + "factor", "f32", _rope_num(rp, "factor")),
                      (p + "original_context_length", "u32", _int(orig, "original_max_position_embeddings"))]
        for hf_key, key in (("extrapolation_factor", "yarn_ext_factor"), ("attention_factor", "yarn_attn_factor"),
                            ("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if rp.get(hf_key) is not None:
                meta.append((p + key, "f32", _rope_num(rp, hf_key)))
        return meta
    return []


def _check_attention_scale(hp: HParams, big_layers: int, name: str) -> None:
    # llama.cpp's gemma graphs scale queries by 1/sqrt(head_dim), or 1/sqrt(n_embd/n_head) for the
    # largest model (identified by its layer count); transformers uses query_pre_attn_scalar**-0.5.
    scalar = hp.get("query_pre_attn_scalar", default=None)
    used = hp.n_embd // hp.n_head if hp.n_layer == big_layers else hp.head_dim
    if scalar is not None and _float(scalar, "config.json: query_pre_attn_scalar") != float(used):
        raise ConversionError(f"{name}: query_pre_attn_scalar={scalar}, but llama.cpp's {name} scales queries by "
                              f"1/sqrt({used}) for a {hp.n_layer}-layer model; the converted file would not "
                              "give transformers' answers")


def _check_gelu(hp: HParams, name: str) -> None:
    act = hp.get("hidden_activation", "hidden_act", default="gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        hp.warn(f"{name}: hidden activation {act!r}; llama.cpp uses the tanh approximation of GELU")


def _layer_types(hp: HParams) -> list[str] | None:
    lt = hp.get("layer_types", default=None)
    if lt is None:
        return None
    if not isinstance(lt, list):
        raise ConversionError("config.json: layer_types is not a list")
    if len(lt) != hp.n_layer:
        raise ConversionError(f"config.json: layer_types has {len(lt)} entries for {hp.n_layer} layers")
    return list(lt)


# ----- llama / mistral


def _llama3_rope_freqs(hp: HParams) -> list[tuple[str, np.ndarray]]:
    rp = hp.rope()
    if (rp.get("rope_type") or "").lower() != "llama3":
        return []
    dim = hp.head_dim
    base = _rope_num(rp, "rope_theta")
    factor = _rope_num(rp, "factor", 8.0)
    low, high = _rope_num(rp, "low_freq_factor", 1.0), _rope_num(rp, "high_freq_factor", 4.0)
    old_ctx = _rope_num(rp, "original_max_position_embeddings", 8192.0)
    if not (base > 0 and factor > 0 and old_ctx > 0 and 0 < low < high):
        raise ConversionError(f"config.json: llama3 RoPE scaling needs rope_theta, factor and "
                              f"original_max_position_embeddings > 0 and 0 < low_freq_factor < high_freq_factor "
                              f"(got {base}, {factor}, {old_ctx}, {low}, {high})")
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    divisors = []
    for i in range(0, dim, 2):
        freq = 1.0 / base ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            divisors.append(1.0)
        elif wavelen > low_wavelen:
            divisors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return [("rope_freqs.weight", np.asarray(divisors, dtype=np.float32))]


def _llama_meta(hp: HParams) -> Meta:
    sw = hp.get_int("sliding_window", default=None, lo=0)
    if sw is not None and sw < hp.get_int("max_position_embeddings"):
        hp.warn(f"sliding_window={sw} is ignored by llama.cpp's llama graph: results differ from transformers "
                f"for contexts longer than {sw} tokens")
    return _common_meta("llama", hp)


def _llama(hf_class: str) -> Arch:
    return Arch(
        hf_class, "llama", _GLOBAL,
        {**_PRE_POST, **_ATTN, **_QKV_BIAS, "self_attn.o_proj.bias": "attn_output.bias", **_MLP, **_MLP_BIAS},
        _base_shapes,
        optional=frozenset({*_QKV_BIAS, "self_attn.o_proj.bias", *_MLP_BIAS, "lm_head.weight"}),
        metadata=_llama_meta, extra_tensors=_llama3_rope_freqs, permute_qk=True,
        rope_types=frozenset({"default", "linear", "yarn", "llama3"}), ignore=_IGNORE_COMMON,
        notes="Q/K rows permuted for llama.cpp's interleaved RoPE; llama3 RoPE scaling as rope_freqs.weight",
    )


# ----- qwen2 / qwen3


def _qwen_meta(arch: str) -> Callable[[HParams], Meta]:
    def meta(hp: HParams) -> Meta:
        if hp.get("use_sliding_window", default=False):
            raise ConversionError(f"use_sliding_window=true is not supported: llama.cpp's {arch} has no sliding "
                                  "window attention")
        return _common_meta(arch, hp)
    return meta


def _qwen2() -> Arch:
    return Arch(
        "Qwen2ForCausalLM", "qwen2", _GLOBAL, {**_PRE_POST, **_ATTN, **_QKV_BIAS, **_MLP}, _base_shapes,
        optional=frozenset({*_QKV_BIAS, "lm_head.weight"}), metadata=_qwen_meta("qwen2"), ignore=_IGNORE_COMMON,
        notes="NEOX RoPE (no permutation); q/k/v biases",
    )


def _qwen3() -> Arch:
    return Arch(
        "Qwen3ForCausalLM", "qwen3", _GLOBAL, {**_PRE_POST, **_ATTN, **_QKV_BIAS, **_QK_NORM, **_MLP}, _base_shapes,
        optional=frozenset({*_QKV_BIAS, "lm_head.weight"}), metadata=_qwen_meta("qwen3"), ignore=_IGNORE_COMMON,
        notes="NEOX RoPE; per-head RMS norms on q and k (attn_q_norm, attn_k_norm)",
    )


# ----- gemma 2 / 3


def _swa_meta(arch: str, hp: HParams) -> Meta:
    types = _layer_types(hp)
    meta: Meta = []
    sw = hp.get_int("sliding_window", default=None, lo=0)
    if types is not None:
        pattern = [t == "sliding_attention" for t in types]
        if any(pattern):
            if sw is None:
                raise ConversionError("layer_types has sliding layers but config.json has no sliding_window")
            meta.append((f"{arch}.attention.sliding_window", "u32", sw))
        meta.append((f"{arch}.attention.sliding_window_pattern", "array[bool]", pattern))
    elif sw is not None:
        meta.append((f"{arch}.attention.sliding_window", "u32", sw))
    return meta


def _gemma2_meta(hp: HParams) -> Meta:
    _check_attention_scale(hp, 46, "gemma2")
    _check_gelu(hp, "gemma2")
    attn_cap = hp.get("attn_logit_softcapping", default=None)
    if attn_cap is None:
        raise ConversionError("gemma2: attn_logit_softcapping is off, but llama.cpp's gemma2 always soft-caps "
                              "attention logits")
    types = _layer_types(hp)
    if types is not None and "sliding_attention" in types and hp.get("sliding_window", default=None) is None:
        raise ConversionError("gemma2: sliding layers without sliding_window")
    meta = _common_meta("gemma2", hp)
    meta.append(("gemma2.attn_logit_softcapping", "f32", _float(attn_cap, "config.json: attn_logit_softcapping")))
    final_cap = hp.get("final_logit_softcapping", default=None)
    if final_cap is not None:
        meta.append(("gemma2.final_logit_softcapping", "f32",
                     _float(final_cap, "config.json: final_logit_softcapping")))
    return meta + _swa_meta("gemma2", hp)


def _gemma3_meta(hp: HParams) -> Meta:
    _check_attention_scale(hp, 62, "gemma3")
    _check_gelu(hp, "gemma3")
    if hp.get("attn_logit_softcapping", default=None) is not None:
        raise ConversionError("gemma3: attn_logit_softcapping is set, but llama.cpp's gemma3 does not soft-cap "
                              "attention logits")
    local = hp.rope("sliding_attention")
    if (local.get("rope_type") or "default").lower() != "default":
        raise ConversionError("gemma3: RoPE scaling on sliding-window layers is not supported by llama.cpp")
    meta = _common_meta("gemma3", hp)
    meta.append(("gemma3.rope.freq_base_swa", "f32", _rope_num(local, "rope_theta")))
    final_cap = hp.get("final_logit_softcapping", default=None)
    if final_cap is not None:
        meta.append(("gemma3.final_logit_softcapping", "f32",
                     _float(final_cap, "config.json: final_logit_softcapping")))
    return meta + _swa_meta("gemma3", hp)


def _gemma2() -> Arch:
    return Arch(
        "Gemma2ForCausalLM", "gemma2", {k: v for k, v in _GLOBAL.items() if k != "lm_head.weight"},
        {**_GEMMA_NORMS, **_ATTN, **_QKV_BIAS, **_MLP}, _base_shapes, optional=frozenset(_QKV_BIAS),
        metadata=_gemma2_meta, norm_offset=1.0, tie_default=True, always_tied=True, rope_types=frozenset({"default"}),
        ignore=_IGNORE_COMMON,
        notes="norms +1; embedding scale applied by llama.cpp; attention and final logit soft-capping; "
              "alternating sliding-window layers",
    )


def _gemma3() -> Arch:
    return Arch(
        "Gemma3ForCausalLM", "gemma3", _GLOBAL, {**_GEMMA_NORMS, **_ATTN, **_QKV_BIAS, **_QK_NORM, **_MLP},
        _base_shapes, optional=frozenset({*_QKV_BIAS, "lm_head.weight"}), metadata=_gemma3_meta, norm_offset=1.0,
        tie_default=True, rope_types=frozenset({"default", "linear"}), ignore=_IGNORE_COMMON,
        notes="norms (q/k norms included) +1; local RoPE base for sliding layers; per-layer sliding pattern",
    )


# ----- phi3


def _phi3_rope_dims(hp: HParams) -> int:
    factor = hp.rope().get("partial_rotary_factor", hp.get("partial_rotary_factor", default=1.0))
    factor = _float(factor, "config.json: partial_rotary_factor")
    if not 0 < factor <= 1:
        raise ConversionError(f"config.json: partial_rotary_factor {factor} is not in (0, 1]")
    return int(factor * hp.n_embd) // hp.n_head


def _phi3_meta(hp: HParams) -> Meta:
    if hp.head_dim != hp.n_embd // hp.n_head:
        raise ConversionError("phi3: head_dim must be hidden_size / num_attention_heads in llama.cpp's phi3")
    meta = _common_meta("phi3", hp, rope_dims=_phi3_rope_dims(hp))
    rp = hp.rope()
    orig = rp.get("original_max_position_embeddings", hp.get("original_max_position_embeddings", default=None))
    if orig is not None:
        meta.append(("phi3.rope.scaling.original_context_length", "u32",
                     _int(orig, "original_max_position_embeddings")))
    kind = (rp.get("rope_type") or "default").lower()
    if kind in ("longrope", "su"):
        if orig is None:
            raise ConversionError("phi3 longrope without original_max_position_embeddings")
        ctx, orig = hp.get_int("max_position_embeddings"), _int(orig, "original_max_position_embeddings", lo=2)
        scale = ctx / orig
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        if rp.get("attention_factor") is not None:
            attn_factor = _rope_num(rp, "attention_factor")
        meta.append(("phi3.rope.scaling.attn_factor", "f32", float(attn_factor)))
    sw = hp.get_int("sliding_window", default=None, lo=0)
    if sw is not None:
        meta.append(("phi3.attention.sliding_window", "u32", sw))
        if sw < hp.get_int("max_position_embeddings"):
            hp.warn(f"phi3: sliding_window={sw} is ignored by llama.cpp (its phi3 graph disables it): results "
                    f"differ from transformers for contexts longer than {sw} tokens")
    return meta


def _phi3_longrope(hp: HParams) -> list[tuple[str, np.ndarray]]:
    rp = hp.rope()
    if (rp.get("rope_type") or "default").lower() not in ("longrope", "su"):
        return []
    long_f, short_f = rp.get("long_factor"), rp.get("short_factor")
    half = _phi3_rope_dims(hp) // 2
    if not (isinstance(long_f, list) and isinstance(short_f, list) and len(long_f) == len(short_f) == half):
        raise ConversionError(f"phi3 longrope needs long_factor and short_factor of {half} values each")
    long_f = [_float(x, "config.json: long_factor") for x in long_f]
    short_f = [_float(x, "config.json: short_factor") for x in short_f]
    return [("rope_factors_long.weight", np.asarray(long_f, dtype=np.float32)),
            ("rope_factors_short.weight", np.asarray(short_f, dtype=np.float32))]


def _phi3() -> Arch:
    return Arch(
        "Phi3ForCausalLM", "phi3", _GLOBAL,
        {**_PRE_POST, "self_attn.qkv_proj.weight": "attn_qkv.weight", "self_attn.o_proj.weight": "attn_output.weight",
         "mlp.gate_up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"},
        _base_shapes, optional=frozenset({"lm_head.weight"}), metadata=_phi3_meta, extra_tensors=_phi3_longrope,
        rope_types=frozenset({"default", "longrope", "su"}), ignore=_IGNORE_COMMON,
        notes="fused qkv_proj -> attn_qkv and gate_up_proj -> ffn_up (2 x FFN width), as llama.cpp's phi3 loads "
              "them; partial rotary factor; longrope factors",
    )


ARCHS: dict[str, Arch] = {a.hf_class: a for a in (
    _llama("LlamaForCausalLM"), _llama("MistralForCausalLM"), _qwen2(), _qwen3(), _gemma2(), _gemma3(), _phi3(),
)}


def supported_architectures() -> list[str]:
    return list(ARCHS)


def find_arch(config: dict[str, Any]) -> Arch:
    names = config.get("architectures")
    if not isinstance(names, list) or not names:
        raise ConversionError("config.json has no 'architectures' list; supported: "
                              + ", ".join(supported_architectures()))
    for n in names:
        if isinstance(n, str) and n in ARCHS:
            return ARCHS[n]
    raise ConversionError(f"unsupported architecture {', '.join(map(str, names))}; supported: "
                          + ", ".join(supported_architectures()))


@dataclass
class Plan:
    """What the converter writes for one source tensor (or a computed one)."""

    gguf_name: str
    hf_name: str | None  # None for computed tensors
    shape: tuple[int, ...]  # PyTorch order
    data: np.ndarray | None = None  # computed tensors only
    type_name: str = "F32"


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of q_proj/k_proj (or their biases) from HF's half-split to llama.cpp's interleaved RoPE order."""
    rows = w.shape[0]
    hd = rows // n_head
    return (w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
