"""The grids of ggml's 32-weight block types, as a rounding function for error-compensating methods.

GPTQ-style methods quantize one column at a time and feed the rounding error forward, so they need
the target type's quantizer split in two: *choose a block's scale(s)* (done once per block, with the
type's own rule) and *round one weight to the nearest grid value under those fixed scales*. Here:

* :meth:`Grid.scales` -- the scales ggml itself picks for a block: the block's rows go through
  :func:`ggml_ext.quants.quantize` (ggml's quantizer; ggml-ext's exact search for IQ4_NL), optionally
  with per-column importances as the imatrix, and the fp16 scale fields are read back from the bytes;
* :meth:`Grid.state` / :meth:`Grid.round` -- nearest grid index and value of a column of weights
  under a block's fixed scales (torch, any device);
  values are computed in float32 the way ggml's ``to_float`` computes them, so they are exactly what
  llama.cpp will use;
* :meth:`Grid.pack` -- chosen indices and scales -> the type's block bytes (ggml's layout).

Supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (32-weight blocks, :class:`Grid`) and the K-quants
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (:class:`KGrid`: 256-weight super-blocks whose "scales" are ggml's whole
scale header -- fp16 super-scale(s) and the quantized sub-block scales and mins -- chosen by ggml's
own K-quantizer for the super-block, after which each weight is rounded to its sub-block's grid) and
ggml-ext's codebook types CB2, CB3 (:class:`CBGrid`: the header -- super-scale, local scales, codebook
indices -- from the library's quantizer, each weight rounded to its sub-group's codebook).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Grid", "KGrid", "GRIDS", "grid"]

#: IQ4_NL's non-linear grid (ggml's kvalues_iq4nl)
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)

QK = 32


@dataclass(frozen=True)
class Grid:
    """One 32-weight block type: ``levels`` indices, value ``d * (k - offset)`` (``d * kv[k]`` for
    IQ4_NL), plus ``m`` for the types with a minimum (Q4_1, Q5_1: ``d * k + m``)."""

    name: str
    levels: int
    offset: int          # k - offset is the signed quant (0 for the types with a minimum)
    has_min: bool
    nbytes: int          # bytes per block
    block: int = QK

    @property
    def nparams(self) -> int:
        """Scale parameters per block (the last axis of :meth:`scales`)."""
        return 2 if self.has_min else 1

    # ------------------------------------------------------------------ scales
    def scales(self, w: np.ndarray, importance: np.ndarray | None = None, **quantizer) -> np.ndarray:
        """The scale fields ggml writes for the blocks ``w`` (n_rows x block float32, one block per row):
        float32 array n_rows x :attr:`nparams` (here ``d`` and ``m``, each exactly an fp16 value)."""
        from ggml_ext import quants
        b = quants.quantize(np.ascontiguousarray(w, dtype=np.float32), self.name,
                            imatrix=None if importance is None else np.asarray(importance, np.float32), **quantizer)
        return self.decode(b.reshape(b.shape[0], 1, self.nbytes))[:, 0]

    def decode(self, b: np.ndarray) -> np.ndarray:
        """Block bytes (n_rows x n_blocks x nbytes uint8) -> their scale parameters, n_rows x n_blocks x
        :attr:`nparams` float32."""
        n = self.nparams
        return np.ascontiguousarray(b[:, :, :2 * n]).view(np.float16).astype(np.float32)

    # ------------------------------------------------------------------ round
    def state(self, s, dtype):
        """What :meth:`round` needs of one block's row scales ``s`` (torch float32, n x 1|2), prepared
        once per block: the scale in ``dtype``, a zero scale made infinite (x / inf = 0: the index of
        value 0), and for the types with a minimum both in float32."""
        import torch
        d = s[:, 0]
        st = {"d": d.to(dtype), "dsafe": torch.where(d == 0, torch.full_like(d, float("inf")), d).to(dtype)}
        if self.has_min:
            st["d32"], st["m32"], st["m"] = d, s[:, 1], s[:, 1].to(dtype)
        if self.name == "IQ4_NL":
            kv = torch.as_tensor(IQ4_NL_VALUES, device=s.device)
            st["grid"] = (d[:, None] * kv[None, :]).to(dtype)  # exact: 8-bit ints times fp16 values
        return st

    def round(self, x, st, at: int = 0):
        """Nearest grid index (as a float of ``x``'s dtype) and its value for each entry of ``x`` (torch,
        n) under a block's :meth:`state`; ``at`` (the column's place in its block) matters to K-quants only. Values are what ggml's to_float gives: d * (k - offset) and
        d * kv[k] are exact products in any float type; d * k + m is rounded once in float32 as ggml does."""
        if self.name == "IQ4_NL":
            k = (x[:, None] - st["grid"]).abs_().argmin(dim=1, keepdim=True)
            return k[:, 0].to(x.dtype), st["grid"].gather(1, k)[:, 0]
        base = x - st["m"] if self.has_min else x
        k = (base / st["dsafe"]).round_().add_(self.offset).clamp_(0, self.levels - 1)
        if self.has_min:
            return k, (k.float() * st["d32"] + st["m32"]).to(x.dtype)
        return k, (k - self.offset) * st["d"]

    # ------------------------------------------------------------------ bytes
    def pack(self, k: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Indices ``k`` (n_rows x n_cols ints) and scales ``s`` (n_rows x n_blocks x 1|2 float32) ->
        the tensor's bytes, n_rows x row_size uint8, in ggml's block layout."""
        n_rows, n_cols = k.shape
        nb = n_cols // QK
        k = k.reshape(n_rows, nb, QK).astype(np.uint8)
        out = np.zeros((n_rows, nb, self.nbytes), dtype=np.uint8)
        n = 2 if self.has_min else 1
        out[:, :, :2 * n] = s.astype(np.float16).view(np.uint8).reshape(n_rows, nb, 2 * n)
        at = 2 * n
        if self.name == "Q8_0":
            out[:, :, at:] = (k.astype(np.int16) - self.offset).astype(np.int8).view(np.uint8)
            return out.reshape(n_rows, -1)
        if self.levels == 32:  # Q5_0 / Q5_1: bit 4 of each quant in a 32-bit mask, low nibbles as Q4
            hi = ((k >> 4) & 1).astype(np.uint32)
            qh = (hi << np.arange(QK, dtype=np.uint32)).sum(axis=2, dtype=np.uint32)
            out[:, :, at:at + 4] = qh.astype("<u4").view(np.uint8).reshape(n_rows, nb, 4)
            at += 4
        lo = k & 15
        out[:, :, at:at + 16] = lo[:, :, :16] | (lo[:, :, 16:] << 4)
        return out.reshape(n_rows, -1)


