#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "GPTQ and OOC": GPTQ into K-quant grids and GPTQ on the GPU.
# GPTQ timing on the lent GPU for Llama-7B-shaped layers (random weights, seeded): the batched torch
# implementation on CUDA vs the sequential numpy reference, and byte identity of the two.
# Usage (repository root, on the device): bash bench/device/device_gptq.sh [OUTDIR]   (default $OUT)
#   SIZE=tiny   CPU-only smoke run at small shapes (what CI / a laptop can do)
#   GGML_EXT_PREFIX=...   an installed build; unset: a CPU-only build of ours is made in $BUILD_DIR
#     (the scale choice calls ggml's quantizer on the host; no CUDA build is needed)
# Writes OUTDIR/gptq-<type>.json (bench_gptq_gpu.py --json) and OUTDIR/summary.txt.
#
# MODE=ppl: perplexity instead of timing (bench_gptq.py; docs/GPTQ.md "K-quants"): for each model of MODELS
#   (smollm2,gemma3; one model per call fits the device's 10 minutes) and type of TYPES (q3_k,q2_k):
#   f16, rtn, rtn + imatrix, GPTQ with the best known options (static scales, percdamp 0.1, v_proj's
#   attention-output Hessian; on the GPU), llama-quantize --pure + imatrix (like for like) and llama.cpp's
#   mixes (Q3_K_S, Q3_K_M, Q2_K) + imatrix, all from the same CALIB (16x512) tokens of TRAIN; wiki-test
#   ctx 512, CHUNKS (20) windows; bits per weight and tensor types per file.
#   GPTQ_EXTRA='LABEL:KEY=VALUE,...': one more GPTQ variant in the same run, e.g. k_proj's Hessian:
#   GPTQ_EXTRA='k-attn:scale_rule=static,percdamp=0.1,v_hessian=attention,k_hessian=attention'.
#   Needs SMOLLM2_HF / GEMMA3_HF (folders from bench/device/device_assets.py), TRAIN and TEST (the wiki texts).
#   Writes OUTDIR/ppl-<model>.md / .json / .log and appends the table to OUTDIR/summary.txt.
set -euo pipefail
out=${1:-${OUT:?give OUTDIR or set OUT}}
mkdir -p "$out"
PY=${PYTHON:-python3}
if [ -z "${GGML_EXT_PREFIX:-}" ]; then
  build=${BUILD_DIR:-/tmp/ggml-ext-gptq}
  cmake -S . -B "$build" -G Ninja -DPython3_EXECUTABLE="$(command -v python3)" >"$out/configure.log" 2>&1
  cmake --build "$build" -j "$(nproc)" --target ggml_ext_all >"$out/build.log" 2>&1
  cmake --install "$build" --component ggml_ext --prefix "$build/install" >/dev/null
  export GGML_EXT_PREFIX=$build/install/ggml_ext
fi
export LD_LIBRARY_PATH=$GGML_EXT_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ "${MODE:-time}" = ppl ]; then
  { date -u; git rev-parse --short HEAD 2>/dev/null || true; nvidia-smi -L 2>/dev/null || echo "no GPU"; nproc; } >>"$out/summary.txt"
  calib=${CALIB:-16x512}
  IFS=, read -ra models <<<"${MODELS:-smollm2,gemma3}"
  for m in "${models[@]}"; do
    case $m in smollm2) hf=${SMOLLM2_HF:?set SMOLLM2_HF} ;; gemma3) hf=${GEMMA3_HF:?set GEMMA3_HF} ;;
      *) echo "unknown model $m" >&2; exit 2 ;; esac
    t0=$(date +%s)
    rc=0
    PYTHONPATH=python "$PY" bench/gptq/bench_gptq.py --models "$m" --hf "$m=$hf" --types "${TYPES:-q3_k,q2_k}" \
      --calib-samples "${calib%x*}" --calib-seq-len "${calib#*x}" --chunks "${CHUNKS:-20}" --threads "$(nproc)" \
      --train "${TRAIN:?set TRAIN}" --test "${TEST:?set TEST}" --device "${DEVICE:-cuda}" \
      --gptq 'gptq-best:scale_rule=static,percdamp=0.1,v_hessian=attention' ${GPTQ_EXTRA:+--gptq "$GPTQ_EXTRA"} \
      --json "$out/ppl-$m.json" \
      >"$out/ppl-$m.md" 2>"$out/ppl-$m.log" || rc=$?
    { echo "== $m: exit $rc, $(( $(date +%s) - t0 )) s"; cat "$out/ppl-$m.md"; } | tee -a "$out/summary.txt"
    [ $rc -eq 0 ] || tail -n 20 "$out/ppl-$m.log" | tee -a "$out/summary.txt"
  done
  exit 0
fi
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
  PYTHONPATH=python "$PY" bench/gptq/bench_gptq_gpu.py --device "$device" --type "$type" --check "$check" \
    --shapes "$shapes" --reference "$reference" --repeat "$repeat" --cpu-max 0 --json "$out/gptq-$type.json" \
    | tee -a "$out/summary.txt"
done
