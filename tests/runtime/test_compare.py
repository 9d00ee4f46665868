"""`ggml-ext compare` end to end on the default model, at small scale: files, KLD, reports, resume, atomicity.

Three formats on SmolLM2-135M (asset smollm2-hf), 2 windows of 128 tokens of wiki-test: ours q8_0 and q2_k
(``ggml-ext convert``), and upstream's Q4_0 (the pristine build's llama-quantize with the imatrix; when
``make upstream`` has not been run, our build's llama-quantize stands in and that one check is skipped, by name).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from ggml_ext import compare as C

FORMATS = "q8_0,q2_k,upstream:Q4_0"
# The runs take the tools' defaults: runtime repack on, as users run them (--tool-args is tested by parsing).
TOOL_ARGS = ()


def _plan(out: Path, **kw) -> C.Plan:
    from ggml_ext import assets
    up = C.default_upstream_bin()
    return C.make_plan(assets.path("smollm2-hf"), out, C.parse_formats(kw.pop("formats", FORMATS)),
                       n_ctx=128, chunks=2, threads=2, imatrix_chunks=2, upstream_bin=up or "ours",
                       tool_args=TOOL_ARGS, **kw)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    plan = _plan(out)
    rows, files = C.compare(plan, progress=False)
    return plan, {r.format: r for r in rows}, files


def test_reports_exist_and_agree(matrix):
    plan, rows, files = matrix
    assert set(files) == {"csv", "md", "png"}
    assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(files["csv"], newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["format"] for r in table] == FORMATS.split(",")
    md = files["md"].read_text()
    for name in rows:
        assert f"| {name} |" in md
    for r in rows.values():
        assert r.ppl_base > 1 and r.ppl > 1 and 0 < r.same_top_pct <= 100 and r.kld_p99 >= r.kld_mean >= 0


def test_q8_0_is_closer_than_a_low_bit_type(matrix):
    _, rows, _ = matrix
    q8, q2 = rows["q8_0"], rows["q2_k"]
    assert q8.kld_mean < 0.1 * q2.kld_mean and q8.same_top_pct > q2.same_top_pct
    assert 8.4 < q8.bpw < 8.6 and q2.bpw < q8.bpw   # Q8_0 blocks: 34 bytes per 32 weights, norms in F32
    assert rows["upstream:Q4_0"].kld_mean < q2.kld_mean


def test_upstream_rows_ran_in_the_pristine_build(matrix):
    plan, rows, _ = matrix
    if plan.upstream_bin is None:
        pytest.skip("no pristine upstream build (`make upstream`): upstream's types were made by our build")
    assert rows["upstream:Q4_0"].runner == "pristine upstream" and rows["q8_0"].runner == "ours"


def test_resume_redoes_nothing(matrix, monkeypatch):
    plan, rows, _ = matrix
    before = {p.name: p.stat().st_mtime_ns for p in plan.out.iterdir() if p.suffix in (".gguf", ".kld", ".json")}
    assert sum(n.endswith(".gguf") for n in before) == 5  # reference, imatrix, three files

    def refuse(*a, **k):
        raise AssertionError("a cached step ran again")
    monkeypatch.setattr(C, "_run", refuse)
    import ggml_ext.convert
    monkeypatch.setattr(ggml_ext.convert, "convert", refuse)
    again, _ = C.compare(_plan(plan.out), progress=False)
    assert {r.format: (r.kld_mean, r.bpw) for r in again} == {k: (r.kld_mean, r.bpw) for k, r in rows.items()}
    after = {p.name: p.stat().st_mtime_ns for p in plan.out.iterdir() if p.suffix in (".gguf", ".kld", ".json")}
    assert after == before


def test_a_new_format_adds_only_its_own_steps(matrix, monkeypatch):
    plan, _, _ = matrix
    made = []
    real = C.make_file

    def spy(plan_, man, fmt, ref, im):
        made.append(fmt.spec)
        return real(plan_, man, fmt, ref, im)
    monkeypatch.setattr(C, "make_file", spy)
    steps = len(C.Manifest(plan.out).data["steps"])
    rows, _ = C.compare(_plan(plan.out, formats=FORMATS + ",q4_0"), progress=False)
    assert len(C.Manifest(plan.out).data["steps"]) == steps + 2  # its file and its measurement
    assert made == FORMATS.split(",") + ["q4_0"] and rows[-1].format == "q4_0"


def test_an_interrupted_write_leaves_no_partial_file(tmp_path):
    man = C.Manifest(tmp_path)

    def half_then_interrupt(tmp: Path):
        tmp.write_bytes(b"GGUF" + b"\0" * 1000)
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        C._step(man, {"step": "file", "spec": "x"}, "x", half_then_interrupt)
    assert os.listdir(tmp_path) == []          # neither the file nor its temporary, nor a manifest entry
    assert C.Manifest(tmp_path).data["steps"] == {}
    # a file whose size no longer matches the manifest is made again
    C._step(man, {"step": "file", "spec": "y"}, "y", lambda tmp: tmp.write_bytes(b"abc") and None)
    (name,) = [p for p in tmp_path.iterdir() if p.suffix == ".gguf"]
    name.write_bytes(b"ab")
    assert C.Manifest(tmp_path).done(C._key({"step": "file", "spec": "y"})) is None


def test_parse_kld_and_formats():
    log = ("Mean PPL(Q)                   :  10.000000 ±   0.1\nMean PPL(base)                :   9.500000 ±   0.1\n"
           "Mean    KLD:   0.012345 ±   0.000100\n99.0%   KLD:   0.200000\nSame top p: 93.500 ±  0.100 %\n")
    assert C.parse_kld(log) == {"ppl": 10.0, "ppl_base": 9.5, "kld_mean": 0.012345, "kld_p99": 0.2,
                                "same_top_pct": 93.5}
    assert C.parse_kld(log.replace("Same top p", "Other")) is None
    f = {x.spec: x for x in C.parse_formats("ours,upstream")}
    assert f["gptq:q3_k"].method == "gptq" and f["upstream:Q4_K_M"].origin == "upstream"
    assert f["anyprec:4"].run_args == ("--apq-bits", "4") and f["cb2"].method is None
    assert len(f) == len(C.OURS) + len(C.UPSTREAM_TYPES)
    kv = C.parse_formats("", kv=True)
    assert [k.spec for k in kv][:3] == ["f16", "q8_0", "q4_0"] and "nuq2+outliers" in {k.spec for k in kv}
    from ggml_ext import assets
    with pytest.raises(C.CompareError, match="at least 100"):
        C.make_plan(assets.path("smollm2-hf"), "unused", C.parse_formats("q8_0"), n_ctx=128, chunks=1)
    for bad in ("q9_9", "gptq:zz", "nope:q4_0", "anyprec:9"):
        with pytest.raises(C.CompareError):
            C.parse_formats(bad)
    with pytest.raises(C.CompareError):
        C.parse_formats("q4_0+outliers", kv=True)


def test_kv_caches_in_the_same_terms(tmp_path):
    """--kv on the reference: the f16 cache against itself is exact (up to the base file's 16-bit log-probabilities), q8_0 is closer than q4_0, bits per element
    are the cache types' own. (The nuq types need `calibrate kv`: minutes, left to the bench runs.)"""
    from ggml_ext import assets
    plan = C.make_plan(assets.path("smollm2-hf"), tmp_path, C.parse_formats("f16,q8_0,q4_0", kv=True), n_ctx=128,
                       chunks=2, threads=2, kv=True, tool_args=TOOL_ARGS)
    rows, files = C.compare(plan, progress=False)
    r = {x.format: x for x in rows}
    assert abs(r["f16"].kld_mean) < 1e-4 and r["f16"].same_top_pct == 100
    assert r["q8_0"].kld_mean < r["q4_0"].kld_mean
    assert (r["f16"].bpw, r["q8_0"].bpw, r["q4_0"].bpw) == (16.0, 8.5, 4.5)
    assert "bits/element" in files["md"].read_text()
    ref = next(p for p in plan.out.iterdir() if p.name.startswith("reference"))
    with pytest.raises(C.CompareError, match="KV calibration"):   # a GGUF alone cannot be calibrated
        C.make_plan(ref, tmp_path / "x", C.parse_formats("nuq3", kv=True), kv=True)


def test_our_files_do_not_depend_on_the_upstream_build(matrix, monkeypatch):
    """Building or moving the pristine build remakes upstream's files only."""
    plan, _, _ = matrix
    keys = {}

    def capture(man, recipe, name, make, suffix=".gguf"):
        keys.setdefault(name, set()).add(C._key(recipe))
        return {"file": "unused"}
    monkeypatch.setattr(C, "_step", capture)
    for up in ("ours", plan.out):   # our build standing in, and some other folder posing as the pristine build
        (plan.out / "llama-quantize").write_bytes(b"")
        p = _plan(plan.out)
        p.upstream_bin = None if up == "ours" else Path(up)
        for fmt in p.formats:
            C.make_file(p, None, fmt, plan.out / "ref.gguf", None)
    (plan.out / "llama-quantize").unlink()
    assert len(keys["q8_0"]) == len(keys["q2_k"]) == 1 and len(keys["upstream:Q4_0"]) == 2
