#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "KVQuant": CPU perplexity ladder of one model in llama.cpp, ours and pristine upstream's caches.
# KV-cache perplexity ladder of one model in llama.cpp (docs/RESULTS.md "KVQuant"):
# stock caches by the pristine upstream build, ours (NUQ types, 1% outliers, sink) by our build, same text,
# same windows. One markdown row per cache: name | PPL +/- | seconds | load average.
#   MODEL=... CALIB=... [TEXT=wiki.test.txt] [CTX=2048] [CHUNKS=2] [THREADS=2] [ROWS="up-f16 up-q4_0 nuq4os"]
#   OURS=<our prefix>/bin UP=<pristine>/bin bash bench/kvquant/bench_kvquant_ladder.sh > table.md
# ROWS: up-f16 up-q8_0 up-q4_0 up-q4_0-norot (LLAMA_ATTN_ROT_DISABLE=1) nuq4os nuq3os nuq2os (K and V, outliers
# and sink) nuq4k (nuq4 keys, f16 values); logs in $LOGS (default /tmp/kvq-ladder).
set -u
: "${MODEL:?MODEL=the GGUF}" "${CALIB:?CALIB=the ggml-ext calibrate kv file}" "${OURS:?OURS=our bin folder}" "${UP:?UP=the pristine upstream bin folder}"
TEXT=${TEXT:-$(python3 -c 'from ggml_ext import assets; print(assets.path("wiki-test"))' 2>/dev/null)}
CTX=${CTX:-2048} CHUNKS=${CHUNKS:-2} THREADS=${THREADS:-2} LOGS=${LOGS:-/tmp/kvq-ladder}
mkdir -p "$LOGS"
row() {  # name bin-folder args...
    local name=$1 bin=$2 t0
    shift 2
    t0=$(date +%s)
    "$bin/llama-perplexity" -m "$MODEL" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -fa on -t "$THREADS" --no-warmup "$@" \
        > "$LOGS/$name-$CTX.log" 2>&1
    echo "| $name | $(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$LOGS/$name-$CTX.log" | cut -d' ' -f5-7 || echo FAILED) | $(( $(date +%s) - t0 )) s | load $(cut -d' ' -f1 /proc/loadavg) |"
}
o=(--kv-calib "$CALIB" --kv-outliers 0.01 --kv-sink 1)
for r in ${ROWS:-up-f16 up-q4_0 nuq4os nuq3os nuq2os}; do
    case $r in
        up-f16)       row "$r" "$UP" -ctk f16 -ctv f16 ;;
        up-q8_0)      row "$r" "$UP" -ctk q8_0 -ctv q8_0 ;;
        up-q4_0)      row "$r" "$UP" -ctk q4_0 -ctv q4_0 ;;
        up-q4_0-norot) LLAMA_ATTN_ROT_DISABLE=1 row "$r" "$UP" -ctk q4_0 -ctv q4_0 ;;
        nuq4os)       row "$r" "$OURS" -ctk nuq4 -ctv nuq4 "${o[@]}" ;;
        nuq3os)       row "$r" "$OURS" -ctk nuq3 -ctv nuq3 "${o[@]}" ;;
        nuq2os)       row "$r" "$OURS" -ctk nuq2 -ctv nuq2 "${o[@]}" ;;
        nuq4k)        row "$r" "$OURS" -ctk nuq4 -ctv f16 --kv-calib "$CALIB" ;;
        *) echo "unknown row $r" >&2 ;;
    esac
done
