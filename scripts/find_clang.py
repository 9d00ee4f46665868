#!/usr/bin/env python3
"""The clang for the sanitizer/libFuzzer builds: the newest installed clang-N (then plain
`clang`) whose clang++ sits beside it and that links a program with
-fsanitize=fuzzer,address,undefined (which needs its runtimes: Debian's libclang-rt-N-dev).
$GGML_EXT_CLANG (a clang path; its clang++ beside it) is tried first when set.

    find_clang.py        prints "CLANG CLANG++" and exits 0, or says why not and exits 1

The Makefile runs it (system Python, no packages) to decide whether to install Debian's
`clang` and `libclang-rt-dev` (the distribution's default version, with matching runtimes);
tests/fuzz/fuzz_gguf_c.py and the atheris build use find_clang().
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

PROBE = "int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void) d; (void) n; return 0; }\n"


def candidates() -> list[str]:
    """clang-N on PATH, newest N first, then clang."""
    found: dict[int, str] = {}
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = os.listdir(d or ".")
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r"clang-(\d+)", name)
            if m and int(m.group(1)) not in found and shutil.which(name):
                found[int(m.group(1))] = name
    return [found[v] for v in sorted(found, reverse=True)] + ["clang"]


def links_libfuzzer(cc: str) -> str | None:
    """None when `cc -fsanitize=fuzzer,address,undefined` links a fuzz target, else why not."""
    with tempfile.TemporaryDirectory(prefix="find-clang-") as tmp:
        try:
            r = subprocess.run([cc, "-x", "c", "-", "-fsanitize=fuzzer,address,undefined", "-o",
                                os.path.join(tmp, "probe")], input=PROBE, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][-200:]


def _cxx_for(cc: str) -> str | None:
    d, name = os.path.split(cc)
    cxx = name.replace("clang", "clang++", 1)
    return shutil.which(os.path.join(d, cxx)) if d else shutil.which(cxx)


def find_clang() -> tuple[str, str]:
    """(clang, clang++) paths; LookupError naming every candidate and why it failed."""
    tried = []
    names = ([os.environ["GGML_EXT_CLANG"]] if os.environ.get("GGML_EXT_CLANG") else []) + candidates()
    for name in names:
        cc = shutil.which(name)
        if not cc:
            continue
        cxx = _cxx_for(cc)
        why = "no clang++ beside it" if not cxx else links_libfuzzer(cc)
        if why is None:
            return cc, cxx
        tried.append(f"{name}: {why}")
    raise LookupError("no clang that links -fsanitize=fuzzer,address,undefined"
                      + (f" (tried {'; '.join(tried)})" if tried else " (none installed)")
                      + "; Debian: apt-get install clang libclang-rt-dev (what `make system-deps` does)")


if __name__ == "__main__":
    try:
        print(*find_clang())
    except LookupError as e:
        print(f"find_clang: {e}", file=sys.stderr)
        sys.exit(1)
