"""The options of one conversion, as one typed value: what :func:`ggml_ext.converters.convert` takes.

    from ggml_ext.converters import ConvertOptions, convert
    convert("hf-folder", "model.gguf", options=ConvertOptions(type="q4_0", method="gptq", calib="wiki-train"))

The keyword form (``convert("hf-folder", "model.gguf", "q4_0", method="gptq")``, and ``ggml_ext.convert``)
builds the same value: each keyword is a field below. ``ggml-ext convert`` builds it from its flags.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from .policy import KeepRule

__all__ = ["ConvertOptions"]


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert a Hugging Face folder to GGUF. Every field has the default ``convert`` uses."""

    #: output type: None (the method's ``default_type``, else f16), f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
    #: iq4_nl, the K-quants, the interleaved q4_0_4_4 / q4_0_4_8 / q4_0_8_8 / iq4_nl_*, the codebook recipes
    #: (:data:`ggml_ext.converters.policy.OUTPUT_TYPES`; the policy says which tensor gets which type)
    type: str | None = None
    #: ``"PATTERN=TYPE"`` overrides (or parsed :class:`~ggml_ext.converters.policy.KeepRule`), first match wins
    keep: tuple[str | KeepRule, ...] | list = ()
    #: replace an existing output file
    force: bool = False
    #: ``general.name`` (None: from config.json or the folder name)
    name: str | None = None
    #: quantization threads (None: all cores)
    threads: int | None = None
    #: write the tokenizer and metadata only
    vocab_only: bool = False
    #: an importance-matrix file of llama-imatrix (or a loaded :class:`ggml_ext.calibrate.imatrix.Imatrix`),
    #: used for every quantized matrix as ``llama-quantize --imatrix`` does (it changes iq4_nl's mix too)
    imatrix: str | os.PathLike | Any | None = None
    #: the quantization method every quantized matrix goes through (:func:`ggml_ext.methods.available`);
    #: None: ``rtn``, the type's own quantizer -- for the codebook recipes cb2/cb2_m/cb3/cb3_m without
    #: ``imatrix``, ``act-importance``: importance from the activations of the calibration text
    method: str | None = None
    #: ggml-ext's IQ4_NL error weighting (:data:`ggml_ext.quants.IQ4_NL_WEIGHTINGS`), an option of ``rtn``,
    #: passed to the method when not ``"default"``
    iq4_nl_weighting: str = "default"
    #: further keyword options of the method (e.g. ``{"percdamp": 0.01}`` for gptq)
    method_options: dict | None = None
    #: the calibration text of methods that calibrate: a file or an asset name (None: wiki-train)
    calib: str | os.PathLike | None = None
    #: calibration samples and tokens per sample (None: :mod:`ggml_ext.calibrate.data`'s 64 x 512)
    calib_samples: int | None = None
    calib_seq_len: int | None = None
    #: where calibration runs the layers ("cpu", "cuda", "cuda:1")
    calib_device: str = "cpu"
    #: a progress bar over the calibrated layers
    calib_progress: bool = True
    #: the ``tokenizer.ggml.pre`` of a byte-level BPE tokenizer, instead of detecting it (needed when it is
    #: not recognised: see :mod:`ggml_ext.converters.vocab`)
    pre_tokenizer: str | None = None
    #: ``progress(done, total, tensor_name)``, called as weights are written (counted in elements)
    progress: Callable[[int, int, str], None] | None = field(default=None, compare=False)
    #: ``warn(message)`` receives warnings (None: logging)
    warn: Callable[[str], None] | None = field(default=None, compare=False)

    def replace(self, **changes: Any) -> "ConvertOptions":
        """A copy with ``changes`` (field names as keywords); TypeError names a keyword that is no field."""
        return dataclasses.replace(self, **changes)
