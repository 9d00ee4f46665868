#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "CPU roofline" on the device host's CPU (a quiet many-core x86-64 host): CPU-only builds
# of ours and of the pristine upstream (both -march=native, AMX compiled out as cmake/ggml-ext-amx.cmake says), then
# bench/runtime/bench_roofline.py: 7B-shaped files of every format we write against upstream's nearest type,
# llama-bench at 1 and 2 threads, the builds taking turns to go first, the read bandwidth measured in the same run.
# With AVX2=1 both builds are made for AVX2 (-DGGML_NATIVE=OFF -DGGML_AVX2=ON ...): the AVX2-only rows.
# Usage (device, repository root): SRC=/tmp/src/llama.cpp-0c1e57098 TEMPLATE=.device/ggml-vocab-llama-spm.gguf \
#   bash bench/device/device_cpu_roofline.sh $OUT [bench_roofline.py options]
set -uo pipefail
top=${1:?OUT}; shift; mkdir -p "$top"
SRC=${SRC:?pinned llama.cpp source}; TEMPLATE=${TEMPLATE:?a GGUF with a llama tokenizer}
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export GGML_EXT_LLAMA_CPP_SRC=$SRC
sfx=native; simd=(); ours_simd=()
if [ "${AVX2:-0}" = 1 ]; then
  sfx=avx2
  simd=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
  ours_simd=(-DGGML_EXT_NATIVE=OFF "${simd[@]:1}")
fi
B=/tmp/roof-ours-$sfx; UPB=/tmp/roof-up-$sfx; t0=$(date +%s)
{ [ -f "$B/build.ninja" ] || cmake -S . -B "$B" -G Ninja -DGGML_EXT_CUDA=OFF -DPython3_EXECUTABLE="$(command -v $PY)" \
      "${ours_simd[@]}"; } > "$top/build-ours-$sfx.log" 2>&1 &&
  cmake --build "$B" -j "$(nproc)" --target ggml_ext_all >> "$top/build-ours-$sfx.log" 2>&1 &&
  cmake --install "$B" --component ggml_ext --prefix "$B/install" >> "$top/build-ours-$sfx.log" 2>&1 &
UPSTREAM_BUILD_DIR=$UPB UPSTREAM_CMAKE_ARGS="${simd[*]}" PYTHON=$PY JOBS=$(nproc) bash scripts/build_upstream.sh \
  > "$top/build-up-$sfx.log" 2>&1 || { tail -30 "$top/build-up-$sfx.log"; exit 1; }
wait || true
[ -x "$B/install/ggml_ext/bin/llama-bench" ] || { tail -30 "$top/build-ours-$sfx.log"; exit 1; }
echo "builds ($sfx): $(( $(date +%s) - t0 )) s on $(nproc) cores"
export PYTHONPATH=$PWD/python GGML_EXT_PREFIX=$B/install/ggml_ext
$PY bench/runtime/bench_roofline.py --ours "$B/install/ggml_ext/bin" --upstream "$UPB/bin" --template "$TEMPLATE" \
  --work /tmp/roof-files --json "$top/roofline-$sfx.json" "$@" | tee "$top/roofline-$sfx.md"
