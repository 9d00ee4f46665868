"""The KVQuant decode op with the cache in VRAM (ggml_ext/src/cuda/kvquant_attn_cuda.cu through patch 0421's hook;
docs/KVQUANT.md "The decode op", "The CUDA path").

- Host (nvcc, no GPU): the per-cell pieces the kernels run (kvquant_attn_decode.cuh: the cos / sin table row, the K / V
  row values, the K norm, the RoPE of a dimension, the lane kernel's whole-key dots from the row's words and from
  floats) against the CPU op's table node and ggml's to_float, rms_norm, mul and rope_ext on the same bound NUQ key
  caches (tests/cuda/kvattn_cuda_check.cu). Skipped without nvcc.
- GPU (tests/c/test_kvattn_cuda.cpp --require-gpu, also run by `make test-cuda`): the same bound NUQ caches written
  by SET_ROWS on the CPU and on the GPU, ggml_ext_kvquant_attn over them with every node on that backend (the GPU takes
  the table, partial and combine nodes); the GPU's result within NMSE 1e-6 of the CPU's for eight cases, each with the lane kernel (k_lanes) where it
  applies and with it off (n_kv not a multiple of the cell range, block-scaled keys, GQA up to 20, 1-6 tokens, 2 streams, NEOX / normal RoPE, partial rotary, YaRN with
  freq factors, a K norm, outlier slots, a float sink row, NUQ / F16 / F32 V, F16 / F32 masks with -inf holes and a
  fully masked query: zeros on both). Skipped without a GGML_EXT_CUDA build or a CUDA device."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuda_support import run_host_check, run_on_gpus

REPO = Path(__file__).resolve().parents[2]


def test_kvattn_cuda_pieces_match_the_cpu(tmp_path):
    proc = run_host_check(REPO / "tests/cuda/kvattn_cuda_check.cu", tmp_path, "the CUDA pieces")
    assert len(re.findall(r"^nuq\d hd \d+ .*: table \d+ of \d+ bit-equal", proc.stdout, re.M)) == 5, proc.stdout
    assert len(re.findall(r"^nuq\d hd \d+: lane key dots (\d+) of \1 within 1e-5 of rope_at's$", proc.stdout, re.M)) == 3, proc.stdout
    assert "OK: 0 failures" in proc.stdout


@pytest.mark.cuda
def test_kvattn_on_cuda_matches_the_cpu_op(kvattn_cuda):
    proc = run_on_gpus(kvattn_cuda)
    lines = re.findall(r"^K nuq\d V \w+ .*: NMSE (\S+) against the CPU$", proc.stdout, re.M)
    assert lines and len(lines) % 16 == 0, proc.stdout[-3000:]  # eight cases per GPU, lane kernel on and off
    assert all(float(e) <= 1e-6 for e in lines), proc.stdout[-3000:]
    assert "OK: the KVQuant decode op, CPU + GPU, 8 cases x 2 (default, block kernel), 0 failure(s)" in proc.stdout
