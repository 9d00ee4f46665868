"""KVQuant's C kernels (ggml_ext/src/formats/kvquant, docs/formats/kvquant.md) through ctypes.

One :class:`KVCacheLayer` is one layer's quantizer with a calibration's tables: it turns keys (before
RoPE) and values into the fixed-size rows a cache holds, and runs the attention kernels on such rows:

    layer = KVCacheLayer.from_calibration(cal, 3, bits=4, outliers=True, rope=rope_of(config))
    K = layer.quantize_k(keys)                 # (tokens, D) float32 -> (tokens, k_row_size) uint8
    s = layer.k_scores(0, q, K, positions)     # q (n_q, head_dim): q . RoPE(pos, k) per token
    o = layer.v_accumulate(0, weights, V)      # weights (n_q, tokens) -> (n_q, head_dim)

Channel order is the model's: a Hugging Face ``k_proj`` output rotates as NEOX (``rotate_half``); a
llama.cpp K row of a llama-arch GGUF is the converter's permutation of it and rotates as ``norm``
(:func:`rope_of` says which for a HF config). :func:`force` pins an implementation ("generic": the scalar
reference) for tests and benchmarks.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["KVCacheLayer", "KVKernelError", "Rope", "rope_of", "force", "default_slots"]

ROPE_MODES = {"norm": 0, "neox": 2}


class KVKernelError(ValueError):
    """A layer the kernels cannot take, or input they refuse (names the layer and the tensor)."""


@dataclass(frozen=True)
class Rope:
    """llama.cpp's RoPE parameters of one layer (no YaRN)."""
    mode: str = "neox"
    n_dims: int = 0            # rotated channels per head (0: the whole head)
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    freq_factors: tuple[float, ...] | None = None


def rope_of(config, layer: int = 0) -> Rope:
    """The RoPE of a transformers config, for keys in the HF channel order (``rotate_half``: NEOX).
    Gemma-3's local (sliding) layers use ``rope_local_base_freq``; linear scaling becomes freq_scale;
    other scalings (llama3, yarn) are refused."""
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base = float(getattr(config, "rope_theta", 10000.0))
    types = getattr(config, "layer_types", None)
    if types is not None and types[layer] == "sliding_attention" and hasattr(config, "rope_local_base_freq"):
        base, scaling = float(config.rope_local_base_freq), None
    else:
        scaling = getattr(config, "rope_scaling", None)
    scale = 1.0
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "linear":
            scale = 1.0 / float(scaling["factor"])
        elif kind not in (None, "default"):
            raise KVKernelError(f"RoPE scaling {kind!r} is not supported by the KV kernels yet")
    n_dims = int(hd * float(getattr(config, "partial_rotary_factor", 1.0)))
    return Rope("neox", n_dims, base, scale)


def default_slots(n_channels: int, outlier_fraction: float) -> tuple[int, int, int]:
    """(key slots, value slots, value outliers per side) per token for a fraction of outliers: values
    keep exactly k = round(D f / 2) (at least 1) on each side, as the simulation's online thresholds; keys,
    whose thresholds are per channel, have f D outliers per token on average: 3 f D slots (at least 2)
    leave few to clamp."""
    if outlier_fraction <= 0:
        return 0, 0, 0
    vk = max(1, int(round(n_channels * outlier_fraction / 2)))
    return max(2, math.ceil(3 * outlier_fraction * n_channels)), 2 * vk, vk


class _Config(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_int), ("n_kv_heads", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("k_slots", ctypes.c_int), ("v_slots", ctypes.c_int), ("v_outliers_per_side", ctypes.c_int),
                ("rope_mode", ctypes.c_int), ("rope_n_dims", ctypes.c_int), ("rope_freq_base", ctypes.c_float),
                ("rope_freq_scale", ctypes.c_float), ("rope_freq_factors", ctypes.c_void_p),
                ("k_lo", ctypes.c_void_p), ("k_hi", ctypes.c_void_p), ("k_levels", ctypes.c_void_p),
                ("k_values", ctypes.c_void_p), ("v_levels", ctypes.c_void_p), ("v_values", ctypes.c_void_p)]


@lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    from .. import _locate, quants
    quants.library()  # libggml-base first (the quantizers and the scalar reference live there)
    lib = ctypes.CDLL(str(_locate.library("ggml-cpu")), mode=ctypes.RTLD_GLOBAL)
    P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sig = {
        "ggml_ext_kvquant_layer_new": ([P, ctypes.c_char_p, S], P),
        "ggml_ext_kvquant_layer_free": ([P], None),
        "ggml_ext_kvquant_k_row_size": ([P], S),
        "ggml_ext_kvquant_v_row_size": ([P], S),
        "ggml_ext_kvquant_quantize_k": ([P, P, P], I),
        "ggml_ext_kvquant_quantize_v": ([P, P, P], I),
        "ggml_ext_kvquant_dequantize_k": ([P, P, P], None),
        "ggml_ext_kvquant_dequantize_v": ([P, P, P], None),
        "ggml_ext_kvquant_k_scores": ([P, I, P, I, P, S, P, I, P], None),
        "ggml_ext_kvquant_v_accumulate": ([P, I, P, I, P, S, I, P], None),
        "ggml_ext_kvquant_kernel": ([P], ctypes.c_char_p),
        "ggml_ext_kvquant_force": ([ctypes.c_char_p], I),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


def force(name: str | None) -> None:
    """Run implementation ``name`` ("generic", "avx2", "neon") from now on; None: choose by CPU again."""
    if _lib().ggml_ext_kvquant_force(name.encode() if name else None) != 0:
        raise KVKernelError(f"this build has no KV kernel implementation {name!r}")


def _f32(a, n: int | None = None, what: str = "array") -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if n is not None and a.size != n:
        raise KVKernelError(f"{what}: {a.size} values, expected {n}")
    return a


class KVCacheLayer:
    """One layer's KV cache quantizer and kernels (the C object; freed with the Python one)."""

    def __init__(self, *, bits: int, n_kv_heads: int, head_dim: int, k_lo, k_hi, k_levels, k_values, v_levels,
                 v_values, k_slots: int = 0, v_slots: int = 0, v_outliers_per_side: int = 0, rope: Rope = Rope(),
                 name: str = "layer"):
        self.name, self.bits, self.n_kv_heads, self.head_dim = name, bits, n_kv_heads, head_dim
        self.n_channels = D = n_kv_heads * head_dim
        if bits not in (2, 3, 4):
            raise KVKernelError(f"{name}: bits must be 2, 3 or 4, not {bits}")
        n = 2 ** bits
        self._keep = [_f32(k_lo, D, f"{name} k_lo"), _f32(k_hi, D, f"{name} k_hi"),
                      _f32(k_levels, n, f"{name} k levels"), _f32(k_values, n, f"{name} k values"),
                      _f32(v_levels, n, f"{name} v levels"), _f32(v_values, n, f"{name} v values")]
        ff = None if rope.freq_factors is None else _f32(rope.freq_factors)
        self._keep.append(ff)
        ptr = [a.ctypes.data for a in self._keep[:6]]
        cfg = _Config(bits, n_kv_heads, head_dim, k_slots, v_slots, v_outliers_per_side, ROPE_MODES[rope.mode],
                      rope.n_dims or head_dim, rope.freq_base, rope.freq_scale,
                      None if ff is None else ff.ctypes.data, *ptr)
        err = ctypes.create_string_buffer(256)
        self._h = _lib().ggml_ext_kvquant_layer_new(ctypes.byref(cfg), err, len(err))
        if not self._h:
            raise KVKernelError(f"{name}: {err.value.decode()}")
        self.k_row_size = int(_lib().ggml_ext_kvquant_k_row_size(self._h))
        self.v_row_size = int(_lib().ggml_ext_kvquant_v_row_size(self._h))

    @classmethod
    def from_calibration(cls, cal, layer: int, bits: int, outliers: bool = True, rope: Rope = Rope(),
                         slots: tuple[int, int, int] | None = None) -> "KVCacheLayer":
        """Layer ``layer`` of a :class:`~ggml_ext.kvquant.KVCalibration` at nuq``bits``, with the
        calibrated outlier thresholds and fraction (``outliers``) or the plain min/max ranges."""
        L = cal.layers[layer]
        kl, kv = cal.levels(layer, "k", bits, outliers)
        vl, vv = cal.levels(layer, "v", bits, outliers)
        D = int(cal.meta["n_kv_heads"]) * int(cal.meta["head_dim"])
        frac = float(cal.meta["outlier_fraction"]) if outliers else 0.0
        ks, vs, vk = slots if slots is not None else default_slots(D, frac)
        lo, hi = (L["k_lo"], L["k_hi"]) if outliers else (L["k_lo0"], L["k_hi0"])
        return cls(bits=bits, n_kv_heads=int(cal.meta["n_kv_heads"]), head_dim=int(cal.meta["head_dim"]),
                   k_lo=lo, k_hi=hi, k_levels=kl, k_values=kv, v_levels=vl, v_values=vv, k_slots=ks, v_slots=vs,
                   v_outliers_per_side=vk, rope=rope, name=f"blk.{layer}")

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib().ggml_ext_kvquant_layer_free(h)

    @property
    def kernel(self) -> str:
        """The implementation the kernels run for this layer ("generic", "avx2", "neon")."""
        return _lib().ggml_ext_kvquant_kernel(self._h).decode()

    def _quantize(self, fn, x, row_size: int, what: str) -> np.ndarray:
        x = _f32(x).reshape(-1, self.n_channels)
        out = np.zeros((x.shape[0], row_size), dtype=np.uint8)
        dropped = 0
        for t in range(x.shape[0]):
            r = fn(self._h, x[t].ctypes.data, out[t].ctypes.data)
            if r < 0:
                raise KVKernelError(f"{self.name} {what}: token {t} holds a NaN or infinity")
            dropped += r
        self.last_dropped = dropped
        return out

    def quantize_k(self, k) -> np.ndarray:
        """Keys before RoPE (tokens, D) -> rows; ``last_dropped`` says how many outliers found no slot."""
        return self._quantize(_lib().ggml_ext_kvquant_quantize_k, k, self.k_row_size, "keys")

    def quantize_v(self, v) -> np.ndarray:
        return self._quantize(_lib().ggml_ext_kvquant_quantize_v, v, self.v_row_size, "values")

    def _dequantize(self, fn, rows, row_size) -> np.ndarray:
        rows = np.ascontiguousarray(rows, dtype=np.uint8).reshape(-1, row_size)
        out = np.empty((rows.shape[0], self.n_channels), dtype=np.float32)
        for t in range(rows.shape[0]):
            fn(self._h, rows[t].ctypes.data, out[t].ctypes.data)
        return out

    def dequantize_k(self, rows) -> np.ndarray:
        return self._dequantize(_lib().ggml_ext_kvquant_dequantize_k, rows, self.k_row_size)

    def dequantize_v(self, rows) -> np.ndarray:
        return self._dequantize(_lib().ggml_ext_kvquant_dequantize_v, rows, self.v_row_size)

    def _head(self, head: int) -> None:
        if not 0 <= head < self.n_kv_heads:
            raise KVKernelError(f"{self.name}: KV head {head} of {self.n_kv_heads}")

    def k_scores(self, head: int | None, q, rows, pos) -> np.ndarray:
        """(n_q, tokens): q_g . RoPE(pos_t, K_t[head]) for the query heads q (n_q, head_dim) of KV head ``head``;
        head None: every KV head in one pass, q (n_kv_heads * n_q, head_dim) head-major, same shape out."""
        if head is not None:
            self._head(head)
        q = _f32(q).reshape(-1, self.head_dim)
        n_q = q.shape[0] if head is not None else q.shape[0] // self.n_kv_heads
        if head is None and q.shape[0] != n_q * self.n_kv_heads:
            raise KVKernelError(f"{self.name}: {q.shape[0]} query heads for {self.n_kv_heads} KV heads")
        rows = np.ascontiguousarray(rows, dtype=np.uint8).reshape(-1, self.k_row_size)
        pos = np.ascontiguousarray(pos, dtype=np.int32)
        if pos.shape != (rows.shape[0],):
            raise KVKernelError(f"{self.name}: {pos.size} positions for {rows.shape[0]} key rows")
        out = np.empty((q.shape[0], rows.shape[0]), dtype=np.float32)
        _lib().ggml_ext_kvquant_k_scores(self._h, -1 if head is None else head, q.ctypes.data, n_q, rows.ctypes.data,
                                     self.k_row_size,
                                     pos.ctypes.data, rows.shape[0], out.ctypes.data)
        return out

    def v_accumulate(self, head: int | None, w, rows) -> np.ndarray:
        """(n_q, head_dim): sum_t w[g, t] V_t[head] for attention weights w (n_q, tokens); head None: every KV
        head, w (n_kv_heads * n_q, tokens) head-major."""
        if head is not None:
            self._head(head)
        rows = np.ascontiguousarray(rows, dtype=np.uint8).reshape(-1, self.v_row_size)
        w = _f32(w).reshape(-1, rows.shape[0])
        n_q = w.shape[0] if head is not None else w.shape[0] // self.n_kv_heads
        if head is None and w.shape[0] != n_q * self.n_kv_heads:
            raise KVKernelError(f"{self.name}: {w.shape[0]} weight rows for {self.n_kv_heads} KV heads")
        out = np.empty((w.shape[0], self.head_dim), dtype=np.float32)
        _lib().ggml_ext_kvquant_v_accumulate(self._h, -1 if head is None else head, w.ctypes.data, n_q, rows.ctypes.data,
                                         self.v_row_size, rows.shape[0], out.ctypes.data)
        return out
