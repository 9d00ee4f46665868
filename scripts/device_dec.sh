#!/usr/bin/env bash
# QDEC's fused CUDA kernel (DEC_MUL_MAT, ggml_ext/src/cuda/dec_mul_mat.cu) on the device machine (issue 18).
#   bash scripts/device_dec.sh OUT          (on the device: bash scripts/device_dec.sh $OUT)
# MODE (default all):
#   test    build our CUDA tree (device_lib.sh) and run make test-cuda twice: test_ext_ops' DEC cases compare
#           the kernel with the CPU reference (Llama-3-8B shapes and odd ones, k_chunk 0/8/16/64, approximate
#           and exact top-k, r in GPU and in pinned host memory, cooperative and two-kernel launch)
#   bench   base GEMV + DEC time normalised to the base GEMV alone (scripts/bench_dec_cuda.cpp) for the
#           Llama-3-8B shapes 4096x4096, 1024x4096, 14336x4096, 4096x14336 (Q4_0 base weights, one token),
#           over k_chunk (K_LIST, default 0,8,16,32,64,128) and n_tb (NTB_LIST, default 0 = one per SM,
#           and 8,16,33,66,132,264); residuals in pinned host memory (zero-copy over PCIe); then the same with
#           the residuals in GPU memory (the HBM side of the bandwidth argument, docs/QDEC.md), the
#           cooperative and the two-kernel launch without CUDA graphs, and the exact top-k.
#           Writes $OUT/dec_bench.md (the markdown table) and the summary.
#   all     test, then bench
# Environment: SHAPES (default "4096x4096 1024x4096 14336x4096 4096x14336"), ITERS (50), REPS (32),
# BUILD (the build folder, default /tmp/bc), SKIP_TESTS=1 (= MODE bench).
set -uo pipefail
cd "$(dirname "$0")/.."
top=${1:?usage: device_dec.sh OUT}
MODE=${MODE:-all}
. scripts/device_lib.sh
device_setup "$top" "device_dec ($MODE)"
device_build_cuda

if [ "$MODE" != bench ] && [ -z "${SKIP_TESTS:-}" ]; then
    device_test_cuda '^(OK|FAILED|DEC|APQ:|APQ GPU)' 30
fi
[ "$MODE" = test ] && exit 0

SHAPES=${SHAPES:-4096x4096 1024x4096 14336x4096 4096x14336}
K_LIST=${K_LIST:-0,8,16,32,64,128}
NTB_LIST=${NTB_LIST:-0,8,16,33,66,132,264}
bench_bin=$B/bench-dec-cuda
"${CXX:-g++}" -O2 -std=c++17 scripts/bench_dec_cuda.cpp -I"$P/include" -L"$P/lib" -lggml -lggml-base \
    -Wl,-rpath,"$P/lib" -o "$bench_bin" > "$out/bench-build.log" 2>&1 ||
    { say "bench_dec_cuda build FAILED"; tail -20 "$out/bench-build.log" | tee -a "$out/summary.txt"; exit 1; }

table=$top/dec_bench.md
hdr='| M x K | r | launch | top-k | k_chunk | n_tb | base us | base+DEC us | ratio | residual GB/s |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |'
run() {  # title, then env assignments and bench args
    local title=$1; shift
    { echo; echo "### $title"; echo; echo "$hdr"; } >> "$table"
    for sh in $SHAPES; do
        env "$@" "$bench_bin" "${sh%x*}" "${sh#*x}" --iters "${ITERS:-50}" --reps "${REPS:-32}" \
            ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} >> "$table" 2>> "$out/bench.log" ||
            echo "| ${sh} | FAILED (rc $?, bench.log) |" >> "$table"
    done
}
{ echo "# DEC_MUL_MAT on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"
  echo
  echo "ratio = (base GEMV + DEC) / base GEMV alone, per linear at one token; Q4_0 base weights; residual GB/s ="
  echo "selected residual bytes / (DEC time - base time). launch auto = cooperative (grid.sync) when n_tb blocks fit."; } > "$table"

BENCH_ARGS=(--k "$K_LIST" --ntb "$NTB_LIST" --r host)
run "residuals in pinned host memory (zero-copy), approximate top-k, ggml-cuda defaults (CUDA graphs)"
BENCH_ARGS=(--k "$K_LIST" --ntb 0 --r device)
run "residuals in GPU memory (reference for the PCIe cost), approximate top-k"
BENCH_ARGS=(--k 8,16,64 --ntb 0,132)
run "cooperative launch (grid.sync), no CUDA graphs, residuals in host memory" GGML_CUDA_DISABLE_GRAPHS=1 GGML_EXT_DEC_LAUNCH=coop
run "two-kernel launch, no CUDA graphs, residuals in host memory" GGML_CUDA_DISABLE_GRAPHS=1 GGML_EXT_DEC_LAUNCH=split
run "two-kernel launch under CUDA graphs, residuals in host memory" GGML_EXT_DEC_LAUNCH=split
BENCH_ARGS=(--k 8,16,64 --ntb 0 --mode exact)
run "exact top-k (evaluation variant), residuals in host memory"

say "bench: $table"
grep -c '^| [0-9]' "$table" | xargs -I{} echo "rows: {}" | tee -a "$out/summary.txt"
grep -q FAILED "$table" && { say "some bench rows FAILED:"; grep FAILED "$table" | tee -a "$out/summary.txt"; }
cat "$table"
