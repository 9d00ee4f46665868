"""Which ggml type each tensor gets: llama.cpp's ``llama-quantize`` policy for our output types.

For output type T (``--type``):

* tensors that are not matrices (fewer than 2 dimensions: norms, biases,
  ``rope_freqs``, ``rope_factors_*``) and every ``*_norm.weight`` stay **F32**;
* **f32 / f16 / bf16**: every other weight matrix is T;
* **q8_0, q4_0, q4_1, q5_0, q5_1** (what ``llama_tensor_get_type`` in the pinned
  ``src/llama-quant.cpp`` does for these file types without an importance matrix):

  - ``output.weight``, or ``token_embd.weight`` when there is no ``output.weight``
    (tied embeddings: the same matrix is the output layer), becomes **Q6_K**,
    except that a q8_0 file keeps Q8_0;
  - every other matrix, ``token_embd.weight`` of an untied model included, is T;
  - a matrix whose row length does not divide into T's blocks falls back as
    llama.cpp does: Q6_K -> Q8_0 (row length not a multiple of 256, e.g. SmolLM2's
    576), a 32-block type -> F16.

* **q2_k, q3_k, q4_k, q5_k, q6_k** (the K-quants as "pure" files: what ``llama-quantize --pure
  --token-embedding-type X --output-tensor-type Y`` writes, X and Y the types below, so that a
  method's file and llama-quantize's compare like for like; llama.cpp's own mixes Q2_K / Q3_K_S /
  Q3_K_M ... give some matrices other types):

  - ``output.weight`` / tied ``token_embd.weight``: Q6_K (Q8_0 when the row length is not a
    multiple of 256), as for q4_0;
  - every other matrix, an untied ``token_embd.weight`` included: T;
  - a row length that is not a multiple of 256 (SmolLM2's 576, Gemma 3's 640: every matrix that
    reads the hidden state) falls back as the pinned llama-quantize does: Q2_K / Q3_K -> Q4_0,
    Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0. On those two models only ``ffn_down`` keeps T.

  ``general.file_type``: Q2_K 10, Q3_K_S 11, Q4_K_S 14, Q5_K_S 16, Q6_K 18 (the ftypes whose main
  type T is).

* **iq4_nl** (``LLAMA_FTYPE_MOSTLY_IQ4_NL`` = 25): llama.cpp's mix for that file type:

  - ``output.weight`` / tied ``token_embd.weight``: Q6_K (Q8_0 when the row
    length is not a multiple of 256), as above;
  - ``attn_v.weight`` (and a fused ``attn_qkv.weight``): Q5_K when the model has
    at least 4 query heads per KV head (``n_gqa >= 4``);
  - ``ffn_down.weight`` of the first ``n_layer // 8`` layers: Q5_K, unless an
    importance matrix is given;
  - every other matrix, an untied ``token_embd.weight`` included: IQ4_NL;
  - Q5_K on rows that are not a multiple of 256 falls back to Q5_1 (Gemma 3's 640),
    a 32-block type on rows not a multiple of 32 to F16.

* **q4_0_4_4, q4_0_4_8, q4_0_8_8** (ggml-ext's restored interleaved Q4_0, run by
  our CPU kernels, not by stock llama.cpp): the q4_0 policy, then every 2-D
  weight matrix of the blocks (``blk.*``) whose row count ``ne[1]`` divides by the
  layout's N (4, 4, 8) gets the interleaved type; any other Q4_0 tensor stays
  Q4_0 -- ``token_embd.weight`` always, since ``get_rows`` needs a plain type.
* **iq4_nl**: the q4_0 family's policy with IQ4_NL.
* **iq4_nl_4_4, iq4_nl_4_8, iq4_nl_8_8** (restored interleaved IQ4_NL): the iq4_nl
  policy, then the interleave rule of the Q4_0 layouts for the matrices it makes IQ4_NL.

* **cb2, cb3** (ggml-ext's group-wise codebook types, docs/formats/codebooks.md; run by our CPU
  kernels, not by stock llama.cpp) and their named mixes, each mirroring the llama.cpp file type
  of about the same size (``llama_tensor_get_type`` in the pinned ``src/llama-quant.cpp``):

  - ``cb2``: every matrix CB2 (the "pure" file);
  - ``cb2_m`` (llama.cpp's Q2_K mix): ``attn_v`` and ``ffn_down`` CB3 (Q2_K gives them Q3_K),
    every other matrix CB2;
  - ``cb3``: every matrix CB3;
  - ``cb3_m`` (llama.cpp's Q3_K_M mix): ``attn_v``, ``attn_output`` and ``ffn_down`` Q4_K
    (Q3_K_M gives them Q4_K / Q5_K), every other matrix CB3;

  and in each ``output.weight`` (or a tied ``token_embd.weight``) Q6_K, as in every llama.cpp
  mix. A row length that is not a multiple of 256 (SmolLM2's 576, Gemma 3's 640: every matrix
  that reads the hidden state) cannot hold a codebook block: such a tensor falls back as
  llama-quantize falls back, to IQ4_NL (Q4_K to Q5_0, Q6_K to Q8_0), and the
  converter lists the fallbacks in its warnings. (llama-quantize at the pin sends Q2_K / Q3_K to Q4_0
  and the IQ2 / IQ3 types to IQ4_NL; IQ4_NL is the better 4.5-bit type, so we take it.)

``--keep PATTERN=TYPE`` (repeatable) overrides the choice for weight matrices whose
GGUF name matches the shell glob PATTERN (``fnmatch``; the first matching rule
wins). TYPE may be any of :data:`KEEP_TYPES`. Non-matrix tensors stay F32 whatever
a pattern says; a pattern that matches no matrix at all is an error, so a typo is
not silently ignored. A kept type that does not fit the tensor's row length is an
error too (we do not second-guess an explicit request), and so is a kept
interleaved type on a tensor whose row count does not divide by N, or on
``token_embd.weight``.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from .. import formats as _formats
from .errors import ConversionError

__all__ = ["OUTPUT_TYPES", "KEEP_TYPES", "FILE_TYPES", "KeepRule", "parse_keep", "choose_type", "BLOCK"]

# ggml-ext's interleaved types, from the format registry (ggml_ext/include/ggml-ext-types.def)
_Q4_0_IL = _formats.family("interleaved4", "Q4_0")
_IQ4_NL_IL = _formats.family("interleaved4", "IQ4_NL")
_CB = _formats.family("codebooks")  # CB2, CB3
#: the codebook recipes (--type) -> (the type of most matrices, {tensor suffix: its type})
CODEBOOK_RECIPES = {
    "cb2": ("CB2", {}),
    "cb2_m": ("CB2", {"attn_v.weight": "CB3", "ffn_down.weight": "CB3"}),
    "cb3": ("CB3", {}),
    "cb3_m": ("CB3", {"attn_v.weight": "Q4_K", "attn_output.weight": "Q4_K", "ffn_down.weight": "Q4_K"}),
}

#: the K-quant output types ("pure" files, see above)
K_TYPES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
#: --type values -> ggml type names.
OUTPUT_TYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1",
                "q5_0": "Q5_0", "q5_1": "Q5_1", **{t.name.lower(): t.name for t in _Q4_0_IL},
                "iq4_nl": "IQ4_NL", **{t.name.lower(): t.name for t in _IQ4_NL_IL},
                **{k: k.upper() for k in K_TYPES},
                **({r: main for r, (main, _) in CODEBOOK_RECIPES.items()} if _CB else {})}
#: interleaved types -> rows per interleaved group (N)
INTERLEAVED_ROWS = {t.name: t.row_group for t in (*_Q4_0_IL, *_IQ4_NL_IL)}
#: --keep types: the output types, plus the K-quants and IQ4_NL that ggml quantizes without an imatrix.
KEEP_TYPES = {**{k: v for k, v in OUTPUT_TYPES.items() if k not in ("cb2_m", "cb3_m")},
              "q6_k": "Q6_K", "q5_k": "Q5_K", "q4_k": "Q4_K", "q3_k": "Q3_K", "iq4_nl": "IQ4_NL"}
#: llama_ftype of each output type (general.file_type); 33-35 are the 2024 LLAMA_FTYPE_MOSTLY_Q4_0_4_4/4_8/8_8
#: (llama.h's enum, in layout order); interleaved IQ4_NL never had an ftype of its own: 25, MOSTLY_IQ4_NL.
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "bf16": 32,
              **{t.name.lower(): 33 + t.layout for t in _Q4_0_IL}, "iq4_nl": 25,
              **{t.name.lower(): 25 for t in _IQ4_NL_IL},
              "q2_k": 10, "q3_k": 11, "q4_k": 14, "q5_k": 16, "q6_k": 18,
              # a codebook file's type is the id of its main type (ggml_ext/src/llama/hooks.c)
              **{r: next(t.id for t in _CB if t.name == main) for r, (main, _) in CODEBOOK_RECIPES.items()
                 if any(t.name == main for t in _CB)}}
_FLOAT = {"F32", "F16", "BF16"}


def _block(type_name: str) -> int:
    """Weights per block of ``type_name``, from the format registry (the stock rows need the built library,
    so the policy looks them up when it decides, not at import)."""
    return _formats.type_by_name(type_name).block_size


def __getattr__(name: str):
    # BLOCK: weights per block of every type the policy can give a tensor, as a dict (for callers that
    # want the whole map), computed from the registry when first read
    if name == "BLOCK":
        names = {*OUTPUT_TYPES.values(), *KEEP_TYPES.values(),
                 *(t for _, more in CODEBOOK_RECIPES.values() for t in more.values())}
        return {n: _block(n) for n in sorted(names)}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class KeepRule:
    pattern: str
    type_name: str  # ggml type name

    def __str__(self) -> str:
        return f"{self.pattern}={self.type_name.lower()}"


def parse_keep(spec: str) -> KeepRule:
    """'blk.*.ffn_down.weight=q8_0' -> KeepRule."""
    pattern, sep, t = spec.rpartition("=")
    if not sep or not pattern or not t:
        raise ConversionError(f"--keep {spec!r}: expected PATTERN=TYPE, e.g. 'blk.*.attn_v.weight=q8_0'")
    name = KEEP_TYPES.get(t.strip().lower())
    if name is None:
        raise ConversionError(f"--keep {spec!r}: unknown type {t!r}; choose from {', '.join(KEEP_TYPES)}")
    return KeepRule(pattern.strip(), name)


def is_matrix_weight(name: str, shape: tuple[int, ...]) -> bool:
    """Would llama-quantize consider this tensor for quantization (ggml order shape)?"""
    return len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name


def choose_type(name: str, shape: tuple[int, ...], out_type: str, *, has_output: bool,
                keep: tuple[KeepRule, ...] = (), used: set[int] | None = None,
                n_gqa: int = 1, n_layer: int = 0, has_imatrix: bool = False) -> str:
    """The ggml type name for tensor ``name`` (ggml-order ``shape``) in a file of ``out_type``.

    ``used`` collects the indices of the keep rules that matched a matrix. ``n_gqa``
    (query heads per KV head), ``n_layer`` and ``has_imatrix`` matter to iq4_nl's mix.
    """
    if out_type not in OUTPUT_TYPES:
        raise ConversionError(f"unknown output type {out_type!r}; choose from {', '.join(OUTPUT_TYPES)}")
    if not is_matrix_weight(name, shape):
        return "F32"
    ncols = shape[0]
    for i, rule in enumerate(keep):
        if fnmatch.fnmatchcase(name, rule.pattern):
            if used is not None:
                used.add(i)
            if ncols % _block(rule.type_name):
                raise ConversionError(f"--keep {rule}: {name} has rows of {ncols} weights, not a multiple of "
                                      f"{rule.type_name}'s block of {_block(rule.type_name)}")
            n = INTERLEAVED_ROWS.get(rule.type_name)
            if n is not None and name == "token_embd.weight":
                raise ConversionError(f"--keep {rule}: {name} is read with get_rows, which needs a plain type; "
                                      f"{rule.type_name} only runs in matrix multiplications")
            if n is not None and (len(shape) != 2 or shape[1] % n):
                raise ConversionError(f"--keep {rule}: {name} has shape {list(shape)}; {rule.type_name} needs a "
                                      f"2-D matrix whose row count divides by {n}")
            return rule.type_name
    default = OUTPUT_TYPES[out_type]
    if out_type in CODEBOOK_RECIPES:
        return _codebook_recipe(name, ncols, out_type, has_output)
    n = INTERLEAVED_ROWS.get(default)
    if n is not None:
        plain = "iq4_nl" if default.startswith("IQ4_NL") else "q4_0"
        t = choose_type(name, shape, plain, has_output=has_output, n_gqa=n_gqa, n_layer=n_layer,
                        has_imatrix=has_imatrix)
        if t == OUTPUT_TYPES[plain] and name.startswith("blk.") and len(shape) == 2 and shape[1] % n == 0:
            return default
        return t
    if default in _FLOAT:
        return default
    t = default
    if name == "output.weight" or (not has_output and name == "token_embd.weight"):
        t = "Q8_0" if (default == "Q8_0" or ncols % _block(default)) else "Q6_K"
    elif default == "IQ4_NL":
        t = _iq4_nl_mix(name, n_gqa, n_layer, has_imatrix)
    return _fallback(t, ncols)


def _iq4_nl_mix(name: str, n_gqa: int, n_layer: int, has_imatrix: bool) -> str:
    # llama_tensor_get_type_impl for LLAMA_FTYPE_MOSTLY_IQ4_NL (no MoE among our architectures)
    if name.endswith(("attn_v.weight", "attn_qkv.weight")) and n_gqa >= 4:
        return "Q5_K"
    m = re.match(r"^blk\.(\d+)\.ffn_down\.weight$", name)
    if m and not has_imatrix and int(m.group(1)) < n_layer // 8:
        return "Q5_K"
    return "IQ4_NL"


def _codebook_recipe(name: str, ncols: int, recipe: str, has_output: bool) -> str:
    main, more = CODEBOOK_RECIPES[recipe]
    if name == "output.weight" or (not has_output and name == "token_embd.weight"):
        return _fallback("Q6_K", ncols)
    t = next((v for suffix, v in more.items() if name.endswith(suffix)), main)
    return _fallback(t, ncols)


def _fallback(t: str, ncols: int) -> str:
    """llama-quantize's fallback for a row length that is not a whole number of t's blocks
    (``tensor_type_fallback`` of the pinned llama-quant.cpp: the 256-blocks go to a 32-block type)."""
    if ncols % _block(t) == 0:
        return t
    if t in ("CB2", "CB3") and ncols % _block("IQ4_NL") == 0:
        return "IQ4_NL"
    if t in ("Q2_K", "Q3_K") and ncols % _block("Q4_0") == 0:
        return "Q4_0"
    if t == "Q4_K" and ncols % _block("Q5_0") == 0:
        return "Q5_0"
    if t == "Q6_K" and ncols % _block("Q8_0") == 0:
        return "Q8_0"
    if t == "Q5_K" and ncols % _block("Q5_1") == 0:
        return "Q5_1"
    return "F16"
