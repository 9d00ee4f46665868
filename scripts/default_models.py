#!/usr/bin/env python3
"""GGUF files of the default model (SmolLM2-135M-Instruct), cached by recipe.

What each file is, by the type asked for (case does not matter):

* f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_0_4_4, q4_0_4_8, q4_0_8_8:
  `ggml-ext convert` of the dequantized HF folder (asset smollm2-hf); the quantized
  blocks are ggml's own quantize functions (libggml-base), the interleaved Q4_0 ones
  ggml's Q4_0 rounding interleaved by ggml-ext;
* iq4_nl_4_4, iq4_nl_4_8, iq4_nl_8_8: `ggml-ext convert` too, so ggml-ext's IQ4_NL
  quantizer (exact scale search), interleaved;
* IQ4_NL and every other llama.cpp type (Q4_K_M, ...): our `llama-quantize` from the f16
  file above, i.e. ggml's quantizer and llama.cpp's mix for that file type. So
  `default_model("IQ4_NL")` is the stock IQ4_NL reference; `ggml-ext convert --type
  iq4_nl` (not made here) would be ggml-ext's quantizer;
* `repacked(ftype, layout)`: `ggml-ext repack --layout LAYOUT` of `default_model(ftype)`
  (Q4_0 or IQ4_NL): the very same weights, interleaved.

Files live in <cache>/models/ as NAME-TYPE-KEY.gguf with a sidecar NAME-TYPE-KEY.json.
KEY is a hash of the recipe: the tool (ggml-ext convert, llama-quantize or ggml-ext repack),
its arguments, the imatrix, the ggml-ext version and llama.cpp commit of the build
(ggml_ext.build_info), a digest of the tool's code (its Python modules and the compiled
libraries or binary it runs) and the sha256 of the source file(s). A changed recipe, tool
or source therefore makes a new file instead of reusing an old one; the sidecar says what
the file is and is checked on reuse; files of the same type with another key are removed
when a new one is made. Every file is written atomically (ggml_ext._atomic).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch_llama_cpp  # noqa: E402  (scripts/: one sha256 helper)
from ggml_ext import _atomic, _locate, assets, build_info, cache, tools  # noqa: E402
from ggml_ext.convert import TYPES, convert  # noqa: E402

NAME = "SmolLM2-135M-Instruct"
KEY_CHARS = 12
_PKG = Path(_atomic.__file__).resolve().parent  # the ggml_ext package (installed or python/)


def models_dir() -> Path:
    d = cache.cache_root() / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---------------------------------------------------------------- recipe parts

@lru_cache(maxsize=None)
def _sha256_of(path: str, *stat_key: int) -> str:
    return fetch_llama_cpp.sha256_of(Path(path))


def sha256_file(path: Path) -> str:
    """sha256 of a file, hashed once per process while its inode, size and times stay."""
    st = os.stat(path)
    return _sha256_of(str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def source(path: Path) -> dict[str, Any]:
    """A source of a recipe: its name and the sha256 of its bytes (every file, for a folder)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        return {"folder": path.name, "files": {str(p.relative_to(path)): sha256_file(p) for p in files}}
    return {"file": path.name, "sha256": sha256_file(path)}


