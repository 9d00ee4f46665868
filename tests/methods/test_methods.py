"""The quantization-method registry, and the converter calling methods by name.

``ggml_ext.methods`` lists the registered methods (``gptq`` and ``rtn`` today); ``convert(...,
method=NAME)`` and ``ggml-ext convert --method NAME`` look one up and hand it every
quantized matrix. Checked on a tiny random Llama (64-wide rows): ``method="rtn"`` is
the default's output byte for byte, through the API and the CLI; a method registered
by the test (delegating to rtn, recording its calls) is called once per quantized
tensor, in file order, with the tensor's name, type, rows and imatrix; unknown names,
options a method does not take, and a method's failures are errors that name the
choices or the tensor, and leave no file.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import convert_support as cs
from ggml_ext import methods, quants
from ggml_ext.converters import ConversionError, convert
from ggml_ext.methods.rtn import RTN

CLI = [sys.executable, "-m", "ggml_ext.cli"]
PLAIN = {"F32", "F16", "BF16"}


@pytest.fixture()
def registry(monkeypatch):
    """A private copy of the registry: methods registered in a test vanish after it."""
    monkeypatch.setattr(methods, "_registry", dict(methods._registry))
    return methods


def _tiny():
    return cs.tiny("llama")


def test_registry_lists_rtn():
    assert methods.available() == ("act-importance", "anyprec", "gptq", "ooc", "rtn")
    assert methods.get("rtn") is RTN
    assert "quantizer" in methods.describe()["rtn"]
    m = methods.create("rtn")
    assert isinstance(m, methods.Method) and isinstance(m, RTN)


def test_unknown_method_names_the_choices(tmp_path):
    with pytest.raises(methods.MethodError, match=r"unknown quantization method 'nope'; choose from act-importance, anyprec, gptq, ooc, rtn$"):
        methods.get("nope")
    with pytest.raises(methods.MethodError, match="unknown quantization method 'nope'; choose from act-importance, anyprec, gptq, ooc, rtn$"):
        methods.create("nope")
    out = tmp_path / "x.gguf"
    with pytest.raises(ConversionError, match="unknown quantization method 'nope'; choose from act-importance, anyprec, gptq, ooc, rtn$"):
        convert(_tiny(), out, "q4_0", method="nope")
    assert not out.exists()
    r = subprocess.run([*CLI, "convert", str(_tiny()), "-o", str(out), "--type", "q4_0", "--method", "nope", "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr and "'rtn'" in r.stderr, r.stderr
    assert not out.exists()
    r = subprocess.run([*CLI, "convert", "--help"], capture_output=True, text=True, timeout=300)
    text = " ".join(r.stdout.split())  # argparse wraps the help to the terminal's width
    assert r.returncode == 0 and "--method {act-importance,anyprec,gptq,ooc,rtn}" in text and "rtn: the type's own quantizer" in text


def test_register_refuses_bad_and_duplicate_names(registry):
    with pytest.raises(ValueError, match="already registered"):
        registry.register("rtn")(RTN)
    for bad in ("", "Upper", "has space", "a/b"):
        with pytest.raises(ValueError, match="lower-case"):
            registry.register(bad)
    assert registry.available() == ("act-importance", "anyprec", "gptq", "ooc", "rtn")


def test_rtn_options_are_checked():
    with pytest.raises(methods.MethodError, match="unknown IQ4_NL weighting 'bad'; choose from default, one"):
        methods.create("rtn", iq4_nl_weighting="bad")
    with pytest.raises(methods.MethodError, match="unknown quantizer 'mine'"):
        methods.create("rtn", quantizer="mine")
    with pytest.raises(methods.MethodError, match="method 'rtn': .*unexpected keyword argument 'group_size'"):
        methods.create("rtn", group_size=128)


def test_rtn_is_the_type_quantizer():
    rows = np.random.default_rng(1).standard_normal((8, 256), dtype=np.float32)
    for t, kw in (("Q4_0", {}), ("IQ4_NL", {"iq4_nl_weighting": "x2"}), ("IQ4_NL", {"quantizer": "ggml"})):
        out = np.empty(8 * quants.row_size(t, 256), dtype=np.uint8)
        assert methods.create("rtn", **kw).quantize("blk.0.ffn_up.weight", t, rows, out) == out.nbytes
        want = quants.quantize(rows, t, weighting=kw.get("iq4_nl_weighting", "default"),
                               quantizer=kw.get("quantizer"))
        assert out.tobytes() == want.tobytes(), (t, kw)


@pytest.mark.parametrize("out_type, weighting", [("q4_0", "default"), ("iq4_nl", "x2")])
def test_rtn_by_name_equals_the_default(out_type, weighting, tmp_path):
    folder = _tiny()
    default = tmp_path / "default.gguf"
    by_name = tmp_path / "rtn.gguf"
    convert(folder, default, out_type, iq4_nl_weighting=weighting)
    convert(folder, by_name, out_type, method="rtn", iq4_nl_weighting=weighting)
    assert default.read_bytes() == by_name.read_bytes()
    types = {v[0] for v in cs.read_tensor_bytes(default).values()}
    assert out_type.upper() in types  # the method had matrices to quantize
    if weighting == "default":  # and the CLI's --method rtn too
        cli = tmp_path / "cli.gguf"
        r = subprocess.run([*CLI, "convert", str(folder), "-o", str(cli), "--type", out_type, "--method", "rtn", "-q"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert cli.read_bytes() == default.read_bytes()


class _Recording:
    """A real method for the test: rtn's bytes, with every call written down."""

    calls: list[tuple] = []

    def __init__(self):  # no options: it takes none of rtn's
        self.rtn = RTN()

    def quantize(self, tensor_name, type_name, rows, out, *, imatrix=None, threads=None, calibration=None):
        assert rows.dtype == np.float32 and rows.flags.c_contiguous and out.dtype == np.uint8
        type(self).calls.append((tensor_name, type_name, rows.shape, imatrix is None, calibration))
        return self.rtn.quantize(tensor_name, type_name, rows, out, imatrix=imatrix, threads=threads)


