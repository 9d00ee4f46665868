"""The built-in codebook tables: the committed JSON (discovery's output, with its provenance)
and the C header generated from it (``ggml_ext/src/formats/codebooks/codebooks_tables.h``).

The header is generated, never edited: ``ggml-ext codebooks header`` writes it from the JSON,
and tests/formats/test_codebooks.py checks the committed header is what the JSON generates.
A change of tables is a change of format: ``TABLES_VERSION`` goes up with it.
"""
from __future__ import annotations

import json
from pathlib import Path

#: the version of the built-in tables (bumped whenever the tables change: files made with
#: other tables decode to other values)
TABLES_VERSION = 1

#: where the JSON and the header live in a source checkout (the library compiles the header in; an
#: installed package has neither file)
FAMILY_DIR = Path("ggml_ext/src/formats/codebooks")
JSON_NAME = "codebooks_tables.json"
HEADER_NAME = "codebooks_tables.h"


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def header_text(result: dict, json_name: str = JSON_NAME) -> str:
    """The C header for discovery's ``result``: one int8 array per type, [codebook][entry]."""
    prov = result["provenance"]
    inputs = ", ".join(f"{Path(r['input']).name}/{r['file']} (sha256 {r['sha256'][:12]})" if "file" in r
                       else Path(r["input"]).name for r in prov["inputs"])
    lines = [
        f"// Generated from {json_name} by `ggml-ext codebooks header`: do not edit (docs/formats/codebooks.md).",
        f"// Discovery (Algorithm 1): seed {prov['seed']}, {prov['groups_used']} sub-groups of {prov['group']},",
        f"// {prov['bins']} histogram bins, scikit-learn {prov['sklearn']}; inputs: {inputs}.",
        "#pragma once",
        "",
        "#include <stdint.h>",
        "",
        f"#define GGML_EXT_CODEBOOKS_TABLES_VERSION {result.get('tables_version', TABLES_VERSION)}",
        "",
    ]
    for name, t in result["types"].items():
        n_cb, n_e = t["n_codebooks"], t["n_entries"]
        sym = name.lower()
        lines.append(f"// {name}: {n_cb} codebooks of {n_e} signed int8 entries, each sorted ascending;")
        lines.append(f"// weight = d * (local scale + 1) * table[codebook][code].")
        lines.append(f"#define GGML_EXT_{name}_N_CODEBOOKS {n_cb}")
        lines.append(f"#define GGML_EXT_{name}_N_ENTRIES   {n_e}")
        lines.append(f"static const int8_t ggml_ext_{sym}_tables[{n_cb}][{n_e}] = {{")
        for book in t["codebooks"]:
            lines.append("    { " + ", ".join(f"{v:4d}" for v in book) + " },")
        lines.append("};")
        lines.append("")
    return "\n".join(lines)


def builtin_json_path(root: str | Path) -> Path:
    """The committed tables JSON in the source checkout ``root``."""
    return Path(root) / FAMILY_DIR / JSON_NAME


def builtin_header_path(root: str | Path) -> Path:
    """The committed C header in the source checkout ``root``."""
    return Path(root) / FAMILY_DIR / HEADER_NAME
