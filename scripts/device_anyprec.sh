#!/usr/bin/env bash
# The any-precision CUDA GEMV on an NVIDIA machine, standalone (no llama.cpp build needed): builds
# tests/cuda/anyprec_cuda_bench.cu with ggml_ext/src/cuda/anyprec_cuda.cu and the C reference
# (formats/anyprec/anyprec.c, generic/anyprec.c), checks the GPU against the CPU reference at 3..8 bits and
# times it against cuBLAS fp16 GEMV for 4096x4096, 11008x4096, 4096x11008, 14336x4096 (and 576x576), as a
# fraction of the measured copy bandwidth. Usage: scripts/device_anyprec.sh [OUTDIR] (default $OUT or /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp}}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${CUDA_ARCH:-90}
for f in formats/anyprec/anyprec.c generic/anyprec.c; do
    gcc -std=gnu11 -O2 -Iggml_ext/include -Iggml_ext/src -c "ggml_ext/src/$f" -o "$work/$(echo "$f" | tr / _).o"
done
"$NVCC" -O3 -std=c++17 -arch=sm_$ARCH tests/cuda/anyprec_cuda_bench.cu ggml_ext/src/cuda/anyprec_cuda.cu \
    "$work"/*.o -lcublas -o "$work/anyprec_cuda_bench"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv > "$out/anyprec_gpu.txt" || true
"$work/anyprec_cuda_bench" | tee "$out/anyprec_cuda_bench.md"