def test_registered_method_is_called_by_name_for_each_quantized_tensor(registry, tmp_path):
    registry.register("recording", "rtn, with its calls written down")(_Recording)
    assert registry.available() == ("act-importance", "anyprec", "gptq", "ooc", "recording", "rtn")
    _Recording.calls = []
    folder = _tiny()
    out = tmp_path / "recorded.gguf"
    ref = tmp_path / "rtn.gguf"
    convert(folder, out, "q4_0", keep=["blk.0.ffn_down.weight=q8_0"], method="recording")
    convert(folder, ref, "q4_0", keep=["blk.0.ffn_down.weight=q8_0"])
    assert out.read_bytes() == ref.read_bytes()

    tensors = cs.read_tensor_bytes(out)  # in file order
    quantized = [(n, t, tuple(reversed(shape))) for n, (t, shape, _) in tensors.items() if t not in PLAIN]
    assert {t for _, t, _ in quantized} >= {"Q4_0", "Q8_0"}
    assert any(t in PLAIN for t, _, _ in tensors.values())  # norms stay F32, without the method
    want = [(n, t, (int(np.prod(s[:-1])), s[-1]), True, None) for n, t, s in quantized]
    assert _Recording.calls == want

    # rtn's option left at its default is not passed on; set, it is, and this method does not take it
    _Recording.calls = []
    convert(folder, tmp_path / "default-weighting.gguf", "q4_0", method="recording", iq4_nl_weighting="default")
    assert [c[0] for c in _Recording.calls] == [c[0] for c in want]  # the same matrices, without the --keep
    with pytest.raises(ConversionError, match="method 'recording': .*unexpected keyword argument 'iq4_nl_weighting'"):
        convert(folder, tmp_path / "x.gguf", "q4_0", method="recording", iq4_nl_weighting="x2")
    assert not (tmp_path / "x.gguf").exists()


def test_method_failures_name_the_tensor_and_leave_no_file(registry, tmp_path):
    @registry.register("short")
    class Short:
        def quantize(self, tensor_name, type_name, rows, out, *, imatrix=None, threads=None, calibration=None):
            RTN().quantize(tensor_name, type_name, rows, out, threads=threads)
            return out.nbytes - 1

    @registry.register("refusing")
    class Refusing:
        def quantize(self, tensor_name, type_name, rows, out, *, imatrix=None, threads=None, calibration=None):
            raise methods.MethodError(f"needs a calibration context (got {calibration!r})")

    out = tmp_path / "x.gguf"
    # the first quantized tensor: the tied embedding, Q8_0 (49152 x 64 weights, 34 bytes per 32)
    with pytest.raises(ConversionError, match=r"^tensor model\.embed_tokens\.weight \(token_embd\.weight\): "
                                              r"method 'short' wrote 3342335 bytes of 3342336 \(Q8_0\)$"):
        convert(_tiny(), out, "q4_0", method="short")
    assert not out.exists()
    with pytest.raises(ConversionError, match=r"^tensor model\.embed_tokens\.weight \(token_embd\.weight\): "
                                              r"needs a calibration context \(got None\)$"):
        convert(_tiny(), out, "q4_0", method="refusing")
    assert not out.exists()
    assert not list(tmp_path.iterdir())  # no temp file either
