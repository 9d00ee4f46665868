"""Quantization methods: how a float32 weight matrix becomes a quantized type's bytes.

The converter pipeline (:mod:`ggml_ext.converters.pipeline`) plans which ggml type each
tensor gets; the *method* decides how a matrix is quantized to that type. The pipeline
looks the method up here by name (``convert(..., method="rtn")``,
``ggml-ext convert --method rtn``) and hands it each quantized matrix in turn; float
types (F32, F16, BF16) are converted by ggml directly and never reach a method.

    >>> from ggml_ext import methods
    >>> methods.available()
    ('act-importance', 'anyprec', 'gptq', 'ooc', 'rtn')

The registered methods:

* ``rtn`` (:mod:`.rtn`): each type's own quantizer, row by row (ggml's, or ggml-ext's
  exact scale search for IQ4_NL), optionally importance-weighted by an imatrix.
* ``act-importance`` (:mod:`.act_importance`): the type's own quantizer weighted by E[x²] of the
  calibration activations (the codebook types' default without an imatrix).
* ``gptq`` (:mod:`.gptq`, with :mod:`.grids`): GPTQ (Hessian-based error compensation,
  act-order, lazy blocks) with the target type's block scales and grid as the rounding
  function, so the file is an ordinary GGUF (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL). It
  declares ``calibration_needs = ("hessian",)``: the pipeline then streams the decoder
  layers over a calibration text and hands each layer matrix its Hessian.

* ``anyprec`` (:mod:`.anyprec`): Any-Precision LLM, Fisher-weighted k-means seed + incremental
  upscaling into one bitplane file serving every precision 3..8 (``calibration_needs = ("fisher",)``:
  the calibration engine's cached Fisher diagonal; docs/formats/anyprec.md).

* ``ooc`` (:mod:`.ooc`): K-OOC, GPTQ(l) with one clear group per matrix at h bits kept as a column
  side-car (``<w>.ooc_idx`` / ``<w>.ooc_s``), its GPTQ(l) and GPTQ(h,l,p,s) flows streamed side by side
  (``workflows``; the pipeline keeps the flow of lower validation loss, ``choose``) and the side-car written
  as ``companions`` of the weight; files that need ggml-ext's llama.cpp (docs/GPTQ.md).

Weight methods only: KVQuant (:mod:`ggml_ext.kvquant`) quantizes the KV cache at run time and QDEC
(:mod:`ggml_ext.qdec`) adds to a quantized base at run time, so neither quantizes a tensor of the
converted file; they are family packages beside :mod:`ggml_ext.anyprec` and :mod:`ggml_ext.codebooks`.
Methods that need more than an imatrix (Hessians, Fisher information,
captured activations) get it from :mod:`ggml_ext.calibrate` through the ``calibration``
argument below. A method says what it needs with a class attribute ``calibration_needs``
(collector names of :mod:`ggml_ext.calibrate.collect`, e.g. ``("hessian",)``); the pipeline
then streams the model's decoder layers over the calibration text, calls :meth:`Method.quantize`
for each layer matrix with ``calibration={"hessian": H, "hessian_rows": n, ...}`` as soon as the
layer's statistics are complete, replaces the layer's weights by what the bytes dequantize to
(so later layers are calibrated on the quantized model), and writes those bytes; matrices
outside the layers (embeddings, output) get ``calibration=None``. An optional
``supports(type_name)`` lets the converter refuse a ``--type`` the method cannot produce.

The interface (:class:`Method`): a method is made once per conversion by its factory
(usually its class), called with the conversion's method options as keywords, so it may
keep per-model state; then :meth:`Method.quantize` is called for every quantized tensor,
in file order. A method's core should read like its paper's pseudocode; model plumbing
(loading, layer capture, caching, GGUF writing) stays in the pipeline and
:mod:`ggml_ext.calibrate`.

Adding one: a module here with a class implementing :class:`Method`, decorated with
``@register("name", "one line for --help")``, imported at the bottom of this file, and
its tests under ``tests/``; ``docs/DEVELOPING.md`` has the checklist.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

__all__ = ["Method", "MethodError", "register", "get", "create", "available", "describe"]


class MethodError(ValueError):
    """An unknown method, an option it does not take, or input it cannot quantize."""


@runtime_checkable
class Method(Protocol):
    """One quantization method, made for one conversion."""

    def quantize(self, tensor_name: str, type_name: str, rows: np.ndarray, out: np.ndarray, *,
                 imatrix: np.ndarray | None = None, threads: int | None = None,
                 calibration: Any | None = None) -> int:
        """Quantize ``rows`` (float32, C-contiguous, n_rows x n_per_row) of the GGUF tensor
        ``tensor_name`` to the ggml type ``type_name`` (e.g. ``"Q4_0"``), writing the
        tensor's bytes into the C-contiguous uint8 buffer ``out`` (exactly
        ``n_rows * quants.row_size(type_name, n_per_row)`` bytes). Returns the bytes written.

        ``imatrix``: the tensor's importances (n_per_row float32 values) when the
        conversion has an importance matrix with an entry for it, else None.
        ``threads``: how many threads the method may use (None: all cores).
        ``calibration``: for methods with ``calibration_needs``, the matrix's statistics of
        :mod:`ggml_ext.calibrate.collect` (``{"hessian": XᵀX, "hessian_rows": n, "module": name}``)
        while the pipeline streams the layers; None otherwise (and for matrices outside the
        decoder layers); a method that cannot work without it raises :class:`MethodError`.

        Raises :class:`MethodError` (or :class:`ggml_ext.quants.QuantError`) for input it
        cannot quantize; the pipeline reports it with the tensor's name.
        """
        ...


_registry: dict[str, tuple[Callable[..., Method], str]] = {}


def register(name: str, help: str = "") -> Callable[[Callable[..., Method]], Callable[..., Method]]:  # noqa: A002
    """Class decorator: make ``factory(**options)`` the method called ``name``.

    ``help`` is the one line ``ggml-ext convert --help`` shows for it. A name can be
    registered once.
    """
    if not name or not name.replace("_", "").replace("-", "").isalnum() or name != name.lower():
        raise ValueError(f"method name {name!r}: use lower-case letters, digits, '-' and '_'")

    def deco(factory: Callable[..., Method]) -> Callable[..., Method]:
        if name in _registry:
            raise ValueError(f"a method named {name!r} is already registered ({_registry[name][0]!r})")
        _registry[name] = (factory, help)
        return factory
    return deco


def available() -> tuple[str, ...]:
    """The registered method names, sorted."""
    return tuple(sorted(_registry))


def describe() -> dict[str, str]:
    """Method name -> its one-line help, sorted by name."""
    return {n: _registry[n][1] for n in available()}


def get(name: str) -> Callable[..., Method]:
    """The factory of the method ``name``; :class:`MethodError` naming the choices if there is none."""
    try:
        return _registry[name][0]
    except (KeyError, TypeError):
        raise MethodError(f"unknown quantization method {name!r}; choose from {', '.join(available())}") from None


def create(name: str, **options: Any) -> Method:
    """A new instance of the method ``name`` for one conversion, made with ``options``.

    An option the method does not take is a :class:`MethodError`, as is an unknown name.
    """
    factory = get(name)
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as e:  # e.g. "got an unexpected keyword argument 'x'"
        raise MethodError(f"method {name!r}: {e}") from None
    method = factory(**options)
    if not isinstance(method, Method):
        raise TypeError(f"method {name!r}: {factory!r} made {method!r}, which has no quantize()")
    return method


# The built-in methods register themselves on import.
from . import act_importance, anyprec, gptq, ooc, rtn  # noqa: E402,F401
