#!/usr/bin/env bash
# The KVQuant decode op on CUDA (issue 20, docs/KVQUANT.md "The decode op", "The CUDA path";
# ggml_ext/src/cuda/kvattn_cuda.cu) on the device machine, in one run of a few minutes:
#   build    our CUDA tree (device_lib.sh's device_build_cuda: GGML_EXT_CUDA=ON, sm_90)
#   test     scripts/test_cuda.sh once (tests/c/test_kvattn_cuda.cpp among its programs: the op's three nodes on
#            the GPU within NMSE 1e-6 of the CPU op on the same bound caches)
#   check    GGML_EXT_KV_ATTN=check on Gemma-3-270M (llama-bench -d CHECK_DEPTH -n 4 -r 1): the op on the GPU beside
#            the dequantize-and-rope reference in the same graph, each layer's max difference on stderr
#   bench    llama-bench -ngl 99 -fa 1 -p 0 -n NGEN -r REPS -d D (D in DEPTHS) -ctk nuq3 -ctv nuq3 --kv-calib
#            $GEMMA_CALIB, GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1: GGML_EXT_KV_ATTN=ref (the old path:
#            dequantize + rope the whole cache, flash attention on an f16 V copy) against the default (the decode op
#            on the GPU), and our f16 cache (the same build's f16 flash attention) as the bar
# Usage (device, repository root):
#   GEMMA_CALIB=/tmp/assets/gemma3-kv.gguf bash scripts/device_kvattn_cuda.sh $OUT
# Environment: GEMMA_GGUF (default /tmp/assets/gemma-3-270m-q4_k_m.gguf), GEMMA_CALIB (required for check / bench),
#   DEPTHS ("8192 32768"), NGEN (64), REPS (3), CHECK_DEPTH (1024), BUILD (/tmp/bc), STEPS ("test check bench").
set -uo pipefail
cd "$(dirname "$0")/.."
top=${1:?usage: device_kvattn_cuda.sh OUT}
. scripts/device_lib.sh
device_setup "$top" "device_kvattn_cuda"
STEPS=${STEPS:-test check bench}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
A=${ASSETS:-/tmp/assets}
GEMMA_GGUF=${GEMMA_GGUF:-$A/gemma-3-270m-q4_k_m.gguf}
GEMMA_CALIB=${GEMMA_CALIB:-}
DEPTHS=${DEPTHS:-8192 32768}
NGEN=${NGEN:-64}
REPS=${REPS:-3}
device_build_cuda

if has test; then
    device_test_cuda "^OK|^FAIL|NMSE|SKIP" 40 1
fi
[ -n "$GEMMA_CALIB" ] && [ -s "$GEMMA_CALIB" ] || { say "GEMMA_CALIB not set or missing: check / bench skipped"; exit 0; }
kv=(-ctk nuq3 -ctv nuq3 --kv-calib "$GEMMA_CALIB")
if has check; then
    log=$out/check.log
    GGML_EXT_KV_ATTN=check GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 timeout 300 "$BIN/llama-bench" -m "$GEMMA_GGUF" \
        -p 0 -n 4 -r 1 -d "${CHECK_DEPTH:-1024}" -ngl 99 -fa 1 "${kv[@]}" > "$log" 2>&1
    say "check (GGML_EXT_KV_ATTN=check, depth ${CHECK_DEPTH:-1024}): rc=$? | $(awk '/kv-attn check:/ {n++; d = $(NF - 3) + 0; r = $NF + 0; if (d > md) md = d; if (r > mr) mr = r} END {printf "%d layer checks, largest |op - ref| %.4g, largest |ref| %.4g", n, md, mr}' "$log")"
    grep "not taken\|error\|abort" "$log" | head -5 | tee -a "$out/summary.txt"
fi
row() {  # label env... -- depth -> "tg | stddev"
    local label=$1 d=$2 log r
    shift 2
    log=$out/bench-$label-$d.log
    r=$(env "$@" GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 timeout 900 "$BIN/llama-bench" -m "$GEMMA_GGUF" -p 0 \
        -n "$NGEN" -r "$REPS" -d "$d" -ngl 99 -fa 1 -o json "${ARGS[@]}" 2> "$log")
    echo "$r" >> "$log"
    echo "$r" | "$PY" -c "import json,sys; x=json.load(sys.stdin)[0]; print(f\"{x['avg_ts']:.1f} | {x['stddev_ts']:.1f}\")" 2>/dev/null ||
        echo "FAILED ($(basename "$log")) |"
}
if has bench; then
    table=$top/kvattn_cuda_bench.md
    { echo "# KVQuant decode op on CUDA: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit $(git rev-parse --short HEAD)"
      echo
      echo "llama-bench -ngl 99 -fa 1 -p 0 -n $NGEN -r $REPS on $(basename "$GEMMA_GGUF"); nuq3 rows with --kv-calib $(basename "$GEMMA_CALIB")"
      echo "GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1; ref = GGML_EXT_KV_ATTN=ref (dequantize-and-rope path), op = default."
      echo
      echo "| cache | path | depth | tg t/s | stddev |"
      echo "| --- | --- | --- | --- | --- |"; } > "$table"
    for d in $DEPTHS; do
        ARGS=(-ctk f16 -ctv f16)
        echo "| f16 | upstream FA | $d | $(row f16 "$d" GGML_EXT_KV_ATTN=auto) |" | tee -a "$table" >> "$out/summary.txt"
        ARGS=("${kv[@]}")
        echo "| nuq3 | ref | $d | $(row ref "$d" GGML_EXT_KV_ATTN=ref) |" | tee -a "$table" >> "$out/summary.txt"
        echo "| nuq3 | op | $d | $(row op "$d" GGML_EXT_KV_ATTN=auto) |" | tee -a "$table" >> "$out/summary.txt"
    done
    say "table: $table"
    cat "$table"
fi
