"""Calibration: what a quantization method learns about a model from running it on text.

* :mod:`.imatrix` -- per-input-column activation statistics (mean squared activations
  of every weight matrix's input, llama.cpp's "importance matrix"): ``ggml-ext imatrix``
  runs our ``llama-imatrix`` on a GGUF model and a text; :func:`.imatrix.load` reads its
  GGUF or legacy ``.dat`` output for ``convert --imatrix``.

* :mod:`.data` -- calibration tokens: ``n_samples`` windows of ``seq_len`` tokens at evenly spaced
  offsets of a text (default: the ``wiki-train`` asset, never the evaluation text);
* :mod:`.stream` -- layer streaming: the Hugging Face model built by transformers on the ``meta``
  device, each decoder layer loaded from the checkpoint in turn and run on every sample with the
  exact arguments the model gives it (captured once), so memory is one layer plus activations; a
  hook lets a method change a layer before its outputs feed the next (GPTQ-style);
* :mod:`.collect` -- per-linear statistics, each opt-in: ``hessian`` (XᵀX in float64) and
  ``act_stats`` (per input channel Σ|x|, Σx², max, count, log2 histogram for quantiles), and on request
  the OOC probe's and the attention-weighted Hessians;
* :mod:`.fisher` -- Fisher information: the diagonal of the empirical Fisher of every weight (a full
  backward pass, or layer by layer in reverse), and of the K/V projection outputs;
* :mod:`.stats` -- ``ggml-ext calibrate stats/ls/rm``: the above over a whole model into a folder of
  per-layer safetensors files with a manifest, cached by model, text and settings, resumable, and
  exported as a llama-imatrix GGUF file.

Methods (:mod:`ggml_ext.methods`) receive these through their optional ``calibration``
argument; the converter pipeline owns the plumbing. The family packages build on them too
(:mod:`ggml_ext.kvquant`: Fisher of the K/V outputs; :mod:`ggml_ext.qdec`: the layer stream), which is
why the ``ggml-ext calibrate`` verb lives above this package (:mod:`ggml_ext.calibrate_cli`).
"""
from __future__ import annotations

__all__ = ["collect", "data", "imatrix", "stats", "stream"]
