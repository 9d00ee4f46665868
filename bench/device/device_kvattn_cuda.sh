#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "KVQuant": the CUDA decode op against the dequantize-and-rope path.
# The KVQuant decode op on CUDA (issue 20, docs/KVQUANT.md "The decode op", "The CUDA path";
# ggml_ext/src/cuda/kvquant_attn_cuda.cu) on the device machine, in one run of a few minutes:
#   build    our CUDA tree (device_lib.sh's device_build_cuda: GGML_EXT_CUDA=ON, sm_90)
#   test     scripts/test_cuda.sh once (tests/c/test_kvattn_cuda.cpp among its programs: the op's three nodes on
#            the GPU within NMSE 1e-6 of the CPU op on the same bound caches)
#   check    GGML_EXT_KV_ATTN=check (llama-bench -d CHECK_DEPTH -n 4 -r 1): the op on the GPU (every graph, the
#            depth's 512-token prefill ubatches too) beside the dequantize-and-rope reference in the same graph; the
#            summary keeps the number of layer checks and the largest |op - ref| / max |ref| (test_kvquant_decode_attn.py
#            holds the CPU op under 3 %)
#   bench    llama-bench -ngl 99 -fa 1 -p 0 -n NGEN -r REPS -d D (D in DEPTHS) -ctk nuq3 -ctv nuq3 --kv-calib FILE,
#            GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1: GGML_EXT_KV_ATTN=ref (the old path: dequantize + rope the
#            whole cache, flash attention on an f16 V copy) against the default (the decode op on the GPU), and the
#            same build's f16 cache (upstream's f16 flash attention) as the bar
# Models: SmolLM2-135M (llama: a single cache, the glue's decode op as merged) with SMOL_CALIB, Gemma-3-270M
# (iSWA: takes the op through patch 0327's hook) with
# GEMMA_CALIB; a model without a calibration is skipped.
# Usage (device, repository root):
#   SMOL_CALIB=... GEMMA_CALIB=... bash bench/device/device_kvattn_cuda.sh $OUT
# Environment: SMOL_GGUF (default /tmp/assets/SmolLM2-135M-Instruct.Q4_1.gguf), GEMMA_GGUF (default
#   /tmp/assets/gemma-3-270m-q4_k_m.gguf), DEPTHS ("8192 32768"; SmolLM2 only up to 8192, its training length),
#   NGEN (64), REPS (3), CHECK_DEPTH (1024), BUILD (/tmp/bc), STEPS ("test check bench"), CHUNKS (e.g. "16 64":
#   extra op rows with GGML_EXT_KV_ATTN_CHUNK, cells per range; default none), SPLITS (e.g. "2 4": extra op rows
#   with GGML_EXT_KV_ATTN_SPLIT, the split kernel's build for 2 / 4 blocks per SM; default none). Every depth also
#   gets an "op, block kernel" row (GGML_EXT_KV_ATTN_SPLIT=0: the block kernel, the split kernel's fallback).
set -uo pipefail
cd "$(dirname "$0")/../.."
top=${1:?usage: device_kvattn_cuda.sh OUT}
. bench/device/device_lib.sh
device_setup "$top" "device_kvattn_cuda"
STEPS=${STEPS:-test check bench}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
A=${ASSETS:-/tmp/assets}
GEMMA_GGUF=${GEMMA_GGUF:-$A/gemma-3-270m-q4_k_m.gguf}
SMOL_GGUF=${SMOL_GGUF:-$A/SmolLM2-135M-Instruct.Q4_1.gguf}
DEPTHS=${DEPTHS:-8192 32768}
NGEN=${NGEN:-64}
REPS=${REPS:-3}
device_build_cuda

if has test; then
    device_test_cuda "^OK|^FAIL|NMSE|SKIP" 40 1
fi
row() {  # model label depth env... -> "tg | stddev"
    local m=$1 label=$2 d=$3 log r
    shift 3
    log=$out/bench-$(basename "$m" .gguf)-$label-$d.log
    r=$(env "$@" GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 timeout 900 "$BIN/llama-bench" -m "$m" -p 0 \
        -n "$NGEN" -r "$REPS" -d "$d" -ngl 99 -fa 1 -o json "${ARGS[@]}" 2> "$log")
    echo "$r" >> "$log"
    echo "$r" | "$PY" -c "import json,sys; x=json.load(sys.stdin)[0]; print(f\"{x['avg_ts']:.1f} | {x['stddev_ts']:.1f}\")" 2>/dev/null ||
        echo "FAILED ($(basename "$log")) |"
}
table=$top/kvattn_cuda_bench.md
if has bench; then
    { echo "# KVQuant decode op on CUDA: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit $(git rev-parse --short HEAD)"
      echo
      echo "llama-bench -ngl 99 -fa 1 -p 0 -n $NGEN -r $REPS; nuq3 rows -ctk nuq3 -ctv nuq3 --kv-calib FILE with"
      echo "GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1; ref = GGML_EXT_KV_ATTN=ref (dequantize-and-rope path), op = default (the split kernel where it applies)."
      echo
      echo "| model | cache | path | depth | tg t/s | stddev |"
      echo "| --- | --- | --- | --- | --- | --- |"; } > "$table"
