#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "QDEC": CUDA correctness, the DEC node's cost, and llama.cpp end to end with the tuner.
# QDEC's fused CUDA kernel (DEC_MUL_MAT, ggml_ext/src/cuda/dec_mul_mat.cu) on the device machine (issue 18).
#   bash bench/device/device_dec.sh OUT          (on the device: bash bench/device/device_dec.sh $OUT)
# MODE (default all):
#   test    build our CUDA tree (device_lib.sh) and run make test-cuda twice: test_ext_ops' DEC cases compare
#           the kernel with the CPU reference (Llama-3-8B shapes and odd ones, k_chunk 0/8/16/64, approximate
#           and exact top-k, r in GPU and in pinned host memory, cooperative and two-kernel launch)
#   bench   base GEMV + DEC time normalised to the base GEMV alone (bench/device/bench_dec_cuda.cpp) for the
#           Llama-3-8B shapes 4096x4096, 1024x4096, 14336x4096, 4096x14336 (Q4_0 base weights, one token),
#           over k_chunk (K_LIST, default 0,8,16,32,64,128) and n_tb (NTB_LIST, default 0 = one per SM,
#           and 8,16,33,66,132,264); residuals in pinned host memory (zero-copy over PCIe); then the same with
#           the residuals in GPU memory (the HBM side of the bandwidth argument, docs/QDEC.md), the
#           cooperative and the two-kernel launch without CUDA graphs, and the exact top-k.
#           Writes $OUT/dec_bench.md (the markdown table) and the summary.
#   all     test, then bench
#   tune    QDEC in llama.cpp end to end (issue 18): the default model (HF folder $HF, default
#           /tmp/assets/smollm2-hf from bench/device/device_assets.py) converted to f16 and quantized to Q4_0 by our
#           llama-quantize on the device, `ggml-ext calibrate dec` on the CPU (CAL_DEVICE=cuda for the GPU: torch 2.11 on the device raised an internal assert in the calibration hook there once our CUDA library was loaded in the same process; $TRAIN text, CALIB 16x512),
#           `ggml-ext tune dec` (targets TARGETS, default 2.5,5,10,20; BUDGET_S, default 300), then
#           llama-bench tg (TG tokens, default 128, 5 reps) with DEC off, each target's config, and uniform
#           k_chunk 4..128 at the chosen n_tb, and prints the knee (the largest uniform k_chunk within 2.5 %).
#           Writes $OUT/dec_tune.md, the configs under $OUT/dec-tune/, and the side file's log. Before
#           tuning, a correctness check through llama.cpp: perplexity with ubatches of one token ($TEST, else
#           $TRAIN; 4 x 128 tokens) DEC off / k 16 on the GPU / k 16 on the CPU / k 1024 (CHECK_ONLY=1 stops
#           there). Convert + calibrate are skipped when $WORK (/tmp/dec-tune) holds their files (a rerun
#           on a warm machine).
# Environment: SHAPES (default "4096x4096 1024x4096 14336x4096 4096x14336"), ITERS (50), REPS (32),
# BUILD (the build folder, default /tmp/bc), SKIP_TESTS=1 (= MODE bench).
set -uo pipefail
cd "$(dirname "$0")/../.."
top=${1:?usage: device_dec.sh OUT}
MODE=${MODE:-all}
. bench/device/device_lib.sh
device_setup "$top" "device_dec ($MODE)"
device_build_cuda

