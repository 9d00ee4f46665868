"""Every format over two GPUs against one GPU: llama-perplexity of the default model on one GPU (``-dev CUDA0``)
and over two (``-dev CUDA0,CUDA1``), by layers (``-sm layer``: whole layers and their KV cache per device) and
cut by tensors (``-sm tensor``: the meta backend splits each weight by rows or columns, an interleaved one by
whole groups of the rows it interleaves, patches 0102 / 0302).

* ``-sm layer``: the interleaved files (Q4_0_8_8 from the converter, Q4_0_4_4 repacked from it), CB2 (CB2 in
  ffn_down, IQ4_NL elsewhere), one any-precision file (3-8 bits) at 4 and at 8 bits, and NUQ4 / NUQ3 K and V
  caches (each layer's calibrated tables on the device that holds its cache) give one GPU's perplexity.
* ``-sm tensor``: the interleaved files and CB2 give one GPU's perplexity; APQ weights (a whole matrix's
  bitplanes) and NUQ caches (a binding holds one address) are refused at load with the way out.

Two GPUs of one build run the same kernels on the same values, so ``-sm layer`` differs from one GPU at most by
rounding; ``-sm tensor`` adds the two devices' partial sums of the column-cut weights in another order. A wrong
cut, a row group split across devices or a cache read with another layer's tables moves the perplexity by far
more (a per-row cut of an interleaved weight gave 2.3e7 instead of 17.8 through RPC).

Needs two CUDA devices in this build's ggml registry (a GGML_EXT_CUDA=ON build on a machine with two NVIDIA
GPUs): `make test-cuda` (scripts/test_cuda.sh) runs this file there; elsewhere it skips. The default model and
texts come from the asset store, or from --default-hf / --wiki-test / --wiki-train (tests/conftest.py) where
there is none.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import convert_support as cs
from ggml_ext import tools

pytestmark = pytest.mark.cuda

CTX, CHUNKS = 512, 4
ONE, TWO = "CUDA0", "CUDA0,CUDA1"
MODES = {"one": ["-dev", ONE], "layer": ["-dev", TWO, "-sm", "layer"], "tensor": ["-dev", TWO, "-sm", "tensor"]}
# -sm layer: the same kernels on the same values (rounding only); -sm tensor: partial sums added in another order
LAYER_REL, TENSOR_REL = 2e-3, 1e-2


@pytest.fixture(scope="module")
def two_gpus() -> None:
    """Skips unless this build's ggml registry lists CUDA0 and CUDA1 (llama-perplexity --list-devices)."""
    proc = subprocess.run(tools.command("llama-perplexity", "--list-devices"), env=tools.tool_env(),
                          capture_output=True, text=True, timeout=300)
    devs = re.findall(r"^\s*(CUDA\d+):", proc.stdout + proc.stderr, re.M)
    if not {"CUDA0", "CUDA1"} <= set(devs):
        pytest.skip(f"needs two CUDA devices: this build's ggml registry lists {', '.join(devs) or 'none'} "
                    "(a GGML_EXT_CUDA=ON build on a machine with two NVIDIA GPUs)")


def _asset(find, name: str, option: str) -> Path:
    """find(): the asset's path (or the file `option` gave); skips when it is not there."""
    from ggml_ext.assets import AssetError
    try:
        return find()
    except AssetError as e:
        pytest.skip(f"no {name}: {e} (or pass {option})")


@pytest.fixture(scope="module")
def hf(two_gpus) -> Path:
    return _asset(cs.default_hf, "default model", "--default-hf DIR")


@pytest.fixture(scope="module")
def text(two_gpus, request) -> Path:
    return _asset(lambda: request.getfixturevalue("wiki_test"), "perplexity text", "--wiki-test FILE")


@pytest.fixture(scope="module")
def train(two_gpus, request) -> Path:
    from ggml_ext import assets
    if request.config.getoption("--wiki-train"):
        return Path(request.config.getoption("--wiki-train")).absolute()
    return _asset(lambda: assets.path("wiki-train"), "calibration text", "--wiki-train FILE")


