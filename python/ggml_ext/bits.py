"""``ggml-ext bits FILE.gguf``: the bit family of every tensor and of the file (K-OOC paper, section 3.1).

The K-OOC paper counts what a quantized weight really costs as three parts, in bits per weight:

* **B, quant bits** -- the bits of the quantized values themselves (4 for Q4_0, 2 for Q2_K, ...);
* **F, flag bits** -- the side information that decodes them, per weight: scales, minimums, zero
  points, super-block scales (Q4_0: one fp16 scale per 32 weights = 0.5);
* **M, mark bits** -- bits that say *which* weights are stored differently (outlier / high-precision
  masks or index lists; BiLLM pays 1.9 per weight for them).

``A = M + F + B``. ``A_max`` is the average for the matrix at its actual size k x d, ``A_lim`` its
limit for d -> infinity (terms paid once per row or per matrix vanish); together they are the
*bit family*: GPTQ(2) with groups of 128 and fp16 flags is ``A_lim = 2 + (2 + 16)/128 = 2.14``.

For ggml's types every bit lives in fixed blocks (``block_size`` weights in ``type_size`` bytes): M
is 0 (positions are implied by the layout), F is the block's bytes beyond its quant bits, and A does
not depend on the matrix size (rows are whole blocks), so ``A_max = A_lim = type_size * 8 /
block_size``. The split of a block into B and F comes from the type's layout (:data:`QUANT_BITS`);
for the codebook types (IQ1/IQ2/IQ3 grids, which pack signs and scales into the indices) there is
no such split, and only A is given. Files that add per-matrix side information outside the blocks
add bits that vanish only with d: an OOC column side-car (``<w>.ooc_idx`` I32 [k], ``<w>.ooc_s`` [k, rows];
``ggml-ext convert --method ooc``, docs/GPTQ.md) is counted into its weight's row, not as tensors of its
own: its index list is mark bits (M = 32 k / (rows d): which columns are clear, paid once per matrix), its
values quant bits beyond the blocks' (k values per row at the side-car's float width: + width k / d); both
vanish for d -> infinity with k fixed (one clear group), so A_lim stays the block type's and A_max > A_lim
-- the paper's OOC bit family (A_lim of GPTQ(l)).

The file's totals: ``A`` over every tensor (what the file costs per weight), ``A_max`` the worst
quantized matrix, ``A_lim`` the element-weighted limit over the quantized matrices.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from . import formats
from .gguf.reader import GGUFError, GGUFFile, read_gguf

__all__ = ["QUANT_BITS", "TensorBits", "FileBits", "tensor_bits", "file_bits", "add_arguments", "main"]

#: bits of the quantized values per weight, by ggml type (the rest of a block is flag bits)
QUANT_BITS = {
    "F32": 32, "F16": 16, "BF16": 16, "F64": 64, "I8": 8, "I16": 16, "I32": 32, "I64": 64,
    "Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q8_1": 8, "IQ4_NL": 4, "IQ4_XS": 4,
    "Q4_0_4_4": 4, "Q4_0_4_8": 4, "Q4_0_8_8": 4, "IQ4_NL_4_4": 4, "IQ4_NL_4_8": 4, "IQ4_NL_8_8": 4,
    "Q2_K": 2, "Q3_K": 3, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6, "Q8_K": 8,
    "MXFP4": 4, "NVFP4": 4, "Q1_0": 1, "Q2_0": 2, "TQ2_0": 2,
    "TQ1_0": 1.625,  # 240 trits packed 5 per byte plus 16 packed 4 per byte: 52 bytes per 256
}


@dataclass(frozen=True)
class TensorBits:
    name: str
    type_name: str
    shape: tuple[int, ...]
    n_weights: int
    quant: float | None     # B (None: the type has no quant/flag split, a codebook type)
    flag: float | None      # F
    mark: float             # M
    a_max: float            # A at this tensor's size
    a_lim: float            # A for d -> infinity
    quantized: bool         # a quantized type (counted in the file's A_max / A_lim)


@dataclass(frozen=True)
class FileBits:
    tensors: list[TensorBits]
    a_total: float          # all tensors: bits / weights
    a_max: float            # worst quantized matrix
    a_lim: float            # quantized matrices, element-weighted limit
    n_quantized: int        # quantized tensors counted in a_max / a_lim


def tensor_bits(name: str, type_name: str, type_id: int, shape: tuple[int, ...]) -> TensorBits:
    """The bit family of one tensor stored as ggml type ``type_name`` (id ``type_id``)."""
    t = formats.find_type(type_id)
    if t is None:
        raise GGUFError(f"tensor {name}: unknown ggml type id {type_id}")
    a = t.type_size * 8 / t.block_size
    b = QUANT_BITS.get(t.name)
    f = None if b is None else a - b
    return TensorBits(name, t.name, tuple(shape), formats.n_elements(shape), b, f, 0.0, a, a, t.is_quantized)


SIDECAR_SUFFIXES = (".ooc_idx", ".ooc_s")


def with_sidecar(r: TensorBits, idx_shape: tuple[int, ...], s_type_bits: float) -> TensorBits:
    """``r`` (a weight of ggml shape (d, rows)) with its OOC side-car of k columns counted in: mark bits for the
    index list (32 k per matrix), quant bits for the values (``s_type_bits`` k per row)."""
    d, rows = r.shape[0], (r.n_weights // r.shape[0] if r.shape else 1)
    k = idx_shape[0]
    mark = 32.0 * k / (rows * d)
    extra = s_type_bits * k / d
    q = None if r.quant is None else r.quant + extra
    return TensorBits(r.name, r.type_name, r.shape, r.n_weights, q, r.flag, r.mark + mark, r.a_max + mark + extra,
                      r.a_lim, r.quantized)


def file_bits(g: GGUFFile) -> FileBits:
    """Per tensor and total bit family of a parsed GGUF file (OOC side-cars folded into their weights)."""
    by_name = {t.name: t for t in g.tensors}
    rows = []
    for t in g.tensors:
        if t.name.endswith(SIDECAR_SUFFIXES) and t.name.rsplit(".", 1)[0] in by_name:
            continue   # counted with its weight
        r = tensor_bits(t.name, t.type_name, t.type_id, t.shape)
        idx, vals = by_name.get(t.name + ".ooc_idx"), by_name.get(t.name + ".ooc_s")
        if idx is not None and vals is not None:
            r = with_sidecar(r, tuple(idx.shape), vals.nbytes * 8 / max(1, vals.n_elements))
        rows.append(r)
    n = sum(r.n_weights for r in rows)
    total = sum(r.a_max * r.n_weights for r in rows) / n if n else 0.0
    quantized = [r for r in rows if r.quantized]
    nq = sum(r.n_weights for r in quantized)
    a_max = max((r.a_max for r in quantized), default=0.0)
    a_lim = sum(r.a_lim * r.n_weights for r in quantized) / nq if nq else 0.0
    return FileBits(rows, total, a_max, a_lim, len(quantized))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def format_bits(fb: FileBits, per_tensor: bool = True) -> str:
    out = []
    if per_tensor:
        out.append(f"{'tensor':<34} {'type':<8} {'weights':>11} {'B':>6} {'F':>7} {'M':>3} {'A_max':>7} {'A_lim':>7}")
        for r in fb.tensors:
            out.append(f"{r.name:<34} {r.type_name:<8} {r.n_weights:>11} {_fmt(r.quant):>6} {_fmt(r.flag):>7} "
                       f"{_fmt(r.mark):>3} {r.a_max:>7.4f} {r.a_lim:>7.4f}")
        out.append("")
    out.append(f"quantized tensors: {fb.n_quantized}; bit family A_max {fb.a_max:.4f}, A_lim {fb.a_lim:.4f}; "
               f"all tensors A {fb.a_total:.4f} bits per weight")
    return "\n".join(out) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE.gguf", help="a GGUF file (ours or stock)")
    parser.add_argument("--total", action="store_true", help="only the file's totals, no per-tensor table")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def main(args: argparse.Namespace) -> int:
    try:
        g = read_gguf(args.file)
        fb = file_bits(g)
    except (GGUFError, OSError) as e:
        print(f"error: {args.file}: {e}", file=sys.stderr)
        return 1
    if args.json:
        d = asdict(fb)
        if args.total:
            d.pop("tensors")
        print(json.dumps(d, indent=1))
    else:
        sys.stdout.write(format_bits(fb, per_tensor=not args.total))
    return 0
