"""Runs under qemu-aarch64-static, several at once: the Arm tests (test_arm_e2e.py, test_dist.py) start every
qemu run of a module together, one per core, and let each test read its own result. And where an Arm test
program is built and run: cross-built and run under qemu on an x86-64 host, natively on an aarch64 one."""
from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

AARCH64_HOST = platform.machine() in ("aarch64", "arm64")
SYSROOT = "/usr/aarch64-linux-gnu"  # Debian's libc6-arm64-cross, installed with the cross compilers
QEMU_MAX = ["qemu-aarch64-static", "-cpu", "max", "-L", SYSROOT]
# -march extension -> the /proc/cpuinfo feature a native run of code built with it needs
_HWCAP = {"dotprod": "asimddp", "i8mm": "i8mm", "sve": "sve", "fp16": "fphp"}


def _host_features() -> set[str]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {f for line in info.splitlines() if line.startswith("Features") for f in line.split(":", 1)[1].split()}


def arm_target(march: str, qemu: list[str] = QEMU_MAX) -> tuple[str, list[str]]:
    """(C compiler, command prefix) that build an Arm test program for -march=march and run it: on an aarch64
    host the native gcc and nothing (skipped where this CPU lacks an extension the march names, as qemu's
    `-cpu max` has them all); elsewhere the cross gcc and ``qemu`` (skipped without them)."""
    if AARCH64_HOST:
        missing = sorted({_HWCAP[e] for e in march.split("+")[1:] if e in _HWCAP} - _host_features())
        if missing:
            pytest.skip(f"this aarch64 CPU lacks {', '.join(missing)} (-march={march}), which the qemu run has")
        return shutil.which("gcc") or "cc", []
    missing = [t for t in ("aarch64-linux-gnu-gcc", qemu[0]) if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (make system-deps: gcc-aarch64-linux-gnu, qemu-user-static)")
    return "aarch64-linux-gnu-gcc", list(qemu)


def run_parallel(jobs: dict[Hashable, tuple[Callable, ...]]) -> dict:
    """{key: (function, *args)} run one per core; {key: its result, or the exception it raised} (raised again
    by ``result`` in the test that reads it, so one failed run fails its own test only)."""
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {key: pool.submit(*job) for key, job in jobs.items()}
    results = {}
    for key, f in futures.items():
        try:
            results[key] = f.result()
        except BaseException as e:  # noqa: BLE001 - reported by the test that reads it
            results[key] = e
    return results


def result(results: dict, key):
    r = results[key]
    if isinstance(r, BaseException):
        raise r
    return r