@pytest.fixture(scope="module")
def work(two_gpus, tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("two-gpus")


@pytest.fixture(scope="module")
def q4_0_8_8(work, hf):
    from ggml_ext.converters import convert
    path = work / "q4_0_8_8.gguf"
    convert(hf, path, "q4_0_8_8")
    return path


@pytest.fixture(scope="module")
def weight_files(work, hf, q4_0_8_8, train):
    """name -> file, each made on first use: q4_0_8_8, q4_0_4_4 (the same values repacked), cb2 (importance from
    4 x 128 calibration tokens)."""
    from ggml_ext import repack
    from ggml_ext.converters import convert
    made = {"q4_0_8_8": q4_0_8_8}

    def get(name):
        if name not in made:
            path = work / f"{name}.gguf"
            if name == "q4_0_4_4":  # layouts are made from plain Q4_0: back to it, then 4x4
                plain = work / "q4_0.gguf"
                assert repack.repack(q4_0_8_8, plain, "q4_0").converted
                assert repack.repack(plain, path, "4x4").converted
            elif name == "cb2":
                convert(hf, path, "cb2", calib=train, calib_samples=4, calib_seq_len=128,
                        calib_progress=False, warn=lambda w: None)
            made[name] = path
        return made[name]
    return get


@pytest.fixture(scope="module")
def apq_file(work, hf):
    """The default model as one any-precision file serving 3..8 bits (unweighted k-means: no calibration pass)."""
    from ggml_ext.converters import convert
    path = work / "apq-3-8.gguf"
    convert(hf, path, method="anyprec", method_options={"fisher": False, "bits": "3-8"})
    return path


@pytest.fixture(scope="module")
def kv_calib(work, hf, train):
    """A KV calibration with nuq3 and nuq4 tables (1 x 64 tokens)."""
    from ggml_ext.kvquant import calibrate
    path = work / "kv.kvq.gguf"
    calibrate(hf, str(train), n_samples=1, seq_len=64, bits=(3, 4), progress=False).save(path, force=True)
    return path


def _ppl(path, text, mode, *extra, apq_bits=None):
    return tools.perplexity(path, text, n_ctx=CTX, chunks=CHUNKS, apq_bits=apq_bits,
                            extra=["-b", str(CTX), "-ngl", "99", "-lv", "4", *MODES[mode], *extra])


def _refused(path, text, mode, *extra, says: str) -> str:
    """The output of a llama-perplexity run that must be refused (an error exit, no crash) and name `says`."""
    argv = tools.command("llama-perplexity", "-m", path, "-f", text, "-c", str(CTX), "--chunks", "1", "--no-warmup",
                         "-ngl", "99", *MODES[mode], *extra)
    for _ in range(3):  # llama.cpp's log thread can lose the last lines when a tool exits at once: retry
        rc, log = tools.run(argv, tools.tool_env())
        assert 0 < rc < 128, (rc, log[-3000:])
        if says in log:
            break
    return log


def _both_gpus_hold_layers(r):
    for dev in ("CUDA0", "CUDA1"):
        assert re.search(rf"\b{dev}\s+model buffer size", r.log), (dev, r.log[-3000:])


def _cut_over_both_gpus(r):
    # the meta device over both; its buffers print as "Meta()"
    assert "creating a Meta device with 2 devices" in r.log, r.log[-3000:]
    assert re.search(r"\bMeta\([^)]*\)\s+model buffer size", r.log), r.log[-3000:]


def _close(got, want, rel, what):
    assert abs(got.ppl - want.ppl) <= rel * want.ppl, (what, got.ppl, want.ppl)


@pytest.mark.parametrize("name,tensor_type", [("q4_0_8_8", "Q4_0_8_8"), ("q4_0_4_4", "Q4_0_4_4"), ("cb2", "CB2")])
def test_weights_by_layer_and_by_tensor_give_one_gpus_perplexity(text, weight_files, name, tensor_type):
    from ggml_ext.gguf import read_gguf
    path = weight_files(name)
    assert read_gguf(path).tensor("blk.0.ffn_down.weight").type_name == tensor_type
    one = _ppl(path, text, "one")
    layer = _ppl(path, text, "layer")
    _both_gpus_hold_layers(layer)
    _close(layer, one, LAYER_REL, (name, "layer"))
    tensor = _ppl(path, text, "tensor")
    _cut_over_both_gpus(tensor)
    _close(tensor, one, TENSOR_REL, (name, "tensor"))
    print(f"{name}: one GPU {one.ppl:.4f}, -sm layer {layer.ppl:.4f}, -sm tensor {tensor.ppl:.4f}")


def test_apq_by_layer_at_two_precisions_gives_one_gpus_perplexity_and_by_tensor_is_refused(text, apq_file):
    got = {}
    for bits in (4, 8):
        one = _ppl(apq_file, text, "one", apq_bits=bits)
        layer = _ppl(apq_file, text, "layer", apq_bits=bits)
        _both_gpus_hold_layers(layer)
        _close(layer, one, LAYER_REL, ("apq", bits))
        got[bits] = one.ppl, layer.ppl
    # the precision reached the weights on both devices: 4 bits is not the 8-bit model
    assert got[4][1] != got[8][1] and got[4][0] != got[8][0], got
    msg = _refused(apq_file, text, "tensor", "--apq-bits", "4", says="split mode \"tensor\" cannot")
    assert "any-precision (APQ)" in msg and "--split-mode layer" in msg, msg[-3000:]
    print(f"apq (one GPU, -sm layer): 4 bits {got[4]}, 8 bits {got[8]}")


@pytest.mark.parametrize("cache", ["nuq4", "nuq3"])
def test_nuq_caches_by_layer_give_one_gpus_perplexity_and_by_tensor_are_refused(text, kv_calib, q4_0_8_8, cache):
    kv = ["-ctk", cache, "-ctv", cache, "--kv-calib", str(kv_calib), "-fa", "on"]
    one = _ppl(q4_0_8_8, text, "one", *kv)
    layer = _ppl(q4_0_8_8, text, "layer", *kv)
    _both_gpus_hold_layers(layer)
    _close(layer, one, LAYER_REL, (cache, "layer"))
    # the quantized cache really ran on both: the f16 cache's perplexity is another
    f16 = _ppl(q4_0_8_8, text, "layer", "-fa", "on")
    assert f16.ppl != layer.ppl, (f16.ppl, layer.ppl)
    msg = _refused(q4_0_8_8, text, "tensor", *kv, says="cut across devices")
    assert "cut across devices" in msg and "--split-mode layer" in msg, msg[-3000:]
    print(f"{cache}: one GPU {one.ppl:.4f}, -sm layer {layer.ppl:.4f} (f16 cache {f16.ppl:.4f})")
