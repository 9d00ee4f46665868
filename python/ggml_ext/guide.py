"""README's "Which format?" table, made from the format registry.

The registry (:func:`ggml_ext.formats.table`, ``ggml-ext info --types --json``) says each type's id,
bits per weight, family and whether stock llama.cpp reads it. What it cannot say is below, one entry
per type README lists: the CPU kernels per architecture (the names the family's implementation
tables in ``ggml_ext/src/x86`` and ``ggml_ext/src/arm`` carry, which ``ggml-ext info --types`` reports
for the CPU it runs on), whether a CUDA build runs it, how to get such a file, when to pick it, and
the section of docs/RESULTS.md that holds its figures.

    ggml-ext info --types --markdown      the table README carries between its marker comments

``tests/formats/test_which_format.py`` fails when README's copy and this module disagree, and checks the kernel
names against the C sources and against what this CPU dispatches.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Entry", "ENTRIES", "UPSTREAM", "BEGIN", "END", "markdown", "rows", "readme_table", "main"]

#: README's marker comments around the table
BEGIN = "<!-- which-format:begin (ggml-ext info --types --markdown; python -m ggml_ext.guide --write README.md) -->"
END = "<!-- which-format:end -->"

#: what the kernel columns say for a stock type: llama.cpp's own kernels run it
UPSTREAM = "llama.cpp's"


@dataclass(frozen=True)
class Entry:
    """One row of the guide: a registry type plus what the registry does not hold."""

    name: str                 # the registry's type name ("Q4_0_8_8")
    get: str                  # how to get such a file or cache (a command fragment)
    x86: tuple[str, ...]      # our CPU kernels on x86-64; () for stock types (llama.cpp's run them)
    arm: tuple[str, ...]      # our CPU kernels on aarch64; () for stock types
    cuda: str                 # what a GGML_EXT_CUDA=ON build does with it
    pick: str                 # when to pick it, and its headline figure
    results: str              # docs/RESULTS.md section heading it links to


#: The rows README shows, in order: weight types from largest to smallest, then the KV cache types.
ENTRIES: tuple[Entry, ...] = (
    Entry("Q8_0", "`convert --type q8_0`", (), (), "yes",
          "near-lossless 8-bit reference; the converter's bytes equal convert_hf_to_gguf.py's", "Converter"),
    Entry("Q4_K", "`convert --type q4_k`", (), (), "yes",
          "4-bit K-quant (every matrix Q4_K); `--method gptq` rounds into it too", "GPTQ and OOC"),
    Entry("Q4_0", "`convert --type q4_0` (`--method gptq --calib wiki-train`: closer to the model)",
          ("avx2", "avx512-vnni"), (), "yes",
          "any CPU; on x86 our kernels run it (runtime repack), 1.2x decode and 1.4-1.5x prefill "
          "vs upstream on a 2-core AVX2 EPYC; GPTQ's Q4_0 has mean KLD 0.029 on Qwen2.5-Coder-1.5B "
          "(llama-quantize's imatrix Q4_0 0.037; its 99th percentile is higher, 0.30 vs 0.26)", "Quality matrix: Qwen2.5-Coder-1.5B"),
    Entry("IQ4_NL", "`convert --type iq4_nl`", (), (), "yes",
          "Q4_0's size, closer to the model: our exact scale search gives mean KLD 0.021 on Qwen2.5-Coder-1.5B "
          "(llama-quantize's IQ4_NL 0.026, Q4_0 0.037, same imatrix)", "Quality matrix: Qwen2.5-Coder-1.5B"),
    Entry("Q4_0_4_4", "`convert --type q4_0_4_4` or `repack --layout 4x4`", ("avx2", "avx512-vnni"),
          ("neon-dotprod",), "yes, as Q4_0",
          "Arm with dotprod, no i8mm: Graviton2, Cortex-A76/A55 phones, Apple M1", "Interleaved Q4_0"),
    Entry("Q4_0_4_8", "`convert --type q4_0_4_8` or `repack --layout 4x8`", ("avx2", "avx512-vnni"),
          ("neon-dotprod", "neon-i8mm"), "yes, as Q4_0",
          "Arm with i8mm and 128-bit vectors: Graviton4, Cortex-A710+/X2+ phones, Apple M2+", "Interleaved Q4_0"),
    Entry("Q4_0_8_8", "`convert --type q4_0_8_8` or `repack --layout 8x8`", ("avx2", "avx512-vnni"),
          ("neon-dotprod", "neon-i8mm", "sve256-i8mm"), "yes, as Q4_0",
          "x86 (AVX2 / AVX-512) and Graviton3 (SVE-256); mmap-ed, no repack copy at load", "Interleaved Q4_0"),
    Entry("IQ4_NL_4_4", "`convert --type iq4_nl_4_4`", ("avx2", "avx512-vnni"), ("neon-dotprod",),
          "yes, as IQ4_NL", "IQ4_NL's quality on a dotprod Arm", "IQ4_NL"),
    Entry("IQ4_NL_4_8", "`convert --type iq4_nl_4_8`", ("avx2", "avx512-vnni"),
          ("neon-dotprod", "neon-i8mm"), "yes, as IQ4_NL", "IQ4_NL's quality on an i8mm Arm", "IQ4_NL"),
    Entry("IQ4_NL_8_8", "`convert --type iq4_nl_8_8`", ("avx2", "avx512-vnni"),
          ("neon-dotprod", "neon-i8mm"), "yes, as IQ4_NL",
          "IQ4_NL's quality on AVX-512 x86 (on AVX2-only CPUs keep the stock IQ4_NL file)", "IQ4_NL"),
    Entry("Q3_K", "`convert --type q3_k --method gptq --calib wiki-train`", (), (), "yes",
          "3-bit file any llama.cpp reads; GPTQ beats llama-quantize's imatrix Q3_K_S (Qwen2.5-Coder-1.5B mean KLD 0.100 vs 0.138)", "GPTQ and OOC"),
    Entry("Q2_K", "`convert --type q2_k --method gptq --calib wiki-train`", (), (), "yes",
          "2-bit file any llama.cpp reads; GPTQ's all-Q2_K file is on the front on Qwen2.5-Coder-1.5B (mean KLD "
          "0.42 at 3.14 bits a weight; IQ2_S 0.51 at 2.96; llama-quantize's Q2_K mix: 0.32 at 3.36)",
          "Quality matrix: Qwen2.5-Coder-1.5B"),
    Entry("CB3", "`convert --type cb3` (or `cb3_m`) `--calib wiki-train`", ("avx2",), ("neon-dotprod",), "yes",
          "3-bit on a GPU: Q3_K's size, decodes 1.2x Q3_K on an H100; on Qwen2.5-Coder-1.5B level with "
          "llama-quantize's imatrix Q3_K_S (mean KLD 0.130 vs 0.138) and behind GPTQ into Q3_K (0.100)",
          "Quality matrix: Qwen2.5-Coder-1.5B"),
    Entry("CB2", "`convert --type cb2` (or `cb2_m`) `--calib wiki-train`", ("avx2",), ("neon-dotprod",), "yes",
          "not recommended: off the front on Qwen2.5-Coder-1.5B (mean KLD 0.99 at 2.98 bits a weight; "
          "upstream's IQ2_XS 0.59 at 2.80, Q2_K 0.32 at 3.36): use IQ2_XS or Q2_K", "Quality matrix: Qwen2.5-Coder-1.5B"),
    Entry("APQ", "`convert --method anyprec --bits 3-8 --calib wiki-train`", ("avx2", "avx512"), ("neon",), "yes",
          "one file, precision 3..8 picked at run time (`--apq-bits B`: B bits per weight read of the 8 "
          "stored); 3 bits decodes at Q4_K's speed on an H100", "Any-precision"),
    Entry("NUQ4", "`calibrate kv`, then `-ctk nuq4 -ctv nuq4 --kv-calib FILE`", ("avx2",), ("neon",), "yes, cache in VRAM",
          "KV cache, 5 bits per value: +1.1-1.5 % perplexity at full context (upstream q4_0: +3.7-8.5 %)", "KVQuant"),
    Entry("NUQ3", "`calibrate kv`, then `-ctk nuq3 -ctv nuq3 --kv-calib FILE`", ("avx2",), ("neon",), "yes, cache in VRAM",
          "KV cache, 4 bits per value (q4_0: 4.5); with `--kv-outliers 0.01 --kv-sink 1` mean KLD 0.022 on "
          "Qwen2.5-Coder-1.5B, where upstream's q4_0 cache breaks the model (PPL 5,351)",
          "Quality matrix: Qwen2.5-Coder-1.5B"),
    Entry("NUQ2", "`calibrate kv`, then `-ctk nuq2 -ctv nuq2 --kv-calib FILE`", ("avx2",), ("neon",), "yes, cache in VRAM",
          "KV cache, 3 bits per value: +40-55 % perplexity, not usable", "KVQuant"),
)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    out = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return out.replace(" ", "-")


def rows(table: list[dict] | None = None) -> list[dict]:
    """The guide's rows: each entry joined with its registry row (``formats.table()`` by default)."""
    if table is None:
        from . import formats
        table = formats.table()
    by_name = {r["name"]: r for r in table}
    out = []
    for e in ENTRIES:
        r = by_name.get(e.name)
        if r is None:
            raise KeyError(f"the guide lists {e.name}, which the format registry does not have")
        stock = r["stock_readable"]
        out.append({
            "name": e.name, "id": r["id"], "bits_per_weight": r["bits_per_weight"], "stock_readable": stock,
            "family": r["family"], "get": e.get,
            "x86": ", ".join(e.x86) if e.x86 else UPSTREAM, "arm": ", ".join(e.arm) if e.arm else UPSTREAM,
            "cuda": e.cuda, "pick": e.pick, "results": f"docs/RESULTS.md#{_anchor(e.results)}",
            "results_title": e.results,
        })
    return out


