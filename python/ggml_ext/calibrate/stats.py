"""`ggml-ext calibrate`: statistics of a model's linear-layer inputs over calibration text, cached.

    ggml-ext calibrate stats HF_DIR [--text FILE] [-o DIR] [--collect hessian,act_stats]
                                    [--samples 64] [--seq-len 512] [--device cpu] [--imatrix OUT.gguf]
    ggml-ext calibrate ls
    ggml-ext calibrate rm KEY... | --all

(The verb's ``kv`` and ``dec`` actions are the family packages' own: :mod:`ggml_ext.calibrate_cli`.)

The model runs one decoder layer at a time (:mod:`.stream`); what is collected is :mod:`.collect`'s.
Results go to a folder: one ``layer-NNN.safetensors`` per decoder layer (tensors
``<module>.<statistic>``, e.g. ``model.layers.3.mlp.down_proj.hessian``; no pickles) and a
``manifest.json`` saying what made them (model digest, text digest, samples, length, statistics, dtype,
ggml-ext version) and which layers are done. The folder is ``-o DIR`` or, by default, the cache
(``<cache>/calibration/<key>``, the key a digest of all of the above), where a later run with the same
inputs finds it. An interrupted run resumes: the layers already written are forwarded, not collected
again, and the result is the same as an uninterrupted run's. Each file is written to a temporary name
and renamed, so a folder never holds a half-written layer.

``--imatrix OUT.gguf`` also writes the per-column mean squared activations as an importance matrix in
llama-imatrix's GGUF format (tensor names of the converter's GGUF), which ``llama-quantize --imatrix``
and ``ggml-ext convert --imatrix`` read.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _atomic
from .collect import BACKWARD, COLLECTORS, Collector
from .data import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, tokenize

__all__ = ["Stats", "collect", "cache_dir", "list_cached", "remove_cached", "write_imatrix",
           "add_arguments", "main"]

MANIFEST = "manifest.json"
STATS_FORMAT = 1


def cache_dir() -> Path:
    from ggml_ext.cache import cache_root
    return cache_root() / "calibration"


@dataclass
class Stats:
    """The statistics of one model on one text: ``layer(i)`` loads a layer's tensors on demand."""

    folder: Path
    manifest: dict = field(default_factory=dict)

    @classmethod
    def open(cls, folder: str | os.PathLike) -> "Stats":
        folder = Path(folder)
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise FileNotFoundError(f"{folder}: not a calibration folder ({e})") from None
        return cls(folder, manifest)

    @property
    def complete(self) -> bool:
        layers = len(self.manifest.get("layers_done", [])) == self.manifest.get("n_layers", -1)
        return layers and ("fisher" not in self.manifest["inputs"]["collect"] or self.manifest.get("fisher_done", False))

    def layer(self, i: int) -> dict[str, dict[str, np.ndarray]]:
        """{module name: {statistic: array}} of decoder layer ``i``."""
        from safetensors.numpy import load_file
        flat = load_file(str(self.folder / f"layer-{i:03d}.safetensors"))
        out: dict[str, dict[str, np.ndarray]] = {}
        for key, v in flat.items():
            module, stat = key.rsplit(".", 1)
            if stat == "fisher" and module.endswith((".weight", ".bias")):  # <param>.fisher: under its module
                module, pname = module.rsplit(".", 1)
                stat = f"{pname}_fisher"
            out.setdefault(module, {})[stat] = v
        return out

    def outer(self) -> dict[str, np.ndarray]:
        """Fisher of the parameters outside the decoder layers (embeddings, final norm, head), by name."""
        from safetensors.numpy import load_file
        p = self.folder / "outer.safetensors"
        return {k[: -len(".fisher")]: v for k, v in load_file(str(p)).items()} if p.is_file() else {}

    def modules(self):
        """Every (module name, statistics) of every layer, in layer order."""
        for i in range(self.manifest["n_layers"]):
            yield from self.layer(i).items()


def _key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:24]


