#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "GPTQ and OOC": OOC's batched candidates on the GPU.
# OOC quantization time on the lent GPU for Llama-7B-shaped layers (random weights, seeded; docs/GPTQ.md
# "OOC on a GPU"): bench/gptq/bench_ooc_speed.py -- plain GPTQ vs OOC with one sweep per candidate group
# (implementation="reference") vs all candidates in one batched sweep (ooc.py gptq_hlps_batched), and both flows
# in one sweep; first the checks on the GPU: Q4_0 block scales chosen on the device equal ggml's, and
# batched and sequential OOC give the same group, bytes and side-car (exit 1 otherwise).
# Usage (repository root, on the device): bash bench/device/device_ooc_speed.sh [OUTDIR]   (default $OUT)
#   GGML_EXT_PREFIX=...  an installed build; unset: a CPU-only build of ours is made in $BUILD_DIR
#     (the non-Q4_0 scale choice and the checks call ggml's quantizer on the host; no CUDA build needed)
#   S (0.1)  scanned fractions, comma-separated; SHAPES (4096x4096,11008x4096,4096x11008); TYPE (q4_0)
#   CHECK (576x1536,2048x2048)  shapes checked batched vs sequential on the GPU; CHECK= skips the checks
#   SIZE=tiny  CPU-only smoke run at small shapes
# Writes OUTDIR/ooc-speed.md (the table), OUTDIR/ooc-speed.json and OUTDIR/summary.txt.
# Runtime on the H100 (estimated from the GPTQ timings, not yet measured): build ~3-4 min (skipped with a
# prefix), checks ~30 s, timings at S=0.1: 4096x4096 ~30 s, 11008x4096 ~50 s, 4096x11008 (9 candidates,
# the sequential OOC ~2 min of it) ~2.5 min. If one call risks the 10 minutes, split it: first
#   SHAPES=4096x4096,11008x4096 bash bench/device/device_ooc_speed.sh "$OUT"
# then on the warm machine (the build kept in /tmp/ggml-ext-ooc-speed)
#   GGML_EXT_PREFIX=/tmp/ggml-ext-ooc-speed/install/ggml_ext CHECK= SHAPES=4096x11008 bash bench/device/device_ooc_speed.sh "$OUT"
set -euo pipefail
out=${1:-${OUT:?give OUTDIR or set OUT}}
mkdir -p "$out"
PY=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
{ date -u; git rev-parse --short HEAD 2>/dev/null || true; nvidia-smi -L 2>/dev/null || echo "no GPU"; nproc; } >"$out/summary.txt"
if [ -z "${GGML_EXT_PREFIX:-}" ]; then
  build=${BUILD_DIR:-/tmp/ggml-ext-ooc-speed}
  t0=$(date +%s)
  cmake -S . -B "$build" -G Ninja -DPython3_EXECUTABLE="$(command -v "$PY")" >"$out/configure.log" 2>&1
  cmake --build "$build" -j "$(nproc)" --target ggml_ext_all >"$out/build.log" 2>&1
  cmake --install "$build" --component ggml_ext --prefix "$build/install" >/dev/null
  export GGML_EXT_PREFIX=$build/install/ggml_ext
  echo "build (ours, CPU): $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
fi
export LD_LIBRARY_PATH=$GGML_EXT_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ "${SIZE:-full}" = tiny ]; then
  device=cpu check=64x256 shapes=128x512,256x256
else
  device=cuda check=${CHECK-576x1536,2048x2048} shapes=${SHAPES:-4096x4096,11008x4096,4096x11008}
fi
t0=$(date +%s)
rc=0
PYTHONPATH=python "$PY" bench/gptq/bench_ooc_speed.py --device "$device" --type "${TYPE:-q4_0}" --check "$check" \
  --shapes "$shapes" --s "${S:-0.1}" --cpu-threads "$(nproc)" --json "$out/ooc-speed.json" \
  >"$out/ooc-speed.md" 2>"$out/ooc-speed.log" || rc=$?
{ echo "== bench_ooc_speed: exit $rc, $(( $(date +%s) - t0 )) s"; cat "$out/ooc-speed.md"; } | tee -a "$out/summary.txt"
[ $rc -eq 0 ] || tail -n 30 "$out/ooc-speed.log" | tee -a "$out/summary.txt"
exit $rc
