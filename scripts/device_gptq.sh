#!/usr/bin/env bash
# GPTQ timing on the lent GPU for Llama-7B-shaped layers (random weights, seeded): the batched torch
# implementation on CUDA vs the sequential numpy reference, and byte identity of the two.
# Usage (repository root, on the device): bash scripts/device_gptq.sh [OUTDIR]   (default $OUT)
#   SIZE=tiny   CPU-only smoke run at small shapes (what CI / a laptop can do)
#   GGML_EXT_PREFIX=...   an installed build; unset: a CPU-only build of ours is made in $BUILD_DIR
#     (the scale choice calls ggml's quantizer on the host; no CUDA build is needed)
# Writes OUTDIR/gptq-<type>.json (bench_gptq_gpu.py --json) and OUTDIR/summary.txt.
set -euo pipefail
out=${1:-${OUT:?give OUTDIR or set OUT}}
mkdir -p "$out"
if [ -z "${GGML_EXT_PREFIX:-}" ]; then
  build=${BUILD_DIR:-/tmp/ggml-ext-gptq}
  cmake -S . -B "$build" -G Ninja -DPython3_EXECUTABLE="$(command -v python3)" >"$out/configure.log" 2>&1
  cmake --build "$build" -j "$(nproc)" --target ggml_ext_all >"$out/build.log" 2>&1
  cmake --install "$build" --component ggml_ext --prefix "$build/install" >/dev/null
  export GGML_EXT_PREFIX=$build/install/ggml_ext
fi
export LD_LIBRARY_PATH=$GGML_EXT_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ "${SIZE:-full}" = tiny ]; then
  device=cpu check=64x96,96x64 shapes=128x256,256x128 reference=128x256,256x128 repeat=1
else
  # Llama-2-7B: q/k/v/o 4096x4096, gate/up 11008x4096, down 4096x11008 (rows x columns). The reference
  # is timed on the two 4096-column shapes (down's 11008 columns take it past the device's 10 minutes).
  device=cuda check=576x1536,1536x576,2048x2048 shapes=4096x4096,11008x4096,4096x11008
  reference=4096x4096,11008x4096 repeat=3
fi
{ date -u; nvidia-smi -L 2>/dev/null || echo "no GPU"; nproc; } >"$out/summary.txt"
for type in q4_0 iq4_nl; do
  PYTHONPATH=python python3 scripts/bench_gptq_gpu.py --device "$device" --type "$type" --check "$check" \
    --shapes "$shapes" --reference "$reference" --repeat "$repeat" --cpu-max 0 --json "$out/gptq-$type.json" \
    | tee -a "$out/summary.txt"
done
