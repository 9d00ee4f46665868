#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "Build and test times": the cold CUDA build, then test-cuda and a CPU / GPU perplexity check.
# Prove the CUDA switch on an NVIDIA machine (the lent H100/H200): configure with
# GGML_EXT_CUDA=ON, build, install, run ggml-ext's CUDA op tests (scripts/test_cuda.sh), then run the
# same model on CPU and GPU.
# Usage: device_cuda_check.sh MODEL.gguf TEXT.txt OUTDIR   (GGML_EXT_LLAMA_CPP_SRC may point at the tree)
set -euo pipefail
model=$1 text=$2 out=$3
build=${BUILD_DIR:-/tmp/ggml-ext-cuda}
mkdir -p "$out"
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DGGML_EXT_CUDA=ON -DPython3_EXECUTABLE="$(command -v python3)" >"$out/configure.log" 2>&1
cmake --build "$build" -j "$(nproc)" --target ggml_ext_all >"$out/build.log" 2>&1
t1=$(date +%s)
echo "cold build (configure + build, $(nproc) cores): $((t1 - t0)) s" | tee "$out/summary.txt"
cmake --install "$build" --component ggml_ext --prefix "$build/install" >/dev/null
prefix="$build/install/ggml_ext"
export GGML_EXT_PREFIX=$prefix LD_LIBRARY_PATH=$prefix/lib
PYTHONPATH=python python3 -m ggml_ext.cli info --build | tee -a "$out/summary.txt"
nvidia-smi -L | tee -a "$out/summary.txt"
# ggml-ext's own CUDA code (ggml_ext/src/cuda): each op on the GPU against the CPU backend
if bash scripts/test_cuda.sh "$prefix" >"$out/test-cuda.log" 2>&1; then
  echo "test-cuda: $(tail -n 1 "$out/test-cuda.log")" | tee -a "$out/summary.txt"
else
  echo "test-cuda FAILED (see test-cuda.log): $(tail -n 3 "$out/test-cuda.log")" | tee -a "$out/summary.txt"
fi
for ngl in 0 99; do
  "$prefix/bin/llama-perplexity" -m "$model" -f "$text" -c 256 --chunks 16 -ngl "$ngl" >"$out/ppl-ngl$ngl.log" 2>&1
  echo "perplexity ngl=$ngl: $(grep -o 'Final estimate.*' "$out/ppl-ngl$ngl.log")" | tee -a "$out/summary.txt"
done
grep -m1 -E "CUDA0 model buffer size|assigned to device CUDA0" "$out/ppl-ngl99.log" | tee -a "$out/summary.txt" || true
"$prefix/bin/llama-bench" -m "$model" -p 512 -n 128 -ngl 0,99 -o md 2>/dev/null | tee -a "$out/summary.txt"