def collect(model_dir: str | os.PathLike, out: str | os.PathLike | None = None, text: str | None = None,
            what: tuple[str, ...] | list[str] = COLLECTORS, n_samples: int = DEFAULT_SAMPLES,
            seq_len: int = DEFAULT_SEQ_LEN, device: str = "cpu", dtype: str = "float32",
            progress: bool = True, stop_after: int | None = None) -> Stats:
    """Collect ``what`` for every linear layer of the model in ``model_dir``; see the module's text.

    ``stop_after``: stop once that many layers are written (tests of resuming; the folder is left
    incomplete, as an interrupt would leave it).
    """
    from ggml_ext import __version__
    from ggml_ext.converters.source import open_checkpoint

    what = tuple(sorted(set(what)))
    Collector(what)  # refuses unknown names before any work
    tokens = tokenize(model_dir, text, n_samples, seq_len)
    digest = open_checkpoint(model_dir).source_hash()
    inputs = {"format": STATS_FORMAT, "model_sha256": digest, "text_sha256": tokens.text_sha256,
              "n_samples": tokens.n_samples, "seq_len": tokens.seq_len, "collect": list(what), "dtype": dtype,
              "ggml_ext": __version__, "tokens_sha256": hashlib.sha256(tokens.ids.numpy().tobytes()).hexdigest()}
    key = _key(inputs)
    folder = Path(out) if out is not None else cache_dir() / key
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / MANIFEST
    manifest = None
    if manifest_path.is_file():
        old = json.loads(manifest_path.read_text())
        if old.get("inputs") == inputs:
            manifest = old
        elif out is not None:
            raise FileExistsError(f"{folder} holds calibration of other inputs (key {old.get('key')}); "
                                  f"choose another folder or remove it")
    from .stream import LayerStream
    stream = LayerStream(model_dir, device=device, dtype=dtype)
    if manifest is None:
        manifest = {"key": key, "inputs": inputs, "model_dir": str(Path(model_dir).resolve()),
                    "text": tokens.text_path, "n_layers": stream.n_layers, "layers_done": [],
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _atomic.write_json(manifest_path, manifest)
    done = set(manifest["layers_done"])
    forward_what = [w for w in what if w in COLLECTORS]
    if len(done) == stream.n_layers or not forward_what:
        done = set(range(stream.n_layers)) if not forward_what else done
        manifest["layers_done"] = sorted(done)
        if "fisher" in what and not manifest.get("fisher_done"):
            _collect_fisher(model_dir, tokens.ids, device, dtype, folder, manifest, stream.layers_name, progress)
        _atomic.write_json(manifest_path, manifest)
        return Stats(folder, manifest)
    collector = Collector(what)

    def hooks(i, layer, prefix):
        return None if i in done else collector.attach(i, layer, prefix)

    from safetensors.numpy import save
    written = 0
    for i, _layer, prefix in stream.run(tokens.ids, hooks=hooks, progress=progress):
        if i in done:
            continue
        flat = {}
        for module, stats in collector.take(prefix).items():
            for stat, v in stats.items():
                flat[f"{module}.{stat}"] = np.ascontiguousarray(np.asarray(v))
        _atomic.write_bytes(folder / f"layer-{i:03d}.safetensors", save(flat))
        manifest["layers_done"] = sorted(done | {i})
        done.add(i)
        _atomic.write_json(manifest_path, manifest)
        written += 1
        if stop_after is not None and written >= stop_after:
            return Stats(folder, manifest)
    if "fisher" in what and len(done) == stream.n_layers:
        _collect_fisher(model_dir, tokens.ids, device, dtype, folder, manifest, stream.layers_name, progress)
        _atomic.write_json(manifest_path, manifest)
    return Stats(folder, manifest)


def _collect_fisher(model_dir, ids, device, dtype, folder: Path, manifest: dict, layers_name: str,
                    progress: bool) -> None:
    """Fisher of every weight (``<param>.fisher``) and K/V outputs (``<module>.out_fisher``) into the layer
    files as each layer's reverse step ends, the parameters outside the layers into ``outer.safetensors``.
    One reverse pass, not resumable: an interrupt leaves ``fisher_done`` unset and the next run computes it
    again (activations spill to the folder's ``.spill``, removed after)."""
    from safetensors.numpy import load_file, save

    from .fisher import fisher_streamed

    def write(fname: str, results: dict) -> None:
        p = folder / fname
        flat = load_file(str(p)) if p.is_file() else {}
        flat = {k: v for k, v in flat.items() if not k.endswith("fisher")}  # a stale partial run's
        for name, v in results.items():
            flat[name if name.endswith(".out_fisher") else f"{name}.fisher"] = np.ascontiguousarray(v)
        _atomic.write_bytes(p, save(flat))

    spill = folder / ".spill"
    try:
        outer = fisher_streamed(model_dir, ids, device=device, dtype=dtype, spill_dir=spill, progress=progress,
                                on_layer=lambda i, res: write(f"layer-{i:03d}.safetensors", res))
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    assert not any(k.startswith(layers_name + ".") for k in outer)
    write("outer.safetensors", outer)
    manifest["fisher_done"] = True


def write_imatrix(stats: Stats, model_dir: str | os.PathLike, path: str | os.PathLike) -> int:
    """The act_stats of ``stats`` as a llama-imatrix GGUF file at ``path``; returns its entry count."""
    from ggml_ext.converters.archs import find_arch
    from ggml_ext.converters.source import open_checkpoint
    from ggml_ext.gguf.writer import GGUFWriter

    if "act_stats" not in stats.manifest["inputs"]["collect"]:
        raise ValueError(f"{stats.folder}: collected without act_stats, which an imatrix needs")
    if not stats.complete:
        raise ValueError(f"{stats.folder}: incomplete ({len(stats.manifest['layers_done'])} of "
                         f"{stats.manifest['n_layers']} layers); run the collection again to finish it")
    arch = find_arch(open_checkpoint(model_dir, weights=False).config)
    entries = []
    for module, st in stats.modules():
        name = arch.gguf_name(f"{module}.weight")
        if name is None or "sum_sq" not in st:
            continue
        entries.append((name, st["sum_sq"].astype(np.float32), float(np.asarray(st["rows"]).reshape(-1)[0])))
    inputs = stats.manifest["inputs"]
    w = GGUFWriter(path, force=True)
    w.add("general.type", "str", "imatrix")
    w.add("imatrix.datasets", "array[str]", [Path(stats.manifest.get("text", "")).name])
    w.add("imatrix.chunk_count", "u32", int(inputs["n_samples"]))
    w.add("imatrix.chunk_size", "u32", int(inputs["seq_len"]))
    F32 = 0
    for name, sums, _rows in entries:
        w.add_tensor_info(f"{name}.in_sum2", (sums.size, 1), F32, sums.nbytes)
        w.add_tensor_info(f"{name}.counts", (1, 1), F32, 4)
    with w:
        for _name, sums, rows in entries:
            w.write_tensor(sums.astype("<f4"))
            w.write_tensor(np.array([rows], dtype="<f4"))
    return len(entries)


def list_cached() -> list[Stats]:
    root = cache_dir()
    out = []
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if (d / MANIFEST).is_file():
                try:
                    out.append(Stats.open(d))
                except FileNotFoundError:
                    continue
    return out


def remove_cached(keys: list[str] | None) -> list[str]:
    """Remove the cached calibrations of ``keys`` (None: all); returns the keys removed."""
    removed = []
    for s in list_cached():
        if keys is None or s.folder.name in keys:
            shutil.rmtree(s.folder)
            removed.append(s.folder.name)
    return removed


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def add_stats_action(sub) -> None:
    """The ``stats`` action of ``ggml-ext calibrate`` on the verb's subparsers ``sub``."""
    s = sub.add_parser("stats", help="collect Hessians / activation statistics of a Hugging Face model")
    s.add_argument("model", help="Hugging Face model folder")
    s.add_argument("--text", default=None, help="calibration text: a file or an asset name (default wiki-train)")
    s.add_argument("-o", "--output", default=None, help="result folder (default: the cache, keyed by the inputs)")
    s.add_argument("--collect", default=",".join(COLLECTORS),
                   help=f"statistics to collect, comma-separated (default {','.join(COLLECTORS)}; choices "
                        f"{','.join(COLLECTORS + BACKWARD)}; fisher: squared gradients of the loss, a backward pass)")
    s.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help=f"samples (default {DEFAULT_SAMPLES})")
    s.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"tokens per sample (default {DEFAULT_SEQ_LEN})")
    s.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, ...")
    s.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="compute dtype of weights and activations (statistics accumulate in float64)")
    s.add_argument("--imatrix", default=None, metavar="OUT.gguf",
                   help="also write the importance matrix (llama-imatrix's GGUF format)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def add_cache_actions(sub) -> None:
    """The ``ls`` and ``rm`` actions of ``ggml-ext calibrate`` (the cached folders) on the verb's subparsers."""
    sub.add_parser("ls", help="list cached calibrations")
    r = sub.add_parser("rm", help="remove cached calibrations")
    r.add_argument("keys", nargs="*", help="keys as `calibrate ls` prints them")
    r.add_argument("--all", action="store_true", help="remove every cached calibration")


def main(args: argparse.Namespace) -> int:
    """Run the ``stats``, ``ls`` or ``rm`` action of ``ggml-ext calibrate``."""
    if args.action == "ls":
        for s in list_cached():
            i = s.manifest.get("inputs", {})
            state = "complete" if s.complete else f"{len(s.manifest.get('layers_done', []))}/{s.manifest.get('n_layers')} layers"
            print(f"{s.folder.name}  {state}  {_size(s.folder) / 2**20:.1f} MiB  {s.manifest.get('model_dir')}  "
                  f"{Path(s.manifest.get('text', '')).name}  {i.get('n_samples')}x{i.get('seq_len')}  "
                  f"{','.join(i.get('collect', []))}")
        return 0
    if args.action == "rm":
        if not args.all and not args.keys:
            print("calibrate rm: name keys, or --all", file=sys.stderr)
            return 2
        removed = remove_cached(None if args.all else args.keys)
        missing = [] if args.all else sorted(set(args.keys) - set(removed))
        for k in removed:
            print(f"removed {k}")
        for k in missing:
            print(f"calibrate rm: no cached calibration {k}", file=sys.stderr)
        return 1 if missing else 0
    what = [w.strip() for w in args.collect.split(",") if w.strip()]
    try:
        stats = collect(args.model, args.output, args.text, what, args.samples, args.seq_len, args.device,
                        args.dtype, progress=not args.quiet)
        print(f"calibration: {stats.folder}")
        if args.imatrix:
            n = write_imatrix(stats, args.model, args.imatrix)
            print(f"imatrix: {args.imatrix} ({n} entries)")
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 1
    return 0
