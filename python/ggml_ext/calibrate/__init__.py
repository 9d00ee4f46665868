"""Calibration: what a quantization method learns about a model from running it on text.

What lives here now:

* :mod:`.imatrix` -- per-input-column activation statistics (mean squared activations
  of every weight matrix's input, llama.cpp's "importance matrix"): ``ggml-ext imatrix``
  runs our ``llama-imatrix`` on a GGUF model and a text; :func:`.imatrix.load` reads its
  GGUF or legacy ``.dat`` output for ``convert --imatrix``.

What issue 13 adds (a plan, not code yet):

* layer streaming: run the full-precision Hugging Face model one decoder layer at a
  time over calibration text, holding one layer's weights and its input activations,
  for any architecture the converter's tables know (one driver, not one per model);
* per-linear-layer Hessians (``X^T X`` of the layer's inputs, accumulated over batches)
  for GPTQ-style methods;
* Fisher information (diagonal, squared gradients of the loss) for SqueezeLLM-style
  sensitivity-weighted k-means;
* activation statistics beyond the imatrix (per-channel ranges, outliers) for KV-cache
  and outlier-aware methods;
* a cache of all of the above, keyed by model, text and settings, so a method can be
  rerun without recalibrating.

Methods (:mod:`ggml_ext.methods`) receive these through their optional ``calibration``
argument; the converter pipeline owns the plumbing.
"""
from __future__ import annotations

__all__ = ["imatrix"]
