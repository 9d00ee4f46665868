"""The calibration engine (ggml_ext.calibrate): statistics streamed one decoder layer at a time equal those
of the whole model run at once with hooks, on every converter architecture and on the default model (GQA);
an interrupted collection resumes to the same bytes; the importance matrix it writes reads back."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import convert_support as cs  # noqa: E402
from ggml_ext.calibrate import imatrix, stats  # noqa: E402
from ggml_ext.calibrate.collect import Collector, CalibrationError, quantiles  # noqa: E402
from ggml_ext.calibrate.stream import LayerStream  # noqa: E402


def _reference(model_dir, tokens) -> dict:
    """The same statistics from the whole model in memory, hooks on every decoder layer's Linears."""
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stream_layers = LayerStream(model_dir)  # only for the layer list's name
    layers = m.get_submodule(stream_layers.layers_name)
    ref = Collector()
    for i, layer in enumerate(layers):
        ref.attach(i, layer, f"{stream_layers.layers_name}.{i}")
    with torch.no_grad():
        for row in tokens:
            m(input_ids=row[None], use_cache=False)
    return {name: {k: (v.cpu().numpy() if hasattr(v, "cpu") else np.asarray(v)) for k, v in r.items()}
            for name, r in ref.results.items()}


def _streamed(model_dir, tokens) -> dict:
    st = LayerStream(model_dir)
    col = Collector()
    out = {}
    for _i, _layer, prefix in st.run(tokens, hooks=col.attach, progress=False):
        out.update(col.take(prefix))
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        g, w = got[name], want[name]
        assert g["hessian_rows"] == w["hessian_rows"] and g["rows"] == w["rows"], name
        np.testing.assert_allclose(g["hessian"], w["hessian"], rtol=1e-6, atol=1e-9 * np.abs(w["hessian"]).max(),
                                   err_msg=name)
        for k in ("sum_abs", "sum_sq", "max_abs"):
            np.testing.assert_allclose(g[k], w[k], rtol=1e-6, atol=0, err_msg=f"{name} {k}")
        # a bin edge may separate two values that differ in the last bit: counts per channel stay equal
        assert (g["hist"].sum(1) == w["hist"].sum(1)).all()
        assert np.abs(g["hist"] - w["hist"]).sum() <= 2e-4 * w["hist"].sum() + 2, name


@pytest.mark.parametrize("arch", sorted(cs.ARCH_CLASSES))
def test_streamed_statistics_equal_the_whole_model_run(arch):
    """Every converter architecture (tiny random model): the exact per-layer arguments (masks, rotary
    embeddings, sliding windows) replayed layer by layer give the whole model's statistics."""
    model = cs.tiny(arch)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, 200, (3, 40), generator=g)
    _assert_same(_streamed(model, tokens), _reference(model, tokens))


def test_default_model_statistics_and_shapes():
    """SmolLM2 (9 query heads, 3 KV heads) on wiki-train: streamed == whole model; shapes per linear."""
    from ggml_ext.calibrate.data import tokenize
    model = cs.default_hf()
    tok = tokenize(model, "wiki-train", n_samples=2, seq_len=64)
    got = _streamed(model, tok.ids)
    _assert_same(got, _reference(model, tok.ids))
    q = got["model.layers.0.self_attn.q_proj"]
    assert q["hessian"].shape == (576, 576) and q["hessian_rows"] == 2 * 64
    assert got["model.layers.29.mlp.down_proj"]["hessian"].shape == (1536, 1536)
    h = q["hessian"]
    assert np.allclose(h, h.T) and np.linalg.eigvalsh(h).min() > -1e-6 * np.abs(h).max()
    qs = quantiles(q["hist"], [0.5, 0.99])
    assert (qs[:, 0] <= qs[:, 1]).all() and (qs[:, 1] >= q["max_abs"] / 2 ** 20).all()


def test_interrupted_collection_resumes_to_the_same_bytes(tmp_path):
    model = cs.tiny("llama")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"word{i} and more text" for i in range(3000)))
    a = stats.collect(model, tmp_path / "a", str(text), n_samples=3, seq_len=32, progress=False, stop_after=1)
    assert not a.complete and a.manifest["layers_done"] == [0]
    a = stats.collect(model, tmp_path / "a", str(text), n_samples=3, seq_len=32, progress=False)
    b = stats.collect(model, tmp_path / "b", str(text), n_samples=3, seq_len=32, progress=False)
    assert a.complete and b.complete
    for i in range(a.manifest["n_layers"]):
        f = f"layer-{i:03d}.safetensors"
        assert (a.folder / f).read_bytes() == (b.folder / f).read_bytes(), f
    ma, mb = (json.loads((s.folder / "manifest.json").read_text()) for s in (a, b))
    assert ma["inputs"] == mb["inputs"] and ma["key"] == mb["key"]
    # a folder of other inputs is refused, not mixed
    with pytest.raises(FileExistsError, match="other inputs"):
        stats.collect(model, tmp_path / "a", str(text), n_samples=2, seq_len=32, progress=False)


