"""bench/arm_instruction_counts.py runs and finds a multiply-accumulate loop in every kernel it counts (ours
from ggml_ext/src/arm/, upstream's from the pinned tree when it is there), from a cross build and its
disassembly: no Arm machine needed, skipped without the aarch64 cross GCC / objdump."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "arm_instruction_counts.py"

spec = importlib.util.spec_from_file_location("arm_instruction_counts", SCRIPT)
counts = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = counts  # its dataclasses look their module up
spec.loader.exec_module(counts)

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in counts.TOOLS),
    reason=f"{' and '.join(counts.TOOLS)} not installed (Debian: gcc-aarch64-linux-gnu, binutils-aarch64-linux-gnu)")

BASE, SVE = "armv8-a", "armv8.6-a+dotprod+i8mm+sve"


@pytest.fixture(scope="module")
def ggml():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_llama_cpp.py"), "tree"], capture_output=True, text=True)
    return Path(r.stdout.strip().splitlines()[-1]) / "ggml" if r.returncode == 0 else None


@pytest.fixture(scope="module")
def table(tmp_path_factory, ggml):
    kernels = [k for k in counts.KERNELS if k.source != "upstream" or ggml is not None]
    return counts.rows(kernels, [BASE, SVE], tmp_path_factory.mktemp("arm_counts"), ggml)


def _first(table, label, march):
    """The kernel's main row (its first) at this -march."""
    found = [r for r in table if r[1] == label and march in r[2].split(", ")]
    assert found, f"no row for {label} at {march}"
    return found[0]


def test_every_kernel_has_a_loop(table, ggml):
    for k in counts.KERNELS:
        if k.source == "upstream" and ggml is None:
            continue  # the pinned tree is not here: ours only
        r = _first(table, k.label, SVE)
        assert r[3].isdigit() and float(r[5].split(" / ")[0]) > 0, r
    if ggml is None:
        pytest.skip("the pinned llama.cpp tree is not available: upstream's kernels not counted")


def test_codebooks_need_dotprod(table):
    # the codebooks kernels are SDOT code: plain armv8-a has the generic C twin only
    assert "generic C" in _first(table, "ours CB2 (mm_cb2)", BASE)[3]
    assert "weight decode" in _first(table, "ours CB2 (mm_cb2)", SVE)[6]


def test_apq_path_follows_bits(table):
    # one unrolled plane loop; a wider code walks further through it for the same 32 MACs
    three = _first(table, "ours APQ GEMV, 3 bits", BASE)
    four = _first(table, "ours APQ GEMV, 4 bits", BASE)
    assert three[4] == four[4] == "32" and int(three[3]) < int(four[3])


def test_cli_prints_markdown(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--family", "anyprec", "--march", BASE], capture_output=True, text=True)
    if r.returncode != 0 and "pinned" in r.stderr:
        pytest.skip("the pinned llama.cpp tree is not available")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("| anyprec |")]
    assert len(lines) >= 3 and all(line.count("|") == 8 for line in lines), r.stdout
