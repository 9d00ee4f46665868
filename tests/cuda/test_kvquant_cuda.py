"""The KVQuant cache types NUQ4 / NUQ3 / NUQ2 with the cache in VRAM (ggml_ext/src/cuda/kvquant_cuda.cu, patch 0421;
docs/KVQUANT.md "The CUDA path").

- Host (nvcc, no GPU): the block functions the kernels run (kvquant_decode.cuh) against the CPU row functions:
  value and pre-RoPE key caches (per-channel blocks, and block-scaled ones: GGML_EXT_KV_KBLOCK), with and without
  outlier slots and the sink, and memory outside every binding: the same bytes and every value the same bits; the
  kernels' per-thread bodies (SET_ROWS from a strided source into scattered cells, CPY of the flash-attention V view
  and the K path's 4-D view, GET_ROWS) against ggml's CPU ops on the same bound caches, keys per channel and
  block-scaled; the decode op's row reader (row_geo_of / row_sink / block_value, kvquant_attn_cuda.cu's reading of K and
  V rows) on every bound cache: the bits of dequantize_value (tests/cuda/kvquant_cuda_check.cu). Skipped without
  nvcc.
- GPU (tests/c/test_kvquant_cuda.cpp --require-gpu, also run by `make test-cuda`): four caches bound at once on the
  CPU and the GPU (values, per-channel keys, block-scaled keys of the same rows and table, values of another
  table); SET_ROWS of an odd number of scattered rows gives the CPU's bytes, CPY to f32 / GET_ROWS the CPU's values
  bit for bit (f16: the CPU's rounded), the sink cell its written floats; flash attention with a NUQ V equals the
  GPU's own on the CPU's dequantized V in f16 and is within NMSE 5e-4 of the CPU.
  Skipped without a GGML_EXT_CUDA build or a CUDA device."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuda_support import run_host_check, run_on_gpus

REPO = Path(__file__).resolve().parents[2]


def test_kvquant_cuda_block_functions_match_the_cpu_rows(tmp_path):
    proc = run_host_check(REPO / "tests/cuda/kvquant_cuda_check.cu", tmp_path, "the CUDA block functions")
    for name in ("nuq4", "nuq3", "nuq2"):
        m = re.search(rf"^{name}: 13 cases checked \((\d+) outlier slots, (\d+) in block-scaled keys\)$", proc.stdout,
                      re.M)
        assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, proc.stdout[-2000:]
        assert re.search(rf"^{name}: SET_ROWS / CPY of views / GET_ROWS checked against ggml's CPU ops \(8 settings, 4 "
                         rf"with block-scaled keys\)$", proc.stdout, re.M), proc.stdout[-2000:]
    # the decode op's row reader (row_geo_of / row_sink / block_value) on every bound case of the three types
    m = re.search(r"^the decode op's row reader: (\d+) values, the bits of dequantize_value$", proc.stdout, re.M)
    assert m and int(m.group(1)) > 0, proc.stdout[-2000:]
    m = re.search(r"^the decode op's lane reader: (\d+) values, the bits of dequantize_value$", proc.stdout, re.M)
    assert m and int(m.group(1)) > 0, proc.stdout[-2000:]
    assert "OK: 0 failures" in proc.stdout


@pytest.mark.cuda
def test_kvquant_cache_on_cuda_matches_the_cpu(kvquant_cuda):
    proc = run_on_gpus(kvquant_cuda)
    for name in ("nuq4", "nuq3", "nuq2"):
        for what in ("", " +outliers", " +outliers +sink"):
            assert re.search(rf"^{name}{re.escape(what)}: SET_ROWS bytes equal \(4 caches: V, K, block-scaled K, V2;",
                             proc.stdout, re.M), proc.stdout[-2000:]
        assert re.search(rf"^{name} FLASH_ATTN_EXT .*= GPU on f16 V", proc.stdout, re.M), proc.stdout[-2000:]
