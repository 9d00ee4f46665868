#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "KVQuant": CPU decode speed, the decode op against the dequantize-and-rope path and upstream's caches.
# KVQuant decode attention on the CPU (issue 20, docs/KVQUANT.md "The decode op"): llama-bench decode speed at
# depth with our nuq4 / nuq3 caches through the old path (GGML_EXT_KV_ATTN=ref: the whole key cache
# dequantized, roped, cast to F16, flash attention) and the new one (the decode op, keys decoded and roped on the
# fly), beside upstream's f16 and q4_0 caches measured in the same run on the pristine upstream build.
#
#   bash bench/kvquant/bench_kvquant_decode.sh PREFIX UPSTREAM_BIN MODEL CALIB OUT
#     PREFIX        our install (the folder holding bin/llama-bench and lib/: GGML_EXT_PREFIX)
#     UPSTREAM_BIN  the pristine upstream build's bin folder (make upstream: ~/.cache/ggml-ext/upstream-*/bin)
#     MODEL         the GGUF (the default model: `ggml-ext assets path smollm2-gguf`)
#     CALIB         its KV calibration (`ggml-ext calibrate kv HF_DIR -o FILE`)
#     OUT           a folder for the results: tg.jsonl (llama-bench rows + build, path, load), summary.md, *.log
#   env: THREADS (default nproc), DEPTHS (default "4096 8192"), NGEN (default 32), REPS (default 2),
#        TYPES (run order, default "upstream:f16 upstream:q4_0 ref:nuq4 op:nuq4 ref:nuq3 op:nuq3"; ref / op are
#        our build with GGML_EXT_KV_ATTN=ref / auto)
#
# CPU only (-ngl 0 -nopo 1). llama-bench -p 0 -n NGEN -d D -r REPS -fa 1 with the same type for K and V: the
# cache is first filled with D tokens (untimed; our prefill takes the old path either way: batches of more than
# 16 tokens), then NGEN decoded tokens are timed. The 1-minute load average is recorded before every row: on a
# shared machine only ratios measured close together (old / new path of one type at one depth) mean much.
set -euo pipefail
if [ $# -ne 5 ]; then
  sed -n '2,21p' "$0" >&2
  exit 2
fi
prefix=$1 up=$2 model=$3 calib=$4 out=$5
THREADS=${THREADS:-$(nproc)}
DEPTHS=${DEPTHS:-"4096 8192"}
NGEN=${NGEN:-32}
REPS=${REPS:-2}
TYPES=${TYPES:-"upstream:f16 upstream:q4_0 ref:nuq4 op:nuq4 ref:nuq3 op:nuq3"}
for f in "$prefix/bin/llama-bench" "$up/llama-bench"; do
  [ -x "$f" ] || { echo "error: $f not found (or not executable)" >&2; exit 2; }
done
for f in "$model" "$calib"; do
  [ -f "$f" ] || { echo "error: $f not found" >&2; exit 2; }
done
mkdir -p "$out"
: > "$out/tg.jsonl"
t_start=$(date +%s)

{
  echo "# KVQuant decode attention in llama.cpp: $(date -u +%FT%TZ)"
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) logical CPUs), threads $THREADS, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "model: $model; calibration: $calib"
  echo "ours: $prefix; upstream: $up"
  echo "llama-bench -p 0 -n $NGEN -d D -r $REPS -fa 1 -t $THREADS -ngl 0 -nopo 1 -ctk T -ctv T (D in $DEPTHS; ours: --kv-calib CALIB, GGML_EXT_KV_ATTN=ref for the old path)"
  echo
} > "$out/summary.md"

for d in $DEPTHS; do
  for bt in $TYPES; do
    build=${bt%%:*} t=${bt#*:}
    load=$(cut -d' ' -f1 /proc/loadavg)
    log="$out/tg-$build-$t-d$d.log"
    echo "tg: $build $t at depth $d (load $load)" >&2
    t0=$(date +%s)
    common=(-m "$model" -p 0 -n "$NGEN" -d "$d" -r "$REPS" -fa 1 -t "$THREADS" -ngl 0 -nopo 1 -ctk "$t" -ctv "$t" -o jsonl)
    if [ "$build" = upstream ]; then
      LD_LIBRARY_PATH="$up:$up/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$up/llama-bench" "${common[@]}" \
        > "$out/tg-$build-$t-d$d.jsonl" 2> "$log" || { echo "error: upstream llama-bench failed:" >&2; tail -20 "$log" >&2; exit 1; }
    else
      mode=auto
      [ "$build" = ref ] && mode=ref
      GGML_EXT_KV_ATTN=$mode LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$prefix/bin/llama-bench" \
        "${common[@]}" --kv-calib "$calib" > "$out/tg-$build-$t-d$d.jsonl" 2> "$log" ||
        { echo "error: llama-bench $build $t failed:" >&2; tail -20 "$log" >&2; exit 1; }
    fi
    wall=$(( $(date +%s) - t0 ))
    echo "  $wall s" >&2
    sed "s/^{/{\"build\": \"$build\", \"load1\": $load, \"wall_s\": $wall, /" "$out/tg-$build-$t-d$d.jsonl" >> "$out/tg.jsonl"
  done
done

python3 - "$out" <<'EOF' >> "$out/summary.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "tg.jsonl").read_text().splitlines() if l.strip()]
name = {"upstream": "upstream (pristine)", "ref": "ours, old path (GGML_EXT_KV_ATTN=ref)", "op": "ours, decode op"}
print(f"| depth | build | cache K / V | tg{rows[0]['n_gen']} (t/s) | load (1 min) before |")
print("|---|---|---|---|---|")
for r in rows:
    print(f"| {r['n_depth']} | {name[r['build']]} | {r['type_k']} | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | {r['load1']} |")
print()
print("new / old path (same type, same depth, run one after the other):")
print()
for r in rows:
    if r["build"] == "op":
        old = [o for o in rows if o["build"] == "ref" and o["type_k"] == r["type_k"] and o["n_depth"] == r["n_depth"]]
        if old:
            print(f"- {r['type_k']} @ d{r['n_depth']}: {r['avg_ts'] / old[0]['avg_ts']:.2f}x "
                  f"({old[0]['avg_ts']:.2f} -> {r['avg_ts']:.2f} t/s)")
EOF
echo >> "$out/summary.md"
echo "total $(( $(date +%s) - t_start )) s; load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/summary.md"
cat "$out/summary.md"
