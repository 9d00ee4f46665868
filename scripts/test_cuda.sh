#!/usr/bin/env bash
# ggml-ext's ops and types on CUDA against the CPU (make test-cuda): tests/c/test_ext_ops.cpp and
# tests/c/test_types_backends.cpp built against an installed GGML_EXT_CUDA=ON build and run with
# --require-gpu: every case of every op on the CPU backend (against its reference, 1-4 threads) and on each
# GPU (NMSE against the CPU at most 1e-7; APQ_MUL_MAT above 8 tokens 5e-4, its weights uploaded and read back
# in pieces through the row-lane layout); every type with a stock twin in mul_mat on each GPU (the base
# type's result bit for bit, NMSE against the CPU at most 5e-4, piecewise uploads read back exactly); the
# codebook types CB2 / CB3 on ggml-ext's own CUDA kernels (patch 0410) at 1-512 tokens (NMSE at most 1e-5
# against the exact product of the dequantized weights, 2e-4 against the CPU); tests/c/test_kvquant_cuda.cpp: the
# KVQuant cache types NUQ4 / NUQ3 / NUQ2 in VRAM (patch 0421): SET_ROWS bytes, CPY / GET_ROWS values bit for bit
# against the CPU with and without outlier slots and the sink, flash attention with a NUQ V; tests/c/test_kvattn_cuda.cpp:
# the KVQuant decode op's three nodes on the GPU (kvquant_attn_cuda.cu) within NMSE 1e-6 of the CPU op on the same caches.
# With two CUDA devices or more in the build's ggml registry, also tests/cuda/test_two_gpus.py (pytest, PYTHON):
# the default model's files over two GPUs (-sm layer / -sm tensor) against one GPU (interleaved, CB2, APQ at two
# precisions, NUQ caches), and the refusals of APQ weights and NUQ caches under -sm tensor.
# Usage: scripts/test_cuda.sh [PREFIX] [PYTEST_OPTION...]   PREFIX holds bin/, lib/ and include/ of the build
# (default: $GGML_EXT_PREFIX, else the installed ggml_ext package's); PYTEST_OPTIONs go to the two-GPU tests, e.g.
# --default-hf DIR --wiki-test FILE --wiki-train FILE where ggml-ext's asset store is not (tests/conftest.py).
# Fails when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    prefix=$1
    shift
fi
prefix=${prefix:-${GGML_EXT_PREFIX:-$("${PYTHON:-python3}" -c 'from ggml_ext import _locate; print(_locate.prefix())')}}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for prog in test_ext_ops test_types_backends test_kvquant_cuda test_kvattn_cuda; do
    "${CXX:-g++}" -std=c++17 -O2 -Wall -Wextra -Werror -I"$prefix/include" "tests/c/$prog.cpp" \
        -L"$prefix/lib" -lggml -lggml-base -lggml-cpu -lggml-rpc -Wl,-rpath,"$prefix/lib" -o "$work/$prog"
    rc=0
    "$work/$prog" --require-gpu || rc=$?
    if [ "$rc" -eq 77 ]; then
        echo "test-cuda: no GPU device in $prefix's ggml registry (built without GGML_EXT_CUDA=ON, or no CUDA device)" >&2
        exit 1
    fi
    [ "$rc" -eq 0 ] || status=$rc
done
n_cuda=$(LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$prefix/bin/llama-perplexity" --list-devices 2>&1 |
    grep -cE '^\s*CUDA[0-9]+:' || true)
if [ "$n_cuda" -ge 2 ]; then
    echo "test-cuda: $n_cuda CUDA devices: tests/cuda/test_two_gpus.py"
    rc=0
    GGML_EXT_PREFIX=$prefix "${PYTHON:-python3}" -m pytest -q -rs -p no:cacheprovider tests/cuda/test_two_gpus.py "$@" || rc=$?
    [ "$rc" -eq 0 ] || { echo "test-cuda: the two-GPU checks failed (pytest exit $rc)" >&2; status=$rc; }
else
    echo "test-cuda: $n_cuda CUDA device(s) in the registry: the two-GPU checks need two"
fi
exit "$status"
