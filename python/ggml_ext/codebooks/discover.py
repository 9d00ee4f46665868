"""Codebook discovery: Algorithm 1 of the Arm paper (docs/formats/codebooks.md).

    1. Split every weight matrix's rows into sub-groups of 16 consecutive weights (the format's
       sub-group) and scale each into the int8 range: ``s = x * 127 / max|x|``.
    2. Turn each scaled sub-group into a normalised histogram (``bins`` equal bins over
       [-127.5, 127.5]): a discrete probability distribution of its shape.
    3. k-means the histograms into C clusters (scikit-learn ``KMeans``): sub-groups of similar shape.
    4. Inside each cluster, k-means the scaled values themselves into K centroids (4 for 2-bit
       codes, 8 for 3-bit): that cluster's codebook, rounded to signed int8 and sorted.

Which sub-groups take part is a seeded uniform sub-sample (``max_groups``, default 200,000,
drawn in proportion to each tensor's size), so the whole run takes a few minutes on 2 cores
and the same seed, inputs and scikit-learn version give the same tables. The result records
its inputs (file names, sizes, sha256), the command, the versions and the seed.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

#: the format's sub-group length
GROUP = 16
#: (codebooks, entries per codebook) per code width: 2-bit codes index 4 entries, 3-bit codes 8;
#: both types keep 4 codebooks (a 2-bit index per sub-group): docs/formats/codebooks.md says why.
SHAPES = {2: (4, 4), 3: (4, 8)}
DEFAULT_MAX_GROUPS = 200_000
DEFAULT_BINS = 16
DEFAULT_SEED = 0
#: values fed to each cluster's 1-D k-means at most (a seeded sub-sample of the cluster's values)
MAX_VALUES_PER_CLUSTER = 400_000


class DiscoveryError(ValueError):
    """The inputs cannot be read, or hold nothing to discover codebooks from."""


@dataclass(frozen=True)
class Matrix:
    """One weight matrix of a model: where it came from and its rows (float32, row-major)."""
    source: str
    name: str
    rows: np.ndarray


def _is_block_weight(name: str, shape: tuple[int, ...]) -> bool:
    """Decoder-block weight matrices (what the codebook types are for): 2-D, row length a
    multiple of 16, inside a layer; embeddings, the output head and norms excluded."""
    if len(shape) != 2 or shape[-1] % GROUP:
        return False
    in_block = ".layers." in name or name.startswith("blk.") or ".h." in name
    return in_block and "norm" not in name


def iter_matrices(path: str | os.PathLike) -> Iterator[Matrix]:
    """The block weight matrices of a Hugging Face folder (``*.safetensors``) or a GGUF file
    (any type the ``gguf`` package dequantizes), as float32."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise DiscoveryError(f"{p}: no *.safetensors files (expected a Hugging Face model folder)")
        from safetensors import safe_open
        for f in files:
            with safe_open(str(f), framework="np") as st:
                for name in sorted(st.keys()):
                    sl = st.get_slice(name)
                    shape = tuple(sl.get_shape())
                    if _is_block_weight(name, shape):
                        yield Matrix(f.name, name, np.ascontiguousarray(st.get_tensor(name), dtype=np.float32))
    elif p.suffix == ".gguf":
        from gguf import GGUFReader
        from gguf.quants import dequantize
        reader = GGUFReader(str(p))
        for t in reader.tensors:
            shape = tuple(int(v) for v in reversed(t.shape.tolist()))  # numpy order: (rows, row length)
            if _is_block_weight(t.name, shape):
                w = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
                yield Matrix(p.name, t.name, w)
    else:
        raise DiscoveryError(f"{p}: not a Hugging Face model folder or a .gguf file")


def file_records(paths: list[str]) -> list[dict]:
    """Name, size and sha256 of every input file (a folder's safetensors files)."""
    out = []
    for path in paths:
        p = Path(path)
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
        for f in files:
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 24), b""):
                    h.update(chunk)
            out.append({"input": str(path), "file": f.name, "size": f.stat().st_size, "sha256": h.hexdigest()})
    return out


