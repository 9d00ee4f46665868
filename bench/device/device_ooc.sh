#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "GPTQ and OOC": OOC against GPTQ perplexity on whole models.
# OOC(h,l,p,s) vs GPTQ(l) perplexity on the device (docs/GPTQ.md "OOC"): bench/gptq/bench_ooc.py with the
# calibration layers, GPTQ and OOC on the GPU and perplexity by our CPU llama-perplexity, which must be
# built from this branch (patch 0303's OOC side-car loader). Builds ours CPU-only unless GGML_EXT_PREFIX
# is set (the quantizers' scale choice calls ggml on the host; no CUDA build is needed); BUILD_DIR
# (/tmp/ggml-ext-ooc) is reused by later calls on a warm machine.
# Usage (device, repository root):
#   bash bench/device/device_ooc.sh HF_DIR WIKI_TRAIN WIKI_TEST [OUTDIR]      (OUTDIR default $OUT)
# Assets: as for device_kvquant.sh (bench/device/device_assets.py joins and dequantizes the carried pieces).
# Environment: PYTHON (default python3), DEVICE (cuda), MODEL (smollm2 | gemma3: which model HF_DIR is),
#   CONFIGS (q4_0:8,q2_k:2; TYPE:H), S (0.1,0.2,0.5,1), GPTQ (1: with the GPTQ(l) rows; 0: OOC rows only,
#   for a sweep split over calls), CALIB (16x512), CHUNKS (20), FLOW (both).
#   PART=build: only the build (a fresh machine's first call; later calls on the warm machine reuse it).
#   PART=baseline: instead, GPTQ into TYPES (q3_k,q2_k) against rtn, rtn + imatrix and llama-quantize +
#   imatrix, the imatrix from the same CALIB tokens of WIKI_TRAIN (bench/device/device_gptq.sh MODE=ppl for MODEL).
# One call must fit the device's 10 minutes: docs/GPTQ.md "OOC" lists the calls of the full sweep.
set -euo pipefail
hf=$1 train=$2 test=$3 out=${4:-${OUT:?give OUTDIR or set OUT}}
PY=${PYTHON:-python3}
MODEL=${MODEL:-smollm2}
case $MODEL in smollm2|gemma3) ;; *) echo "unknown MODEL $MODEL (smollm2 | gemma3)" >&2; exit 2 ;; esac
mkdir -p "$out"
if [ -z "${GGML_EXT_PREFIX:-}" ]; then
  build=${BUILD_DIR:-/tmp/ggml-ext-ooc}
  cmake -S . -B "$build" -G Ninja -DPython3_EXECUTABLE="$(command -v "$PY")" >"$out/configure.log" 2>&1
  cmake --build "$build" -j "$(nproc)" --target ggml_ext_all >"$out/build.log" 2>&1
  cmake --install "$build" --component ggml_ext --prefix "$build/install" >/dev/null
  export GGML_EXT_PREFIX=$build/install/ggml_ext
fi
export LD_LIBRARY_PATH=$GGML_EXT_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ "${PART:-ooc}" = build ] && { echo "built: $GGML_EXT_PREFIX" | tee -a "$out/summary.txt"; exit 0; }
CALIB=${CALIB:-16x512}
if [ "${PART:-ooc}" = baseline ]; then
  var=$(echo "$MODEL" | tr a-z A-Z)_HF
  env MODE=ppl MODELS="$MODEL" "$var=$hf" TRAIN="$train" TEST="$test" CALIB="$CALIB" CHUNKS="${CHUNKS:-20}" \
    TYPES="${TYPES:-q3_k,q2_k}" DEVICE="${DEVICE:-cuda}" bash bench/device/device_gptq.sh "$out"
  exit 0
fi
{ date -u; git rev-parse --short HEAD 2>/dev/null || true; nvidia-smi -L 2>/dev/null || echo "no GPU"; nproc; } >>"$out/summary.txt"
tag=$MODEL-$(echo "${CONFIGS:-q4_0:8,q2_k:2}-s${S:-0.1,0.2,0.5,1}" | tr ':,' '_-')
PYTHONPATH=python "$PY" bench/gptq/bench_ooc.py --models "$MODEL" --hf "$MODEL=$hf" --train "$train" --test "$test" \
  --device "${DEVICE:-cuda}" --configs "${CONFIGS:-q4_0:8,q2_k:2}" --s "${S:-0.1,0.2,0.5,1}" \
  --calib-samples "${CALIB%x*}" --calib-seq-len "${CALIB#*x}" --chunks "${CHUNKS:-20}" --flow "${FLOW:-both}" \
  $([ "${GPTQ:-1}" = 0 ] && echo --no-gptq) \
  --json "$out/ooc-$tag.json" 2> >(tee -a "$out/bench-$tag.log" >&2) | tee -a "$out/summary.txt"