fi
for mc in "smol:$SMOL_GGUF:${SMOL_CALIB:-}" "gemma:$GEMMA_GGUF:${GEMMA_CALIB:-}"; do
    name=${mc%%:*} rest=${mc#*:}
    m=${rest%%:*} cal=${rest#*:}
    [ -n "$cal" ] && [ -s "$cal" ] && [ -s "$m" ] || { say "$name: no model or calibration ($m, ${cal:-unset}): skipped"; continue; }
    kv=(-ctk nuq3 -ctv nuq3 --kv-calib "$cal")
    if has check; then
        log=$out/check-$name.log
        GGML_EXT_KV_ATTN=check GGML_EXT_KV_ATTN_CUDA=1 GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 timeout 300 "$BIN/llama-bench" -m "$m" \
            -p 0 -n 4 -r 1 -d "${CHECK_DEPTH:-1024}" -ngl 99 -fa 1 "${kv[@]}" > "$log" 2>&1
        say "check $name (GGML_EXT_KV_ATTN=check, depth ${CHECK_DEPTH:-1024}): rc=$? | $(awk '/kv-attn check:/ {n++; d = $(NF - 3) + 0; r = $NF + 0; q = r > 0 ? d / r : 0; if (q > mq) mq = q; if (d > md) md = d} END {printf "%d layer checks, largest |op - ref| %.4g, largest ratio to the layer max |ref| %.4g", n, md, mq}' "$log")"
        grep "not taken\|error\|abort\|FAIL" "$log" | head -5 | tee -a "$out/summary.txt"
    fi
    if has bench; then
        for d in $DEPTHS; do
            [ "$name" = smol ] && [ "$d" -gt 8192 ] && continue
            ARGS=(-ctk f16 -ctv f16)
            echo "| $name | f16 | upstream FA | $d | $(row "$m" f16 "$d" GGML_EXT_KV_ATTN=auto) |" | tee -a "$table" >> "$out/summary.txt"
            ARGS=("${kv[@]}")
            echo "| $name | nuq3 | ref | $d | $(row "$m" ref "$d" GGML_EXT_KV_ATTN=ref) |" | tee -a "$table" >> "$out/summary.txt"
            echo "| $name | nuq3 | op | $d | $(row "$m" op "$d" GGML_EXT_KV_ATTN=auto GGML_EXT_KV_ATTN_CUDA=1) |" | tee -a "$table" >> "$out/summary.txt"
            # the block kernel (the split kernel off: GGML_EXT_KV_ATTN_SPLIT=0), and the split kernel's other
            # register builds (SPLITS, e.g. "2 4": built for 2 / 4 blocks per SM), for tuning
            echo "| $name | nuq3 | op, block kernel | $d | $(row "$m" opblock "$d" GGML_EXT_KV_ATTN=auto GGML_EXT_KV_ATTN_CUDA=1 GGML_EXT_KV_ATTN_SPLIT=0) |" | tee -a "$table" >> "$out/summary.txt"
            for sp in ${SPLITS:-}; do
                echo "| $name | nuq3 | op, split build $sp | $d | $(row "$m" "opsplit$sp" "$d" GGML_EXT_KV_ATTN=auto GGML_EXT_KV_ATTN_CUDA=1 GGML_EXT_KV_ATTN_SPLIT="$sp") |" | tee -a "$table" >> "$out/summary.txt"
            done
            for c in ${CHUNKS:-}; do  # other cell ranges (GGML_EXT_KV_ATTN_CHUNK), for tuning
                echo "| $name | nuq3 | op, ranges of $c | $d | $(row "$m" "op$c" "$d" GGML_EXT_KV_ATTN=auto GGML_EXT_KV_ATTN_CUDA=1 GGML_EXT_KV_ATTN_CHUNK="$c") |" | tee -a "$table" >> "$out/summary.txt"
            done
        done
    fi
done
[ -f "$table" ] && { say "table: $table"; cat "$table"; }
