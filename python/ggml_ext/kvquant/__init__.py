"""KVQuant (Hooper et al., 2024): Fisher-calibrated non-uniform KV cache quantization, keys per channel before RoPE.

* :mod:`.quant` -- the paper's quantizer: int / NormalFloat / nuq levels (Fisher-weighted k-means), Q-Norm,
  per-vector dense-and-sparse thresholds, quantize-dequantize;
* :mod:`.calibration` -- ``ggml-ext calibrate kv``: the offline part (Fisher of the K/V projection outputs,
  per-channel key thresholds, per-layer nuq levels) saved as a GGUF side file, and reading it back;
* :mod:`.simulate` -- simulated quantization of a transformers model's K/V (pre- or post-RoPE keys) and
  perplexity the way llama-perplexity computes it (bench/kvquant/bench_kvquant.py runs the ladder).

* :mod:`.kernels` -- the C KV-cache kernels through ctypes (:class:`~.kernels.KVCacheLayer`).

A family package, not a weight method (:mod:`ggml_ext.methods`): it quantizes activations at run time,
not a tensor of the converted file, so the converter's :class:`ggml_ext.methods.Method` interface does
not fit; the C kernels and llama.cpp's cache types (``-ctk/-ctv nuq4``, ``--kv-calib``) read the side file.
"""
from __future__ import annotations

from .calibration import KVCalibration, KVCalibrationError, calibrate
from .simulate import LADDER, Scheme, SimulationError, perplexity, scheme, simulate

__all__ = ["KVCalibration", "KVCalibrationError", "calibrate", "LADDER", "Scheme", "SimulationError",
           "perplexity", "scheme", "simulate"]
