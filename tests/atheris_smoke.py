"""A short atheris run of one of tests/fuzz/fuzz_*.py, shared by the Python fuzz tests."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from ggml_ext.tools import fresh_rusage


def run(script: Path, seeds: Path, tmp_path: Path, seconds: int, args: list[str], label: str, on_crash: str,
        timeout_slack: int = 60) -> None:
    """Fuzz a copy of `seeds` for `seconds`: no crash, timeout or out-of-memory input, more than 1000 runs."""
    corpus = tmp_path / "corpus"
    shutil.copytree(seeds, corpus)
    n_seeds = len(list(corpus.iterdir()))
    # fresh_rusage: libFuzzer's -rss_limit_mb would otherwise count this test process's own peak
    r = subprocess.run(fresh_rusage([sys.executable, str(script), str(corpus), f"-max_total_time={seconds}", *args,
                                     "-print_final_stats=1", f"-artifact_prefix={tmp_path}/crash-"]),
                       capture_output=True, text=True, timeout=seconds + timeout_slack, cwd=tmp_path)
    crashes = sorted(tmp_path.glob("crash-*")) + sorted(tmp_path.glob("timeout-*")) + sorted(tmp_path.glob("oom-*"))
    log = r.stdout + r.stderr
    assert r.returncode == 0 and not crashes, (
        f"fuzzer found a crash ({[c.name for c in crashes]}): {on_crash}\n{log[-3000:]}")
    m = re.search(r"Done (\d+) runs in (\d+) second", log)
    assert m, log[-2000:]
    runs, secs = int(m.group(1)), int(m.group(2))
    grown = len(list(corpus.iterdir()))
    print(f"\natheris {label}: {runs} execs in {secs} s ({runs // max(secs, 1)}/s), "
          f"corpus {n_seeds} -> {grown}, 0 crashes")
    assert runs > 1000
