"""`make help` lists every target of the Makefile, and .PHONY names exactly the targets that have a rule
(a phony name with no rule would make `make NAME` fail with "No rule to make target")."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = REPO / "Makefile"


def _targets() -> set[str]:
    # rules a user types: lower-case names at the start of a line, not variable assignments (:=)
    return set(re.findall(r"^([a-z][a-z0-9-]*):(?!=)", MAKEFILE.read_text(), re.M))


def _phony() -> set[str]:
    return {w for line in re.findall(r"^\.PHONY:(.*)$", MAKEFILE.read_text(), re.M) for w in line.split()}


def test_phony_names_exactly_the_rules():
    assert _phony() == _targets()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_help_lists_every_target():
    r = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), "help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    listed = set(re.findall(r"^make (\S+) ", r.stdout, re.M))
    assert listed == _targets(), r.stdout