def markdown(table: list[dict] | None = None) -> str:
    """The table README carries (``ggml-ext info --types --markdown``)."""
    head = ("| type | bits/weight | how to get it | x86 CPU kernels | Arm CPU kernels | NVIDIA GPU "
            "| stock llama.cpp reads it | pick it for | figures |")
    lines = [head, "| --- | ---: | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows(table):
        bpw = f"{r['bits_per_weight']:g}"
        lines.append(f"| `{r['name']}` | {bpw} | {r['get']} | {r['x86']} | {r['arm']} | {r['cuda']} "
                     f"| {'yes' if r['stock_readable'] else 'no'} | {r['pick']} "
                     f"| [{r['results_title']}]({r['results']}) |")
    return "\n".join(lines) + "\n"


def readme_table(text: str) -> str:
    """The table between README's marker comments (ValueError when they are missing)."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no table between {BEGIN!r} and {END!r}")
    return text[i + len(BEGIN):j].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m ggml_ext.guide [--write README.md | --check README.md]``: print the table, or
    put it between README's marker comments, or say whether README's copy is current."""
    import argparse
    from pathlib import Path
    p = argparse.ArgumentParser(prog="python -m ggml_ext.guide", description=main.__doc__)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="README", help="replace the table between the marker comments")
    g.add_argument("--check", metavar="README", help="exit 1 when the table differs")
    args = p.parse_args(argv)
    table = markdown()
    if not (args.write or args.check):
        print(table, end="")
        return 0
    path = Path(args.write or args.check)
    text = path.read_text()
    current = readme_table(text)
    if args.check:
        if current != table:
            print(f"{path}: the \"Which format?\" table is stale; run python -m ggml_ext.guide --write {path}")
            return 1
        return 0
    i, j = text.find(BEGIN) + len(BEGIN), text.find(END)
    path.write_text(text[:i] + "\n" + table + text[j:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