QK_K = 256


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes (... x 2 uint8) -> their fp16 value as float32 (...)."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _k4_unpack(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 scale bytes (... x 12) -> 8 six-bit scales and 8 six-bit mins (ggml's
    ``get_scale_min_k4``)."""
    b = b.astype(np.uint8)
    lo, hi = b[..., 0:4], b[..., 4:8]
    sc = np.concatenate([lo & 63, (b[..., 8:12] & 0xF) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (b[..., 8:12] >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc, mn


def _k4_pack(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_k4_unpack`: 8 scales and 8 mins (0..63) -> 12 bytes."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.empty(sc.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    out[..., 4:8] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:] & 0xF) | ((mn[..., 4:] & 0xF) << 4)
    return out


def _q3_unpack(b: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes (... x 12) -> its 16 six-bit scales as stored (0..63; the scale is s - 32)."""
    b = b.astype(np.uint8)
    hi = b[..., 8:12]
    parts = [b[..., 0:4] & 0xF, b[..., 4:8] & 0xF, b[..., 0:4] >> 4, b[..., 4:8] >> 4]
    return np.concatenate([p | (((hi >> (2 * g)) & 3) << 4) for g, p in enumerate(parts)], axis=-1)


def _q3_pack(s: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_q3_unpack`: 16 stored scales (0..63) -> 12 bytes."""
    s = s.astype(np.uint8)
    out = np.empty(s.shape[:-1] + (12,), np.uint8)
    out[..., 0:8] = (s[..., 0:8] & 0xF) | ((s[..., 8:16] & 0xF) << 4)
    out[..., 8:12] = sum(((s[..., 4 * g:4 * g + 4] >> 4) & 3) << (2 * g) for g in range(4)).astype(np.uint8)
    return out


@dataclass(frozen=True)
class KGrid:
    """A K-quant: super-blocks of 256 weights, ``256 // sub`` sub-blocks, each with its own scale
    ``dl = d * sc`` (signed ``sc`` for Q3_K/Q6_K) and, for the types with a minimum, ``ml = dmin * m``;
    a weight with index k is ``dl * (k - offset)`` (Q3_K, Q6_K) or ``dl * k - ml`` (Q2_K, Q4_K, Q5_K),
    in float32 exactly as ggml's ``dequantize_row_*`` computes it.

    The "scales" of a super-block are its whole header, as parameters (float32, all exact):
    ``[d, sc_0 .. sc_n]`` (Q3_K: the stored 6-bit values, scale = s - 32; Q6_K: int8) or
    ``[d, dmin, sc_0 .. sc_n, m_0 .. m_n]``. :meth:`scales` takes them from ggml's own quantizer
    (with the importances as imatrix), so they are the scales ggml would write for those weights;
    :meth:`pack` writes them back bit for bit with the chosen indices."""

    name: str
    levels: int
    offset: int
    has_min: bool
    nbytes: int
    sub: int             # weights per sub-block (16 or 32)
    block: int = QK_K

    @property
    def nsub(self) -> int:
        return self.block // self.sub

    @property
    def nparams(self) -> int:
        return (2 + 2 * self.nsub) if self.has_min else (1 + self.nsub)

    # ------------------------------------------------------------------ scales
    def scales(self, w: np.ndarray, importance: np.ndarray | None = None, **quantizer) -> np.ndarray:
        """The header ggml's K-quantizer writes for the super-blocks ``w`` (n_rows x 256 float32, one per
        row): n_rows x :attr:`nparams` float32."""
        from ggml_ext import quants
        b = quants.quantize(np.ascontiguousarray(w, dtype=np.float32), self.name,
                            imatrix=None if importance is None else np.asarray(importance, np.float32), **quantizer)
        return self.decode(b.reshape(b.shape[0], 1, self.nbytes))[:, 0]

    def decode(self, b: np.ndarray) -> np.ndarray:
        """Super-block bytes (n_rows x n_blocks x nbytes uint8) -> their headers (n_rows x n_blocks x
        :attr:`nparams` float32), read as ggml's ``dequantize_row_*`` reads them."""
        b = np.ascontiguousarray(b, dtype=np.uint8)
        if self.name == "Q2_K":    # scales[16] (scale | min << 4), qs[64], d, dmin
            head = [_f16(b[..., 80:82]), _f16(b[..., 82:84])]
            body = [b[..., 0:16] & 0xF, b[..., 0:16] >> 4]
        elif self.name == "Q3_K":  # hmask[32], qs[64], scales[12], d
            head, body = [_f16(b[..., 108:110])], [_q3_unpack(b[..., 96:108])]
        elif self.name in ("Q4_K", "Q5_K"):  # d, dmin, scales[12], (qh[32],) qs[128]
            head, body = [_f16(b[..., 0:2]), _f16(b[..., 2:4])], list(_k4_unpack(b[..., 4:16]))
        else:                      # Q6_K: ql[128], qh[64], scales[16] (int8), d
            head, body = [_f16(b[..., 208:210])], [b[..., 192:208].view(np.int8)]
        return np.concatenate([h[..., None] for h in head] + [x.astype(np.float32) for x in body], axis=-1)

    # ------------------------------------------------------------------ round
    def state(self, s, dtype):
        """Per sub-block scale ``dl`` (and min ``ml``) of one super-block's header ``s`` (torch float32,
        n x nparams), as float32 products (exact: an fp16 value times a 6- or 8-bit integer)."""
        import torch
        d = s[:, :1]
        if self.has_min:
            dl = d * s[:, 2:2 + self.nsub]
            ml = s[:, 1:2] * s[:, 2 + self.nsub:]
        else:
            dl = d * (s[:, 1:] - 32 if self.name == "Q3_K" else s[:, 1:])
            ml = None
        return {"dl": dl, "ml": ml, "dsafe": torch.where(dl == 0, torch.full_like(dl, float("inf")), dl).to(dtype),
                "mld": None if ml is None else ml.to(dtype), "zero": d[:, 0] == 0}

    def round(self, x, st, at: int = 0):
        """Nearest index and value for each entry of ``x`` (torch, n): column ``at`` of the super-block,
        so sub-block ``at // sub``'s scale (and min). Where that scale is 0 every index gives the value
        0 (a zero min too); the index is then k = offset (ggml's choice in a block with d != 0), and 0 in
        a super-block with d = 0 (which ggml writes as zero bytes). Values as ggml's to_float computes them: float32
        ``dl * (k - offset)`` (Q6_K's is rounded once: fp16 x 8-bit x 6-bit) or ``dl * k - ml``."""
        j = at // self.sub
        dl, dsafe = st["dl"][:, j], st["dsafe"][:, j]
        if self.has_min:
            k = ((x + st["mld"][:, j]) / dsafe).round_().clamp_(0, self.levels - 1)
            return k, (k.float() * dl - st["ml"][:, j]).to(x.dtype)
        k = (x / dsafe).round_().add_(self.offset).clamp_(0, self.levels - 1)
        # a super-block with d = 0 is all zero bytes in ggml (its quantizer memsets it); any index gives 0
        k.masked_fill_(st["zero"], 0)
        return k, ((k.float() - self.offset) * dl).to(x.dtype)

    # ------------------------------------------------------------------ bytes
    def pack(self, k: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Indices ``k`` (n_rows x n_cols) and headers ``s`` (n_rows x n_blocks x nparams) -> the tensor's
        bytes (n_rows x row_size uint8) in ggml's ``block_<type>`` layout."""
        n_rows, n_cols = k.shape
        nb = n_cols // QK_K
        k = k.reshape(n_rows, nb, QK_K).astype(np.uint8)
        s = np.asarray(s, np.float32)
        out = np.zeros((n_rows, nb, self.nbytes), dtype=np.uint8)
        d = s[..., 0].astype(np.float16).view(np.uint8).reshape(n_rows, nb, 2)
        ints = np.rint(s[..., 1:]).astype(np.int64)

        def crumbs(q2):   # 2-bit values of a super-block -> qs[64]: byte h*32+l, bits 2j, weight h*128+j*32+l
            q2 = q2.reshape(n_rows, nb, 2, 4, 32)
            return sum(q2[:, :, :, j] << (2 * j) for j in range(4)).reshape(n_rows, nb, 64)

        if self.name == "Q2_K":
            dmin = s[..., 1].astype(np.float16).view(np.uint8).reshape(n_rows, nb, 2)
            sc, mn = ints[..., 1:1 + self.nsub], ints[..., 1 + self.nsub:]
            out[..., 0:16] = sc | (mn << 4)
            out[..., 16:80] = crumbs(k)
            out[..., 80:82], out[..., 82:84] = d, dmin
        elif self.name == "Q3_K":
            hi = (k >> 2).reshape(n_rows, nb, 2, 4, 32)
            out[..., 0:32] = sum(hi[:, :, h, j] << (4 * h + j) for h in range(2) for j in range(4))
            out[..., 32:96] = crumbs(k & 3)
            out[..., 96:108] = _q3_pack(ints)
            out[..., 108:110] = d
        elif self.name in ("Q4_K", "Q5_K"):
            dmin = s[..., 1].astype(np.float16).view(np.uint8).reshape(n_rows, nb, 2)
            out[..., 0:2], out[..., 2:4] = d, dmin
            out[..., 4:16] = _k4_pack(ints[..., 1:1 + self.nsub], ints[..., 1 + self.nsub:])
            q = k.reshape(n_rows, nb, 4, 2, 32)     # chunk c of 64, nibble, l: qs[c*32+l]
            at = 16
            if self.name == "Q5_K":                 # bit 4 of weight 32*s+l: bit s of qh[l]
                hb = (q >> 4).reshape(n_rows, nb, 8, 32)
                out[..., 16:48] = sum(hb[:, :, sb] << sb for sb in range(8))
                at = 48
            out[..., at:at + 128] = ((q[:, :, :, 0] & 0xF) | ((q[:, :, :, 1] & 0xF) << 4)).reshape(n_rows, nb, 128)
        else:  # Q6_K
            q = k.reshape(n_rows, nb, 2, 4, 32)     # half h, quarter t, l
            lo = q & 0xF
            out[..., 0:128] = np.stack([lo[:, :, :, 0] | (lo[:, :, :, 2] << 4), lo[:, :, :, 1] | (lo[:, :, :, 3] << 4)],
                                       axis=3).reshape(n_rows, nb, 128)
            out[..., 128:192] = sum((q[:, :, :, t] >> 4) << (2 * t) for t in range(4)).reshape(n_rows, nb, 64)
            out[..., 192:208] = ints.astype(np.int8).view(np.uint8)
            out[..., 208:210] = d
        return out.reshape(n_rows, -1)


@dataclass(frozen=True)
class CBGrid:
    """A group-wise codebook type (CB2, CB3; docs/formats/codebooks.md): blocks of 256 weights, one fp16
    super-scale ``d``, 16 sub-groups of 16 weights, each with a 4-bit local scale ``l`` and a 2-bit
    codebook index ``c``; a weight with code ``q`` is ``d * (l + 1) * T[c][q]`` (the built-in int8 tables
    ``T``), in float32 as the library's dequantize computes it (``m = d * (l + 1)`` first).

    As for :class:`KGrid`, the "scales" of a block are its whole header, ``[d, l_0 .. l_15, c_0 .. c_15]``
    (float32, exact), taken from the library's own importance-weighted quantizer (:meth:`scales`): GPTQ
    then rounds each column, error-updated, to the nearest entry of its sub-group's chosen codebook at
    its scale, so the codebook and scale a sub-group uses are the library's and only the codes move."""

    name: str
    bits: int
    nbytes: int
    block: int = QK_K
    sub: int = 16

    @property
    def nsub(self) -> int:
        return self.block // self.sub

    @property
    def nparams(self) -> int:
        return 1 + 2 * self.nsub

    @property
    def levels(self) -> int:
        return 2 ** self.bits

    def tables(self) -> np.ndarray:
        from ggml_ext import codebooks
        return codebooks.tables(self.bits).astype(np.float32)

    def scales(self, w: np.ndarray, importance: np.ndarray | None = None, **quantizer) -> np.ndarray:
        """The header the library's quantizer writes for the blocks ``w`` (n_rows x 256 float32)."""
        from ggml_ext import quants
        b = quants.quantize(np.ascontiguousarray(w, dtype=np.float32), self.name,
                            imatrix=None if importance is None else np.asarray(importance, np.float32), **quantizer)
        return self.decode(b.reshape(b.shape[0], 1, self.nbytes))[:, 0]

    def decode(self, b: np.ndarray) -> np.ndarray:
        """Block bytes (n_rows x n_blocks x nbytes uint8) -> headers (n_rows x n_blocks x nparams float32)."""
        b = np.ascontiguousarray(b, dtype=np.uint8)
        s = np.arange(self.nsub)
        loc = (b[..., 2 + (s >> 1)] >> (4 * (s & 1))) & 15
        cb = (b[..., 10 + (s >> 2)] >> (2 * (s & 3))) & 3
        return np.concatenate([_f16(b[..., 0:2])[..., None], loc.astype(np.float32), cb.astype(np.float32)], axis=-1)

    def state(self, s, dtype):
        """Per sub-group scale ``m = d * (l + 1)`` and its codebook's entries at that scale (torch, n x
        16 x entries, float32: the values the library's dequantize computes)."""
        import torch
        T = torch.as_tensor(self.tables(), device=s.device)
        m = s[:, :1] * (s[:, 1:1 + self.nsub] + 1)
        c = s[:, 1 + self.nsub:].long()
        return {"values": m[:, :, None] * T[c]}

    def round(self, x, st, at: int = 0):
        """Nearest code and value for each entry of ``x`` (torch, n): column ``at`` of the block, so sub-group
        ``at // 16``'s codebook at its scale (the lowest code on a tie: a block with d = 0 gives code 0)."""
        v = st["values"][:, at // self.sub].to(x.dtype)      # n x entries
        k = (x[:, None] - v).abs().argmin(dim=1)
        return k.to(x.dtype), v.gather(1, k[:, None])[:, 0]

    def pack(self, k: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Codes ``k`` (n_rows x n_cols) and headers ``s`` (n_rows x n_blocks x nparams) -> the tensor's bytes
        in the ``ggml_ext_block_cb2`` / ``_cb3`` layout (codebooks.h)."""
        n_rows, n_cols = k.shape
        nb = n_cols // self.block
        q = k.reshape(n_rows, nb, self.nsub, self.sub).astype(np.uint8)    # sub-group s, weight j
        s = np.asarray(s, np.float32)
        ints = np.rint(s[..., 1:]).astype(np.uint8)
        loc, cb = ints[..., :self.nsub], ints[..., self.nsub:]
        out = np.zeros((n_rows, nb, self.nbytes), dtype=np.uint8)
        out[..., 0:2] = s[..., 0].astype(np.float16).view(np.uint8).reshape(n_rows, nb, 2)
        out[..., 2:10] = loc[..., 0::2] | (loc[..., 1::2] << 4)
        out[..., 10:14] = sum(cb[..., g::4] << (2 * g) for g in range(4))
        lo = (q & 3).reshape(n_rows, nb, 4, 4, self.sub)                   # sub-group s = 4 * chunk + pair
        out[..., 14:78] = sum(lo[:, :, :, g] << (2 * g) for g in range(4)).reshape(n_rows, nb, 64)
        if self.bits == 3:
            hi = (q >> 2).reshape(n_rows, nb, 2, 8, self.sub)              # sub-group s = 8 * half + bit
            out[..., 78:110] = sum(hi[:, :, :, g] << g for g in range(8)).reshape(n_rows, nb, 32)
        return out.reshape(n_rows, -1)


GRIDS = {
    "Q4_0": Grid("Q4_0", 16, 8, False, 18),
    "Q4_1": Grid("Q4_1", 16, 0, True, 20),
    "Q5_0": Grid("Q5_0", 32, 16, False, 22),
    "Q5_1": Grid("Q5_1", 32, 0, True, 24),
    "Q8_0": Grid("Q8_0", 256, 128, False, 34),
    "IQ4_NL": Grid("IQ4_NL", 16, 0, False, 18),
    "Q2_K": KGrid("Q2_K", 4, 0, True, 84, 16),
    "Q3_K": KGrid("Q3_K", 8, 4, False, 110, 16),
    "Q4_K": KGrid("Q4_K", 16, 0, True, 144, 32),
    "Q5_K": KGrid("Q5_K", 32, 0, True, 176, 32),
    "Q6_K": KGrid("Q6_K", 64, 32, False, 210, 16),
    "CB2": CBGrid("CB2", 2, 78),
    "CB3": CBGrid("CB3", 3, 110),
}


def grid(type_name: str) -> Grid | KGrid | CBGrid:
    """The :class:`Grid` of ggml type ``type_name``; KeyError if it has none."""
    return GRIDS[type_name.upper()]
