#!/usr/bin/env bash
# OOC(h,l,p,s) vs GPTQ(l) perplexity on the device (docs/GPTQ.md "OOC"): scripts/bench_ooc.py with the
# calibration layers, GPTQ and OOC on the GPU and perplexity by our CPU llama-perplexity, which must be
# built from this branch (patch 0303's OOC side-car loader). Builds ours CPU-only unless GGML_EXT_PREFIX
# is set (the quantizers' scale choice calls ggml on the host; no CUDA build is needed).
# Usage (device, repository root):
#   bash scripts/device_ooc.sh SMOLLM2_HF WIKI_TRAIN WIKI_TEST [OUTDIR]      (OUTDIR default $OUT)
# Assets: as for device_kvquant.sh (scripts/device_assets.py joins and dequantizes the carried pieces).
# Environment: PYTHON (default python3), DEVICE (cuda), CONFIGS (q4_0:8,q2_k:2; q2_k is skipped while
# methods/grids.py has no Q2_K grid), S (0.1,0.2,0.5,1), CALIB (16x512), CHUNKS (20), FLOW (both).
set -euo pipefail
hf=$1 train=$2 test=$3 out=${4:-${OUT:?give OUTDIR or set OUT}}
PY=${PYTHON:-python3}
mkdir -p "$out"
if [ -z "${GGML_EXT_PREFIX:-}" ]; then
  build=${BUILD_DIR:-/tmp/ggml-ext-ooc}
  cmake -S . -B "$build" -G Ninja -DPython3_EXECUTABLE="$(command -v "$PY")" >"$out/configure.log" 2>&1
  cmake --build "$build" -j "$(nproc)" --target ggml_ext_all >"$out/build.log" 2>&1
  cmake --install "$build" --component ggml_ext --prefix "$build/install" >/dev/null
  export GGML_EXT_PREFIX=$build/install/ggml_ext
fi
export LD_LIBRARY_PATH=$GGML_EXT_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
CALIB=${CALIB:-16x512}
{ date -u; git rev-parse --short HEAD 2>/dev/null || true; nvidia-smi -L 2>/dev/null || echo "no GPU"; nproc; } >"$out/summary.txt"
PYTHONPATH=python "$PY" scripts/bench_ooc.py --models smollm2 --hf "smollm2=$hf" --train "$train" --test "$test" \
  --device "${DEVICE:-cuda}" --configs "${CONFIGS:-q4_0:8,q2_k:2}" --s "${S:-0.1,0.2,0.5,1}" \
  --calib-samples "${CALIB%x*}" --calib-seq-len "${CALIB#*x}" --chunks "${CHUNKS:-20}" --flow "${FLOW:-both}" \
  --json "$out/ooc.json" 2> >(tee -a "$out/bench.log" >&2) | tee -a "$out/summary.txt"
