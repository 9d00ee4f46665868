"""`make help` lists every target of the Makefile, and .PHONY names exactly the targets that have a rule
(a phony name with no rule would make `make NAME` fail with "No rule to make target"); `make system-deps` installs
the cross toolchain and qemu on x86-64 hosts only."""
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


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize("host,cross", [("x86_64", True), ("aarch64", False), ("arm64", False)])
def test_system_deps_follow_the_host(host, cross):
    # an aarch64 host builds and tests Arm natively: no cross toolchain, no qemu to install
    r = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), "-n", "-B", f"HOST_ARCH={host}", "system-deps"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert ("gcc-aarch64-linux-gnu" in r.stdout) == cross and ("qemu-user-static" in r.stdout) == cross, r.stdout
    assert "ccache:ccache" in r.stdout and ("patch:patch gcc:gcc g++:g++;" in r.stdout) != cross, r.stdout
