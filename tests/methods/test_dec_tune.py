"""QDEC's tuner search (ggml_ext.qdec.tune; docs/QDEC.md "The tuner") on a deterministic cost model
of decode time, the stand-in for llama-bench on a GPU, which this machine does not have (the GPU run is
bench/device/device_dec.sh MODE=tune; the refusal without a GPU: tests/runtime/test_dec_llama.py). Checks the
search's contract: every chosen setting keeps its target, a larger target never gets less k, Phase 2 grows
the cheap types past the uniform k of Phase 1, the n_tb_max that hides the most wins, a type whose smallest
step already breaks a target is fixed at 0, n_tb values are the viable ones, and the configs round-trip."""
from __future__ import annotations

import itertools
import json

from ggml_ext.qdec import tune as T

SHAPES = {"qkv": (576, 576), "o": (576, 576), "gateup": (1536, 576), "down": (576, 1536)}


class CostModel:
    """Time per token: base + per type max(0, cost_t * k_t - hidden(n_tb)) (a knee per type: compensation
    under the base GEMV is free up to a slack that grows with n_tb up to 16, then shrinks a little)."""

    def __init__(self, cost, base=1e-3, slack=2e-6):
        self.cost, self.base, self.slack = cost, base, slack
        self.calls = 0

    def out_of_time(self):
        return False

    def time_per_token(self, k, ntb=None):
        self.calls += 1
        if k is None:
            return self.base
        t = self.base
        for ty, c in self.cost.items():
            hide = self.slack * min(ntb[ty], 16) * (1.0 if ntb[ty] <= 16 else 16.0 / ntb[ty])
            t += max(0.0, c * k[ty] - hide) if k[ty] else 0.0
        return t


def _slow(m, k, ntb):
    return 100.0 * (m.time_per_token(k, ntb) / m.base - 1.0)


def test_targets_hold_and_grow():
    m = CostModel({"qkv": 3e-7, "o": 2e-7, "gateup": 4e-7, "down": 1e-7})
    rep = T.tune(m, SHAPES, [2.5, 5, 10, 20], [2, 4, 8, 16, 32, 66])
    prev = None
    for target, c in rep["targets"].items():
        assert _slow(m, c["k"], c["n_tb"]) <= target + 1e-9
        assert abs(c["slowdown_pct"] - _slow(m, c["k"], c["n_tb"])) < 1e-9
        if prev:
            assert all(c["k"][t] >= prev["k"][t] for t in T.TYPES), (prev, c)
        prev = c
    # the cheapest type (down) ends above the uniform k of Phase 1
    c = rep["targets"][10]
    uniform = T.COARSE[c["phase1_steps"] - 1]
    assert c["k"]["down"] > uniform >= 4
    # Phase 1 kept the n_tb_max with the most uniform steps within the target
    steps = {p["n_tb_max"]: sum(1 for _ in itertools.takewhile(lambda q: q[1] <= 10, p["curve"]))
             for p in rep["phase1"] if not p["zero"]}
    assert steps[c["n_tb_max"]] == max(steps.values()) == c["phase1_steps"]
    for t, (M, K) in SHAPES.items():
        assert c["n_tb"][t] == T.viable_ntb(M, K, c["n_tb_max"]) <= c["n_tb_max"]


def test_expensive_small_type_is_zeroed():
    # o costs so much that even k 4 on it breaks 2.5 %: it is fixed at 0, the others still get k
    m = CostModel({"qkv": 1e-7, "o": 2e-5, "gateup": 1e-7, "down": 1e-7})
    shapes = dict(SHAPES, o=(64, 576))  # the smallest matrix
    rep = T.tune(m, shapes, [2.5], [4, 16])
    c = rep["targets"][2.5]
    assert c["zeroed"] == ["o"] and c["k"]["o"] == 0
    assert min(c["k"][t] for t in ("qkv", "gateup", "down")) > 0
    assert c["slowdown_pct"] <= 2.5


def test_viable_ntb():
    # Appendix A's example: 24 units, n = 7 needs only 6 blocks (4 units each): not viable
    assert 7 not in T._viable(24, 24) and {1, 2, 3, 4, 5, 6, 8, 12, 24} <= T._viable(24, 24)
    assert T.viable_ntb(6144, 4096, 7) == 7   # ceil(6144/32) = 192 units: 7 blocks of 28 use all 7
    assert T.viable_ntb(576, 576, 100) == 18  # ceil(576/32) = 18 units: 18 blocks at most


def test_configs_round_trip(tmp_path):
    m = CostModel({"qkv": 3e-7, "o": 2e-7, "gateup": 4e-7, "down": 1e-7})
    rep = T.tune(m, SHAPES, [5], [8, 16])
    (p,) = T.write_configs(rep, tmp_path, "base.gguf", "side.gguf")
    cfg = json.loads(p.read_text())
    assert cfg["format"] == "ggml-ext-dec-config" and p.name == "dec-5.json"
    c = rep["targets"][5]
    assert cfg["dec_k"] == ",".join(f"{t}={c['k'][t]}" for t in T.TYPES)
    assert cfg["dec_ntb"] == ",".join(f"{t}={c['n_tb'][t]}" for t in T.TYPES)
    assert json.loads((tmp_path / "tune.json").read_text())["targets"]["5"]["k"] == c["k"]
