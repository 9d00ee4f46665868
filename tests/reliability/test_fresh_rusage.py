"""ggml_ext.tools.fresh_rusage: a program started through it counts its peak RSS from its own use, not from
the high-water mark of the process that started it (Linux carries ru_maxrss across fork + exec). The fuzz
smoke tests depend on it: libFuzzer's -rss_limit_mb reads that count, and pytest may have held a model."""
from __future__ import annotations

import json
import subprocess
import sys

PARENT = r"""
import json, subprocess, sys
from ggml_ext.tools import fresh_rusage
x = bytearray(800 * 2**20)
x[::4096] = b"\1" * len(x[::4096])      # touch every page: an 800 MB high-water mark
del x
probe = [sys.executable, "-c",
         "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"]
direct = int(subprocess.run(probe, capture_output=True, text=True, check=True).stdout)
fresh = int(subprocess.run(fresh_rusage(probe), capture_output=True, text=True, check=True).stdout)
print(json.dumps({"direct_mb": direct, "fresh_mb": fresh}))
"""


def test_fresh_rusage_starts_the_peak_rss_count_afresh():
    r = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # a Python interpreter alone peaks at a few tens of MB; the parent's mark was 800 MB
    assert got["fresh_mb"] < 200, got
    print(f"\nchild peak RSS: started directly {got['direct_mb']} MB, through fresh_rusage {got['fresh_mb']} MB")
