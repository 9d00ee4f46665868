"""Runs under qemu-aarch64-static, several at once: the Arm tests (test_arm_e2e.py, test_dist.py) start every
qemu run of a module together, one per core, and let each test read its own result."""
from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor


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
