#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "GPU path": pristine upstream's CUDA mat-vec per type and 7B-shaped llama-bench.
# The pristine upstream CUDA baseline on the device (issues 15 and 17): the pinned llama.cpp built unpatched
# with GGML_CUDA=ON, then, in one run,
#   mat-vec  bench/device/bench_mul_mat_backend.cpp against that build's ggml: F16 (ggml-cuda's own f16 path),
#            Q4_0, Q4_K, Q3_K, Q2_K, IQ2_S at the Llama shapes 4096x4096, 11008x4096, 4096x11008, 14336x4096
#            (M x K), batch N = 1 and 8, in us per op and weight GB/s (weights streamed from memory: each
#            graph cycles over copies whose total exceeds the L2 cache)
#   model    llama-bench -ngl 99 pp512 / tg128 of Llama-2-7B-shaped files (bench/runtime/make_bench_gguf.py, random
#            codes, tokenizer from TEMPLATE) with every matrix Q2_K, Q3_K, Q4_0, Q4_K, IQ2_S
# With OURS=PREFIX (an installed ggml_ext of ours, e.g. /tmp/bc/install/ggml_ext) the same two parts run on our
# build too, CB2 and CB3 added, so both builds' rows come from one call.
# Usage (device, repository root):
#   SRC=/tmp/src/llama.cpp-0c1e57098 TEMPLATE=.dev15j/ggml-vocab-llama-spm.gguf bash bench/device/device_gpu_baseline.sh $OUT
# Environment: UP (build dir, default /tmp/up-cuda; reused on a warm machine), SHAPES, TYPES, MODEL=0 (skip
# llama-bench), MATVEC=0, OURS.
set -uo pipefail
top=${1:?OUT}; mkdir -p "$top"
SRC=${SRC:?pinned llama.cpp source (the .dev15i tarball unpacked)}; UP=${UP:-/tmp/up-cuda}
TEMPLATE=${TEMPLATE:-.dev15j/ggml-vocab-llama-spm.gguf}
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
SHAPES=${SHAPES:-"4096x4096 11008x4096 4096x11008 14336x4096"}
TYPES=${TYPES:-"f16 q4_0 q4_K q3_K q2_K iq2_s"}
sum=$top/gpu_baseline.txt
say() { echo "$*" | tee -a "$sum"; }
say "device_gpu_baseline: $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
command -v nvidia-smi >/dev/null && nvidia-smi -L | tee -a "$sum"
t0=$(date +%s)
{ [ -f "$UP/build.ninja" ] || cmake -S "$SRC" -B "$UP" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release > "$top/up-build.log" 2>&1; } &&
  cmake --build "$UP" -j "$(nproc)" --target llama-bench >> "$top/up-build.log" 2>&1 ||
  { tail -40 "$top/up-build.log" | tee -a "$sum"; exit 1; }
say "pristine upstream CUDA build: $(( $(date +%s) - t0 )) s"
ULIB=$UP/bin
c++ -O2 -std=c++17 bench/device/bench_mul_mat_backend.cpp -I"$SRC/ggml/include" -L"$ULIB" -lggml -lggml-base \
    -Wl,-rpath,"$ULIB" -o /tmp/bmm-up || exit 1
builds="upstream:/tmp/bmm-up:$ULIB/llama-bench"
if [ -n "${OURS:-}" ]; then
  c++ -O2 -std=c++17 bench/device/bench_mul_mat_backend.cpp -I"$OURS/include" -L"$OURS/lib" -lggml -lggml-base \
      -Wl,-rpath,"$OURS/lib" -o /tmp/bmm-ours || exit 1
  builds="$builds ours:/tmp/bmm-ours:$OURS/bin/llama-bench"
fi
if [ "${MATVEC:-1}" != 0 ]; then
  say "## mat-vec: build type M K N us/op weight-GB/s"
  for b in $builds; do
    IFS=: read -r name bmm _ <<< "$b"
    types=$TYPES; [ "$name" = ours ] && types="$TYPES cb2 cb3"
    for n in 1 8; do for s in $SHAPES; do for t in $types; do
      r=$("$bmm" "$t" "${s%x*}" "${s#*x}" "$n" --backend CUDA0 2>&1 | tail -1); say "$name $r"
    done; done; done
  done
fi
if [ "${MODEL:-1}" != 0 ]; then
  mkdir -p /tmp/gb-models
  for t in q2_k q3_k q4_0 q4_k iq2_s ${OURS:+cb2 cb3}; do
    [ -f /tmp/gb-models/$t.gguf ] || PYTHONPATH=$PWD/python $PY bench/runtime/make_bench_gguf.py "$TEMPLATE" \
        /tmp/gb-models/$t.gguf --type $t >> "$top/make.log" 2>&1 || say "make $t failed"
  done
  say "## llama-bench -ngl 99 -p 512 -n 128 -r 3 (Llama-2-7B shape, 32 layers)"
  for b in $builds; do
    IFS=: read -r name _ lb <<< "$b"
    for t in q2_k q3_k q4_0 q4_k iq2_s cb2 cb3; do
      [ -f /tmp/gb-models/$t.gguf ] || continue
      [ "$name" = upstream ] && case $t in cb*) continue;; esac
      "$lb" -m /tmp/gb-models/$t.gguf -ngl 99 -p 512 -n 128 -r 3 -o md 2>>"$top/bench.err" | grep -E '^\| ' | tail -n +2 |
        sed "s/^/$name /" | tee -a "$sum"
    done
  done
fi