def test_imatrix_export_reads_back(tmp_path):
    model = cs.tiny("llama")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"token{i} text" for i in range(2000)))
    s = stats.collect(model, tmp_path / "c", str(text), n_samples=2, seq_len=32, progress=False)
    out = tmp_path / "m.imatrix"
    n = stats.write_imatrix(s, model, out)
    im = imatrix.load(out)
    assert n == len(im.entries) and "blk.0.attn_q.weight" in im.entries and "blk.1.ffn_down.weight" in im.entries
    st = s.layer(1)["model.layers.1.mlp.down_proj"]
    np.testing.assert_allclose(im.for_tensor("blk.1.ffn_down.weight", st["sum_sq"].size),
                               (st["sum_sq"] / st["rows"]).astype(np.float32), rtol=1e-6)


def test_bad_settings_are_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="unknown statistics"):
        Collector(["fisher_typo"])
    col = Collector()
    with pytest.raises(CalibrationError, match="non-finite"):
        col._accumulate("x", torch.tensor([[1.0, float("nan")]]))
    model = cs.tiny("llama")
    short = tmp_path / "short.txt"
    short.write_text("too short")
    with pytest.raises(ValueError, match="fewer than"):
        stats.collect(model, tmp_path / "d", str(short), n_samples=4, seq_len=64, progress=False)


def _assert_fisher_equal(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        w, g = want[k], got[k]
        assert g.shape == w.shape, k
        scale = np.abs(w).max()
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5 * scale + 1e-30, err_msg=k)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3", "phi3"])
def test_streamed_fisher_equals_autograd_on_the_whole_model(arch, tmp_path):
    """The layer-by-layer reverse pass (activations spilled to disk for gemma3) gives the whole model's
    per-sample squared gradients: every weight, the tied embedding's two parts, the K/V outputs."""
    from ggml_ext.calibrate.fisher import fisher_full, fisher_streamed
    model = cs.tiny(arch)
    tokens = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    want = fisher_full(model, tokens)
    got = fisher_streamed(model, tokens, spill_dir=tmp_path / "spill" if arch == "gemma3" else None, progress=False)
    _assert_fisher_equal(got, want)
    # phi3: the k and v parts of its fused qkv_proj, named as the attention's k_proj / v_proj
    assert any(k.endswith("k_proj.out_fisher") for k in got) and any(k.endswith("v_proj.out_fisher") for k in got)


def test_streamed_fisher_on_the_default_model():
    """SmolLM2 (tied embeddings, GQA): streamed == whole-model autograd."""
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.fisher import fisher_full, fisher_streamed
    model = cs.default_hf()
    tok = tokenize(model, "wiki-train", n_samples=2, seq_len=32)
    want = fisher_full(model, tok.ids)
    got = fisher_streamed(model, tok.ids, progress=False)
    _assert_fisher_equal(got, want)
    k = got["model.layers.0.self_attn.k_proj.out_fisher"]
    assert k.shape == (3 * 64,) and (k > 0).all()   # 3 KV heads x head_dim 64: pre-RoPE keys


def test_fisher_in_the_stats_folder(tmp_path):
    """`calibrate stats --collect ...,fisher`: the folder holds every weight's Fisher (layer files and
    outer.safetensors) equal to whole-model autograd on the same tokens."""
    from ggml_ext.calibrate.data import tokenize
    from ggml_ext.calibrate.fisher import fisher_full
    model = cs.tiny("qwen2")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"word{i} and more" for i in range(3000)))
    s = stats.collect(model, tmp_path / "f", str(text), what=("act_stats", "fisher"), n_samples=2, seq_len=24,
                      progress=False)
    assert s.complete and not (s.folder / ".spill").exists()
    want = fisher_full(model, tokenize(model, str(text), 2, 24).ids)
    got = dict(s.outer())
    for module, st in s.modules():
        for k, v in st.items():
            if k.endswith("_fisher") and k != "out_fisher":
                got[f"{module}.{k[:-len('_fisher')]}"] = v
            elif k == "out_fisher":
                got[f"{module}.out_fisher"] = v
    _assert_fisher_equal(got, want)


