#!/usr/bin/env bash
# The any-precision CUDA kernels on an NVIDIA machine, standalone (no llama.cpp build needed): builds
# tests/cuda/anyprec_cuda_bench.cu with ggml_ext/src/cuda/anyprec_cuda.cu and the C reference
# (formats/anyprec/anyprec.c, generic/anyprec.c), checks every GPU path against the CPU reference at 3..8 bits
# (v0 on the file layout; v1..v4 on the row-lane layout made at upload; v2 at 2..8 tokens; the dequantize
# kernel bit-exact; dequantize + cuBLAS at 16 tokens) and times them against cuBLAS fp16 for 4096x4096,
# 11008x4096, 4096x11008, 14336x4096 (and 576x576, 1000x1536: v0 only / padded row groups), as a fraction
# of the measured copy bandwidth. Writes $OUT/anyprec_cuda_bench.md (tables), anyprec_gpu.txt and
# anyprec_ptxas.txt (registers/spills per kernel). Exit status 1 on a mismatch.
# Usage: scripts/device_anyprec.sh [OUTDIR] (default $OUT or /tmp). CUDA_ARCH (default 90), NVCC.
#
# Optional llama.cpp baseline (not run here: it needs the CUDA build of the pristine llama.cpp): upstream's
#   test-backend-ops perf -o MUL_MAT -b CUDA0
# prints mat-vec timings for q4_0 / q3_K among its cases (n=1 rows of its perf table); the shapes there are
# upstream's (4096 x 4096 among them), not ours.
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
"$NVCC" -O3 -std=c++17 -arch=sm_$ARCH -Xptxas -v -c ggml_ext/src/cuda/anyprec_cuda.cu -o "$work/anyprec_cuda.o" \
    2> "$out/anyprec_ptxas.txt"
"$NVCC" -O3 -std=c++17 -arch=sm_$ARCH -Xcompiler -fopenmp tests/cuda/anyprec_cuda_bench.cu "$work/anyprec_cuda.o" \
    "$work"/*anyprec.c.o -lcublas -lgomp -o "$work/anyprec_cuda_bench"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv > "$out/anyprec_gpu.txt" || true
"$work/anyprec_cuda_bench" | tee "$out/anyprec_cuda_bench.md"
