"""What a GGUF file declares about itself, checked before it is read: format versions and any-precision facts.

A file of a newer ggml-ext may keep our type ids with other bytes or tables; read with this version's
rules it would run silently wrong. So every ``ggml_ext.*version`` key (and the side files'
``kvquant.format_version`` / ``qdec.format_version``) is compared with the version this build reads, and
a newer one is refused: ``FILE: KEY: written by a newer ggml-ext (version N); this build reads M``.
The C loader refuses the same files with the same words (``ggml_ext/src/llama/file_checks.c``; its
table is held equal to :data:`READS` by ``tests/reliability/test_file_versions.py``).

Any-precision files also state their seed and parent precisions (``ggml_ext.anyprec.seed_bits`` /
``parent_bits``); values that contradict the tensors are refused naming the key and the tensor.

    >>> problem({"ggml_ext.format_version": 2}, "m.gguf")
    'm.gguf: ggml_ext.format_version: written by a newer ggml-ext (version 2); this build reads 1'
"""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["READS", "problem", "version_problem", "anyprec_problem"]

#: The version of each format key that this build reads.
READS: dict[str, int] = {
    "ggml_ext.format_version": 1,            # GGUF conventions of every file ggml-ext writes
    "ggml_ext.anyprec.version": 1,           # bitplanes and centroid tables (docs/formats/anyprec.md)
    "ggml_ext.ooc.version": 1,               # OOC column side-cars (docs/GPTQ.md)
    "ggml_ext.codebooks.tables_version": 1,  # CB2 / CB3 tables compiled in (codebooks_tables.h)
    "kvquant.format_version": 1,             # KV calibration side file (ggml-ext calibrate kv)
    "qdec.format_version": 1,                # QDEC side file (ggml-ext calibrate dec)
}


def _is_ext_version_key(key: str) -> bool:
    return key.startswith("ggml_ext.") and key.endswith("version")


def version_problem(kv: Mapping[str, Any], key: str, path: Any, required: bool = False) -> str | None:
    """Why the version ``key`` of ``kv`` is not one this build reads (None: it is, or absent and not required)."""
    reads = READS.get(key)
    if key not in kv:
        return f"{path}: {key} is missing (not a file ggml-ext wrote); this build reads version {reads}" \
            if required else None
    v = kv[key]
    if isinstance(v, bool) or not isinstance(v, int):
        return f"{path}: {key} is not a version number; this build reads {reads}"
    if reads is None:
        return f"{path}: {key}: written by a newer ggml-ext (version {v}); this build reads none of this format"
    if v > reads:
        return f"{path}: {key}: written by a newer ggml-ext (version {v}); this build reads {reads}"
    if v < 1:
        return f"{path}: {key}: version {v} is not one ggml-ext writes (a damaged file); this build reads {reads}"
    return None


def anyprec_problem(g: Any, path: Any) -> str | None:
    """Any-precision keys that contradict the tensors of ``g`` (a :class:`ggml_ext.gguf.GGUFFile`), or None.

    The parent precision of an APQ tensor is its type's (8 planes); a bitplane matrix stored as I8
    ``(k/8, n, P)`` holds P planes; the seed precision S follows from its tables' length,
    ``n (2^(P+1) - 2^S)`` F16 values."""
    kv = g.kv
    keys = ("ggml_ext.anyprec.seed_bits", "ggml_ext.anyprec.parent_bits")
    vals = []
    for key in keys:
        v = kv.get(key)
        if key not in kv:
            return f"{path}: any-precision file without {key} (a damaged file)"
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 8:
            return f"{path}: {key} is not a precision from 1 to 8 bits"
        vals.append(v)
    seed, parent = vals
    names = {t.name: t for t in g.tensors}
    for t in g.tensors:
        tab = names.get(t.name + ".apq_tables")
        if t.type_name == "APQ":
            planes, rows = 8, (t.shape[1] if len(t.shape) > 1 else 1)
        elif tab is not None and t.type_name == "I8" and len(t.shape) == 3:
            planes, rows = t.shape[2], t.shape[1]
        else:
            continue
        if planes != parent:
            return (f"{path}: {keys[1]} = {parent} contradicts tensor {t.name} ({t.type_name} "
                    f"{list(t.shape)} holds {planes} bitplanes)")
        if tab is None:
            continue
        length = tab.shape[0] if len(tab.shape) == 1 else None
        got = [s for s in range(1, parent + 1) if length == rows * ((2 << parent) - (1 << s))]
        if got != [seed]:
            if got:
                return (f"{path}: {keys[0]} = {seed} contradicts tensor {tab.name} (its length is that of "
                        f"{got[0]}-bit seed tables)")
            return (f"{path}: tensor {tab.name} holds {list(tab.shape)} entries, not N (2^(P+1) - 2^S) for "
                    f"{t.name}'s {rows} rows, P = {parent} and {keys[0]} = {seed}")
    if seed > parent:  # no bitplane matrix contradicts them: the keys contradict each other
        return f"{path}: {keys[0]} = {seed} exceeds {keys[1]} = {parent}"
    return None


def problem(kv: Mapping[str, Any], path: Any, g: Any = None) -> str | None:
    """The first declared fact of a file this build must refuse, or None: every format-version key in
    ``kv`` (ggml_ext.*version, kvquant / qdec side-file versions) and, given the file ``g``, its
    any-precision keys against its tensors."""
    for key in kv:
        if _is_ext_version_key(key) or key in READS:
            why = version_problem(kv, key, path)
            if why:
                return why
    if g is not None and "ggml_ext.anyprec.version" in kv:
        return anyprec_problem(g, path)
    return None