def sample_groups(matrices: list[Matrix], max_groups: int, rng: np.random.Generator) -> np.ndarray:
    """A uniform sub-sample of all sub-groups (without replacement), shape (n, 16)."""
    counts = np.array([m.rows.size // GROUP for m in matrices], dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        raise DiscoveryError("the inputs hold no block weight matrices with rows of a multiple of 16")
    take = min(max_groups, total)
    picks = np.sort(rng.choice(total, size=take, replace=False))
    starts = np.concatenate([[0], np.cumsum(counts)])
    parts = []
    for i, m in enumerate(matrices):
        sel = picks[(picks >= starts[i]) & (picks < starts[i + 1])] - starts[i]
        if sel.size:
            parts.append(m.rows.reshape(-1, GROUP)[sel])
    return np.concatenate(parts).astype(np.float32)


def scale_groups(groups: np.ndarray) -> np.ndarray:
    """Step 1: each sub-group scaled so its largest magnitude is 127 (all-zero groups dropped)."""
    amax = np.abs(groups).max(axis=1)
    keep = amax > 0
    return groups[keep] * (127.0 / amax[keep])[:, None]


def histograms(scaled: np.ndarray, bins: int) -> np.ndarray:
    """Step 2: per sub-group, the normalised histogram of its scaled values."""
    edges = np.linspace(-127.5, 127.5, bins + 1)
    idx = np.clip(np.searchsorted(edges, scaled, side="right") - 1, 0, bins - 1)
    h = np.zeros((scaled.shape[0], bins), dtype=np.float64)
    np.add.at(h, (np.repeat(np.arange(scaled.shape[0]), scaled.shape[1]), idx.ravel()), 1.0)
    return h / scaled.shape[1]


def to_int8_codebook(centroids: np.ndarray) -> list[int]:
    """Centroids rounded to int8, sorted; a duplicate after rounding is moved one step apart."""
    v = sorted(int(np.clip(np.rint(c), -127, 127)) for c in centroids)
    for i in range(1, len(v)):
        if v[i] <= v[i - 1]:
            v[i] = v[i - 1] + 1
    if v[-1] > 127:
        raise DiscoveryError(f"codebook {v} does not fit int8")
    return v


def discover_codebooks(scaled: np.ndarray, n_codebooks: int, n_entries: int, bins: int, seed: int,
                       progress: bool = False) -> dict:
    """Steps 2-4 on already scaled sub-groups: the codebooks (sorted int8), cluster sizes and the
    k-means inertias, for one code width."""
    from threadpoolctl import threadpool_limits

    hist = histograms(scaled, bins)
    with threadpool_limits(1):  # one thread: the same sums in the same order on every machine
        return _discover(scaled, hist, n_codebooks, n_entries, seed, progress)


def _discover(scaled: np.ndarray, hist: np.ndarray, n_codebooks: int, n_entries: int, seed: int, progress: bool) -> dict:
    from sklearn.cluster import KMeans
    from tqdm import tqdm

    km = KMeans(n_clusters=n_codebooks, n_init=4, random_state=seed).fit(hist)
    rng = np.random.default_rng(seed)
    books, sizes, inertias = [], [], []
    for c in tqdm(range(n_codebooks), desc=f"{n_entries}-entry codebooks", disable=not progress):
        values = scaled[km.labels_ == c].ravel()
        if values.size > MAX_VALUES_PER_CLUSTER:
            values = rng.choice(values, size=MAX_VALUES_PER_CLUSTER, replace=False)
        kv = KMeans(n_clusters=n_entries, n_init=4, random_state=seed).fit(values.reshape(-1, 1).astype(np.float64))
        books.append(to_int8_codebook(kv.cluster_centers_.ravel()))
        sizes.append(int((km.labels_ == c).sum()))
        inertias.append(float(kv.inertia_ / values.size))
    order = sorted(range(n_codebooks), key=lambda i: books[i])  # a canonical order, independent of k-means' labels
    return {"codebooks": [books[i] for i in order], "cluster_groups": [sizes[i] for i in order],
            "value_mse": [inertias[i] for i in order], "histogram_inertia": float(km.inertia_)}


def discover(inputs: list[str], max_groups: int = DEFAULT_MAX_GROUPS, bins: int = DEFAULT_BINS,
             seed: int = DEFAULT_SEED, command: list[str] | None = None, progress: bool = False,
             hash_inputs: bool = True) -> dict:
    """Algorithm 1 over the block weights of ``inputs``: the CB2 and CB3 tables with provenance."""
    import sklearn
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    matrices: list[Matrix] = []
    for path in inputs:
        for m in tqdm(iter_matrices(path), desc=f"reading {Path(path).name}", disable=not progress, unit=" tensors"):
            if not np.isfinite(m.rows).all():
                raise DiscoveryError(f"{m.source}: tensor {m.name} holds NaN or infinite values")
            matrices.append(m)
    groups = sample_groups(matrices, max_groups, rng)
    scaled = scale_groups(groups)
    types = {}
    for bits, (n_cb, n_entries) in SHAPES.items():
        types[f"CB{bits}"] = {"code_bits": bits, "n_codebooks": n_cb, "n_entries": n_entries,
                              **discover_codebooks(scaled, n_cb, n_entries, bins, seed, progress)}
    from .builtin import TABLES_VERSION
    return {
        "format": 1,
        "tables_version": TABLES_VERSION,
        "algorithm": "Arm group-wise codebooks, Algorithm 1 (ggml_ext.codebooks.discover)",
        "types": types,
        "provenance": {
            "inputs": file_records(inputs) if hash_inputs else [{"input": str(p)} for p in inputs],
            "command": command if command is not None else sys.argv,
            "seed": seed, "max_groups": max_groups, "bins": bins, "group": GROUP,
            "groups_total": int(sum(m.rows.size // GROUP for m in matrices)),
            "groups_used": int(scaled.shape[0]), "tensors": len(matrices),
            "sklearn": sklearn.__version__, "numpy": np.__version__, "python": platform.python_version(),
        },
    }


def tables_of(result: dict) -> dict[str, list[list[int]]]:
    """Just the tables: type name -> codebooks (what a reproducibility check compares)."""
    return {name: t["codebooks"] for name, t in result["types"].items()}


def dumps(result: dict) -> str:
    return json.dumps(result, indent=1, sort_keys=False) + "\n"
