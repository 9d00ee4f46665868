"""QDEC: dynamic error compensation of a quantized model (docs/QDEC.md).

A quantized linear computes Ŵ·x; QDEC adds back R·x restricted to the few input channels where |x| is
largest this token: y = Ŵ·x + R[:, sel(x)]·x[sel(x)], R = W − Ŵ kept as 4-bit codes in host memory.

* :mod:`.residual` -- R quantized per output channel to symmetric 4 bits with a grid-searched scale,
  packed input-channel-major (the layout the op DEC_MUL_MAT and the fetch read);
* :mod:`.select` -- the channel selection: per 1024-channel chunk, the paper's bucketed approximate
  top-k of |x| (32 buckets from the calibrated b0/b15) and the exact top-k, in torch; the same rule as
  the C reference (ggml_ext/src/ops/dec_mul_mat.c);
* :mod:`.calibration` -- ``ggml-ext calibrate dec``: residuals of a base GGUF against the Hugging Face
  weights and the bucket boundaries from calibration activations, into a GGUF side file;
* :mod:`.simulate` -- the model in torch with the base weights and the compensation added per token
  (dynamic, static or random channels), for perplexity (bench/qdec/bench_dec.py);
* :mod:`.tune` -- ``ggml-ext tune dec``: k_chunk and n_tb per linear type for target slowdowns.

A family package, not a weight method (:mod:`ggml_ext.methods`): it adds to a quantized base at run
time; the op DEC_MUL_MAT and llama.cpp's ``--dec`` read the side file.
"""
from __future__ import annotations

CHUNK = 1024                       # channels per selection chunk (one CUDA thread block in the paper)
K_GRID = (8, 16, 32, 64, 128)      # k_chunk values whose b15 the calibration stores
BITS = 4                           # residual bits: codes -7..7
QMAX = 7

__all__ = ["CHUNK", "K_GRID", "BITS", "QMAX"]