def test_imatrix_matches_llama_imatrix_and_llama_quantize_takes_it(tmp_path, threads, tool_env):
    """Our importance matrix of the default model on the same tokens as llama-imatrix (2 chunks of 256
    tokens from the start of the text, BOS first when the model adds one) is llama-imatrix's within the
    f16-vs-f32 difference of the two runs, and llama-quantize --imatrix accepts it."""
    import subprocess
    import sys
    from pathlib import Path

    from transformers import AutoTokenizer

    from ggml_ext import assets, tools
    from ggml_ext.gguf import read_gguf
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from default_models import default_model

    model = cs.default_hf()
    f16 = default_model("f16")
    text = tmp_path / "calib.txt"
    text.write_text(assets.path("wiki-train").read_text(encoding="utf-8")[:8000], encoding="utf-8")
    ref_file = tmp_path / "ref.imatrix"
    r = subprocess.run(tools.command("llama-imatrix", "-m", f16, "-f", text, "-o", ref_file, "--chunks", "2",
                                     "-c", "256", "--no-ppl", "-t", str(threads)),
                       env=tool_env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ref = imatrix.load(ref_file)
    # the same tokens: llama-imatrix tokenizes the whole text once and cuts consecutive chunks
    kv = read_gguf(f16).kv
    tok = AutoTokenizer.from_pretrained(model)
    ids = tok(text.read_text(encoding="utf-8"), add_special_tokens=False, return_tensors="pt").input_ids[0]
    if kv.get("tokenizer.ggml.add_bos_token", False):
        ids = torch.cat([torch.tensor([kv["tokenizer.ggml.bos_token_id"]]), ids])
    chunks = ids[:512].reshape(2, 256).clone()
    if kv.get("tokenizer.ggml.add_bos_token", False):
        chunks[:, 0] = kv["tokenizer.ggml.bos_token_id"]
    col = Collector(["act_stats"])
    st = LayerStream(model)
    for _i, _layer, prefix in st.run(chunks, hooks=col.attach, progress=False):
        pass
    from ggml_ext.converters.archs import find_arch
    from ggml_ext.converters.source import open_checkpoint
    arch = find_arch(open_checkpoint(model, weights=False).config)
    ours = {arch.gguf_name(f"{m}.weight"): (v["sum_sq"] / v["rows"]).cpu().numpy() for m, v in col.results.items()}
    assert set(ours) == set(ref.entries) - {"output.weight"}
    for name, want in ref.entries.items():
        if name == "output.weight":
            continue
        got, want = ours[name], want[0]
        rel = np.abs(got - want) / (np.abs(want) + 1e-3 * want.mean())
        assert np.median(rel) < 0.02 and np.corrcoef(got, want)[0, 1] > 0.999, name
    # llama-quantize takes the file stats.write_imatrix makes
    s = stats.collect(model, tmp_path / "s", str(text), what=("act_stats",), n_samples=2, seq_len=256, progress=False)
    ours_file = tmp_path / "ours.imatrix"
    stats.write_imatrix(s, model, ours_file)
    out = tmp_path / "q.gguf"
    q = subprocess.run(tools.command("llama-quantize", "--imatrix", ours_file, f16, out, "IQ4_NL", str(threads)),
                       env=tool_env, capture_output=True, text=True)
    assert q.returncode == 0, q.stdout[-2000:] + q.stderr[-2000:]
    assert "imatrix" in (q.stdout + q.stderr) and out.stat().st_size > 0


@pytest.mark.parametrize("name", ["smollm2-hf", "gemma3-hf"])
def test_calibration_samples_start_as_the_tokenizer_starts_text(name):
    """Gemma-3's tokenizer puts <bos> first although transformers 5 reports add_bos_token False; the
    samples must start with it too (Gemma without BOS is another model at long context: perplexity 678
    at 32K tokens). SmolLM2's tokenizer adds no BOS: its samples are plain text."""
    from transformers import AutoTokenizer

    from ggml_ext import assets
    from ggml_ext.calibrate.data import leading_bos, tokenize
    model = assets.path(name)  # `make test` fetches both (assets fetch --all)
    tok = AutoTokenizer.from_pretrained(model)
    first = tok("some text", add_special_tokens=True).input_ids[0]
    ids = tokenize(model, "wiki-train", n_samples=2, seq_len=16).ids
    if name == "gemma3-hf":
        assert first == tok.bos_token_id == 2 and leading_bos(tok) == 2
        assert (ids[:, 0] == 2).all()
    else:
        assert leading_bos(tok) is None and first != tok.bos_token_id
        assert not (ids[:, 0] == tok.bos_token_id).any()