def _code_sha256(files: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def _libs(*names: str) -> list[Path]:
    return [_locate.library(n) for n in names]


def _all_libs() -> list[Path]:
    return sorted(p for p in _locate.lib_dir().iterdir()
                  if p.is_file() and (".so" in p.name or p.suffix in (".dylib", ".dll")))


def _modules(*names: str) -> list[Path]:
    return [_PKG / f"{n}.py" for n in names]


def _converter_files() -> list[Path]:
    from ggml_ext import converters
    return sorted(Path(converters.__file__).resolve().parent.glob("*.py"))


# What each tool's output depends on, besides its arguments and sources.
TOOL_FILES: dict[str, Callable[[], list[Path]]] = {
    "ggml-ext convert": lambda: [*_converter_files(), *_modules("convert", "quants", "calibrate/imatrix", "formats/__init__", "formats/typeinfo",
                                                                "gguf/writer"),
                                 *sorted((_PKG / "methods").glob("*.py")), *_libs("ggml-base")],
    "ggml-ext repack": lambda: [*_modules("repack", "gguf/reader", "quants", "targets", "formats/__init__", "formats/typeinfo"),
                                *_libs("ggml-base")],
    "ggml_ext.quants": lambda: [*_modules("quants", "calibrate/imatrix", "gguf/reader", "formats/__init__", "formats/typeinfo"), *_libs("ggml-base")],
    # our llama.cpp tools: the binary and every library of the build (the tools are thin mains
    # over lib<tool>-impl, libllama-common, libllama and the ggml libraries)
    "llama-quantize": lambda: [_locate.tool("llama-quantize"), *_all_libs()],
    "llama-imatrix": lambda: [_locate.tool("llama-imatrix"), *_all_libs(), *_modules("calibrate/imatrix")],
}


@lru_cache(maxsize=None)
def _build() -> tuple[str, str]:
    b = build_info.get()
    return b.ggml_ext, b.llama_cpp_commit


def tool(name: str, extra_files: Iterable[Path] = ()) -> dict[str, Any]:
    """The tool part of a recipe: name, the build's ggml-ext version and llama.cpp commit,
    and a digest of the code it runs (TOOL_FILES[name], plus extra_files)."""
    version, commit = _build()
    files = [*TOOL_FILES[name](), *extra_files] if name in TOOL_FILES else list(extra_files)
    return {"tool": name, "ggml_ext": version, "llama_cpp_commit": commit, "code_sha256": _code_sha256(files)}


def recipe_key(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:KEY_CHARS]


# ---------------------------------------------------------------- the cache

def cached(stem: str, what: str, recipe: dict[str, Any], make: Callable[[Path], Any], folder: Path | None = None,
           suffix: str = ".gguf") -> Path:
    """<folder>/<stem>-<key><suffix> for this recipe, made by make(path) unless it is there
    with a sidecar <stem>-<key>.json holding the same recipe. `what` (one line: which tool made
    the file from what) goes into the sidecar. Returns the file's path."""
    folder = folder or models_dir()
    key = recipe_key(recipe)
    out = folder / f"{stem}-{key}{suffix}"
    sidecar = out.with_suffix(".json")
    try:
        if out.is_file() and json.loads(sidecar.read_text())["recipe"] == recipe:
            return out
    except (OSError, ValueError, KeyError):
        pass
    print(f"[default_models] making {out.name}: {what}", file=sys.stderr, flush=True)
    make(out)
    _atomic.write_json(sidecar, {"file": out.name, "what": what, "key": key, "recipe": recipe,
                                 "sha256": sha256_file(out)})
    _remove_other_keys(folder, stem, suffix, keep=out)
    return out


def _remove_other_keys(folder: Path, stem: str, suffix: str, keep: Path) -> None:
    """Files of the same stem with another key (an older recipe), and the name-only file of
    versions before the key: superseded. A concurrent maker of another recipe only loses its
    file to the next call (which makes it again)."""
    pat = re.compile(re.escape(stem) + rf"(-[0-9a-f]{{{KEY_CHARS}}})?({re.escape(suffix)}|\.json)", re.IGNORECASE)
    for p in folder.iterdir():
        if pat.fullmatch(p.name) and p.with_suffix("") != keep.with_suffix(""):
            with contextlib.suppress(OSError):
                p.unlink()


def describe(path: Path) -> dict[str, Any]:
    """The sidecar of a cached file: file, what, key, recipe, sha256."""
    return json.loads(Path(path).with_suffix(".json").read_text())


def label(path: Path) -> str:
    """The type part of a cached default-model file's name, without the model and the key:
    'Q4_0', 'Q4_0-repack-8x8'."""
    stem = Path(path).stem
    stem = stem[len(NAME) + 1:] if stem.startswith(NAME + "-") else stem
    return re.sub(rf"-[0-9a-f]{{{KEY_CHARS}}}$", "", stem)


# ---------------------------------------------------------------- the default model

def default_model(ftype: str = "f16") -> Path:
    """Path of the default model at `ftype` (f16, Q8_0, Q4_0, IQ4_NL, Q4_K_M, ...), made on first use;
    the module docstring says which tool makes which type."""
    if ftype.lower() in TYPES and ftype.lower() != "iq4_nl":
        t = ftype.lower()
        hf = assets.path("smollm2-hf")
        recipe = {"model": NAME, "type": t, **tool("ggml-ext convert"), "args": ["--type", t], "imatrix": None,
                  "source": source(hf)}
        what = (f"ggml-ext convert --type {t} of the HF folder smollm2-hf"
                + (" (ggml-ext's IQ4_NL quantizer)" if t.startswith("iq4_nl") else
                   " (ggml's quantize functions)" if t not in ("f32", "f16", "bf16") else ""))
        return cached(f"{NAME}-{t.upper()}", what, recipe, lambda out: convert(hf, out, t, force=True))
    t = ftype.upper()
    f16 = default_model("f16")
    recipe = {"model": NAME, "type": t, **tool("llama-quantize"), "args": [t], "imatrix": None, "source": source(f16)}

    def make(out: Path) -> None:
        with _atomic.output_path(out) as tmp:
            subprocess.run([*tools.command("llama-quantize"), str(f16), str(tmp), t], env=tools.tool_env(),
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    return cached(f"{NAME}-{t}", f"our llama-quantize {t} of {f16.name} (ggml's quantizer, llama.cpp's mix)",
                  recipe, make)


GEMMA = "gemma-3-270m"  # the quality baseline's HF folder (asset gemma3-hf), the largest model the assets have


def gemma_model(ftype: str = "q4_0") -> Path:
    """`ggml-ext convert --type FTYPE` of the HF folder gemma3-hf (Gemma-3-270M dequantized), made on first use."""
    t = ftype.lower()
    hf = assets.path("gemma3-hf")
    recipe = {"model": GEMMA, "type": t, **tool("ggml-ext convert"), "args": ["--type", t], "imatrix": None,
              "source": source(hf)}
    return cached(f"{GEMMA}-{t.upper()}", f"ggml-ext convert --type {t} of the HF folder gemma3-hf", recipe,
                  lambda out: convert(hf, out, t, force=True))


def repacked(ftype: str = "Q4_0", layout: str = "8x8", model: str = NAME) -> Path:
    """default_model(ftype) (Q4_0 or IQ4_NL; gemma_model(ftype) with model=GEMMA) through `ggml-ext repack
    --layout LAYOUT`: the very same weights, interleaved (a `convert --type q4_0_8_8` file matches the Q4_0
    one only because both come from the same converter; `convert --type iq4_nl_8_8` is ggml-ext's
    quantizer, unlike default_model("IQ4_NL"))."""
    from ggml_ext import repack
    ftype = ftype.upper()
    src = default_model(ftype) if model == NAME else gemma_model(ftype)
    recipe = {"model": model, "type": f"{ftype}-repack-{layout}", **tool("ggml-ext repack"),
              "args": ["--layout", layout], "imatrix": None, "source": source(src)}
    return cached(f"{model}-{ftype}-repack-{layout}", f"ggml-ext repack --layout {layout} of {src.name}", recipe,
                  lambda out: repack.repack(src, out, layout, force=True))


def repacked_q4_0(layout: str = "8x8") -> Path:
    """repacked("Q4_0", layout)."""
    return repacked("Q4_0", layout)


if __name__ == "__main__":
    for t in sys.argv[1:] or ["f16"]:
        p = default_model(t)
        print(p, "--", describe(p)["what"])
