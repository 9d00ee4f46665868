"""Hugging Face checkpoint -> GGUF.

    from ggml_ext.converters import convert
    convert("path/to/hf-folder", "model.q8_0.gguf", "q8_0")

Modules: :mod:`.archs` (one table per architecture), :mod:`.vocab` (tokenizer
export), :mod:`.policy` (which tensor gets which ggml type), :mod:`.source`
(reading safetensors / PyTorch checkpoints), :mod:`.options` (:class:`ConvertOptions`, every choice of
one conversion), :mod:`.pipeline` (plan and write,
through :mod:`ggml_ext.gguf`'s streaming, atomic writer). ``docs/CONVERT.md`` is the
user guide.
"""
from __future__ import annotations

from .archs import ARCHS, supported_architectures
from .options import ConvertOptions
from .pipeline import ConversionPlan, ConversionResult, convert, plan
from .errors import ConversionError
from .policy import KEEP_TYPES, OUTPUT_TYPES

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(ARCHS)

__all__ = ["convert", "plan", "ConvertOptions", "ConversionError", "ConversionResult", "ConversionPlan", "SUPPORTED_ARCHITECTURES",
           "OUTPUT_TYPES", "KEEP_TYPES", "supported_architectures"]