if [ "$MODE" = tune ]; then
    HF=${HF:-/tmp/assets/smollm2-hf}
    TRAIN=${TRAIN:?TRAIN=path of a calibration text (wiki-train) on the device}
    CALIB=${CALIB:-16x512}
    TG=${TG:-128}
    w=${WORK:-/tmp/dec-tune}
    mkdir -p "$w"
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$out/summary.txt"
    t0=$(date +%s)
    if [ ! -s "$w/q4_0.gguf" ]; then
        "$PY" -m ggml_ext.cli convert "$HF" -o "$w/f16.gguf" --type f16 > "$out/convert.log" 2>&1 &&
            "$BIN/llama-quantize" "$w/f16.gguf" "$w/q4_0.gguf" Q4_0 "$jobs" >> "$out/convert.log" 2>&1 ||
            { say "convert/quantize FAILED"; tail -20 "$out/convert.log" | tee -a "$out/summary.txt"; exit 1; }
    fi
    say "base: $w/q4_0.gguf ($(( $(date +%s) - t0 )) s)"
    t0=$(date +%s)
    if [ ! -s "$w/q4_0.dec.gguf" ]; then
        "$PY" -m ggml_ext.cli calibrate dec "$w/q4_0.gguf" --hf "$HF" -o "$w/q4_0.dec.gguf" --text "$TRAIN" \
            --samples "${CALIB%x*}" --seq-len "${CALIB#*x}" --device "${CAL_DEVICE:-cpu}" > "$out/calibrate.log" 2>&1 ||
            { say "calibrate dec FAILED"; tail -20 "$out/calibrate.log" | tee -a "$out/summary.txt"; exit 1; }
    fi
    say "side file: $(tail -1 "$out/calibrate.log" 2>/dev/null) ($(( $(date +%s) - t0 )) s)"
    # correctness through llama.cpp: perplexity with ubatches of one token (DEC on every linear of every
    # token) on the GPU and on the CPU (-ngl 0) must agree, and be below DEC off's
    ppl() {  # label, then env assignments and extra args after --
        local label=$1; shift
        local envs=() ; while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
        local v
        v=$(env "${envs[@]}" "$BIN/llama-perplexity" -m "$w/q4_0.gguf" -f "${TEST:-$TRAIN}" -c 128 --chunks 4 -b 128 \
            -ub 1 "$@" 2>&1 | tee -a "$out/ppl.log" | grep -o 'Final estimate: PPL = [0-9.]*' | awk '{print $NF}')
        say "ppl (ubatch 1, 4 x 128 tokens) $label: ${v:-FAILED}"
    }
    ppl "DEC off, GPU" GGML_EXT_DEC= -- -ngl 99
    ppl "DEC k16, GPU" GGML_EXT_DEC="$w/q4_0.dec.gguf" GGML_EXT_DEC_K=16 -- -ngl 99
    ppl "DEC k16, CPU" GGML_EXT_DEC="$w/q4_0.dec.gguf" GGML_EXT_DEC_K=16 -- -ngl 0 -t "$jobs"
    ppl "DEC k1024 (every channel), GPU" GGML_EXT_DEC="$w/q4_0.dec.gguf" GGML_EXT_DEC_K=1024 -- -ngl 99
    [ -n "${CHECK_ONLY:-}" ] && exit 0
    t0=$(date +%s)
    "$PY" -m ggml_ext.cli tune dec "$w/q4_0.gguf" --dec "$w/q4_0.dec.gguf" --target "${TARGETS:-2.5,5,10,20}" \
        --budget-s "${BUDGET_S:-300}" -o "$top/dec-tune" > "$out/tune.md" 2> "$out/tune.log"
    rc=$?
    say "tune dec: exit $rc, $(( $(date +%s) - t0 )) s"
    cat "$out/tune.md" | tee -a "$out/summary.txt"
    [ $rc -eq 0 ] || { tail -20 "$out/tune.log" | tee -a "$out/summary.txt"; exit 1; }
    table=$top/dec_tune.md
    tg() {  # label, then env assignments: one llama-bench tg row
        local label=$1; shift
        local ts
        ts=$(env "$@" "$BIN/llama-bench" -m "$w/q4_0.gguf" -p 0 -n "$TG" -r 5 -ngl 99 -o json 2>> "$out/tg.log" |
            "$PY" -c "import json,sys; r=json.load(sys.stdin)[0]; print(f\"{r['avg_ts']:.1f} {r['stddev_ts']:.1f}\")") ||
            ts="FAILED -"
        echo "${ts}"  # tok/s stddev (the label is the caller's: it may hold spaces)
    }
    off=$(tg off)
    base_ts=$(echo "$off" | awk '{print $1}')
    { echo "# QDEC in llama.cpp: tg$TG of SmolLM2-135M Q4_0 on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"
      echo
      echo "| setting | tok/s | stddev | slowdown % |"
      echo "| --- | --- | --- | --- |"
      echo "| DEC off | $(echo "$off" | awk '{print $1" | "$2}') | 0 |"; } > "$table"
    row() { echo "$1" | awk -v b="$base_ts" -v l="$2" '{ s = ($1 > 0 && b > 0) ? (b / $1 - 1) * 100 : -1; printf "| %s | %s | %s | %.2f |\n", l, $1, $2, s }'; }
    for cfg in "$top"/dec-tune/dec-*.json; do
        t=$(basename "$cfg" .json); t=${t#dec-}
        r=$(tg "target $t" GGML_EXT_DEC="$w/q4_0.dec.gguf" GGML_EXT_DEC_CONFIG="$cfg")
        row "$r" "target $t % ($(grep -o '"dec_k": "[^"]*"' "$cfg" | cut -d'"' -f4); n_tb $(grep -o '"dec_ntb": "[^"]*"' "$cfg" | cut -d'"' -f4))" >> "$table"
    done
    ntb=$(grep -o '"dec_ntb": "[^"]*"' "$(ls "$top"/dec-tune/dec-*.json | head -1)" | cut -d'"' -f4)
    knee=0
    for k in 0 4 8 16 32 64 128; do
        r=$(tg "k $k" GGML_EXT_DEC="$w/q4_0.dec.gguf" GGML_EXT_DEC_K="$k" GGML_EXT_DEC_NTB="$ntb")
        row "$r" "uniform k_chunk $k (n_tb $ntb)" >> "$table"
        s=$(row "$r" x | awk -F'|' '{print $5}')
        awk -v s="$s" 'BEGIN { exit !(s >= 0 && s <= 2.5) }' && knee=$k
    done
    { echo; echo "knee: the largest uniform k_chunk within 2.5 % of DEC off: $knee"; } >> "$table"
    cat "$table" | tee -a "$out/summary.txt"
    exit 0
fi

if [ "$MODE" != bench ] && [ -z "${SKIP_TESTS:-}" ]; then
    device_test_cuda '^(OK|FAILED|DEC|APQ:|APQ GPU)' 30
fi
[ "$MODE" = test ] && exit 0

SHAPES=${SHAPES:-4096x4096 1024x4096 14336x4096 4096x14336}
K_LIST=${K_LIST:-0,8,16,32,64,128}
NTB_LIST=${NTB_LIST:-0,8,16,33,66,132,264}
bench_bin=$B/bench-dec-cuda
"${CXX:-g++}" -O2 -std=c++17 bench/device/bench_dec_cuda.cpp -I"$P/include" -L"$P/lib" -lggml -lggml-base \
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
  echo "selected residual bytes / (DEC time - base time). launch auto = the one-pass kernel (approximate top-k), else cooperative (grid.sync) when n_tb blocks fit."; } > "$table"

BENCH_ARGS=(--k "$K_LIST" --ntb 0 --r host)
run "one-pass kernel (the default), residuals in pinned host memory (zero-copy), approximate top-k, ggml-cuda defaults (CUDA graphs)" GGML_EXT_DEC_LAUNCH=onepass
BENCH_ARGS=(--k "$K_LIST" --ntb 0 --r device)
run "one-pass kernel, residuals in GPU memory (reference for the PCIe cost), approximate top-k" GGML_EXT_DEC_LAUNCH=onepass
BENCH_ARGS=(--k "$K_LIST" --ntb "$NTB_LIST" --r host)
run "cooperative launch (grid.sync) under CUDA graphs, residuals in host memory" GGML_EXT_DEC_LAUNCH=coop
BENCH_ARGS=(--k 8,16,64 --ntb 0)
run "one-pass kernel, no CUDA graphs, residuals in host memory" GGML_CUDA_DISABLE_GRAPHS=1 GGML_EXT_DEC_LAUNCH=onepass
run "two-kernel launch under CUDA graphs, residuals in host memory" GGML_EXT_DEC_LAUNCH=split
BENCH_ARGS=(--k 8,16,64 --ntb 0 --mode exact)
run "exact top-k (evaluation variant), residuals in host memory"

say "bench: $table"
grep -c '^| [0-9]' "$table" | xargs -I{} echo "rows: {}" | tee -a "$out/summary.txt"
grep -q FAILED "$table" && { say "some bench rows FAILED:"; grep FAILED "$table" | tee -a "$out/summary.txt"; }
cat "$table"
