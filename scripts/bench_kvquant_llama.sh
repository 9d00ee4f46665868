#!/usr/bin/env bash
# KVQuant cache types in llama.cpp on the CPU (issue 20, docs/KVQUANT.md "In llama.cpp's cache"): decode
# speed at long context and KV memory, our nuq4 / nuq3 caches against upstream's f16 / q8_0 / q4_0 caches
# measured in the same run on the pristine upstream build.
#
#   bash scripts/bench_kvquant_llama.sh PREFIX UPSTREAM_BIN MODEL CALIB OUT
#     PREFIX        our install (the folder holding bin/llama-bench and lib/: GGML_EXT_PREFIX)
#     UPSTREAM_BIN  the pristine upstream build's bin folder (make upstream: ~/.cache/ggml-ext/upstream-*/bin)
#     MODEL         the GGUF (the default model: SmolLM2-135M-Instruct, `ggml-ext assets path smollm2-gguf`)
#     CALIB         its KV calibration (`ggml-ext calibrate kv HF_DIR -o FILE`)
#     OUT           a folder for the results: tg.jsonl (llama-bench rows), kv_mem.tsv, summary.md, *.log
#   env: THREADS (default nproc), DEPTHS (llama-bench -d, run in this order, default "8192 32768"), NGEN
#        (tokens timed per test, default 32), REPS (default 2), MEM_CTX (contexts of the memory figures,
#        default "32768 131072"), TYPES (run order, default "upstream:f16 ours:nuq4 upstream:q4_0
#        upstream:q8_0 ours:nuq3"), BUDGET (seconds; default 420: a depth after the first is started for a
#        type only while the run has used less, so the run stays near 8 minutes; 0: no limit)
#
# CPU only, whatever the builds (-ngl 0 -nopo 1: no layer and no large batch on a GPU of a CUDA build).
# Speed: llama-bench -p 0 -n NGEN -d D -fa 1 with the same type for K and V: the test first fills the cache
# with D tokens (untimed, and the bulk of the run's time: the prefill's attention is quadratic in D, and our
# nuq caches take the slower paths there: one value head dequantized per call, the keys dequantized and
# roped per ubatch) and then times NGEN decoded tokens (reps reuse the fill: llama-bench keeps its state).
# All types at the first depth, then the next depth type by type while BUDGET lasts; a skipped one is
# named in the summary. Memory: the "llama_kv_cache: size = ..." line llama.cpp itself prints (-v) when it
# allocates a cache of MEM_CTX cells (llama-cli -c N, one token generated, nothing filled), per type and
# build; 131072 is past SmolLM2's trained 8192 positions, which llama.cpp allows with a warning (the
# allocation does not depend on it).
set -euo pipefail
if [ $# -ne 5 ]; then
  sed -n '2,27p' "$0" >&2
  exit 2
fi
prefix=$1 up=$2 model=$3 calib=$4 out=$5
THREADS=${THREADS:-$(nproc)}
DEPTHS=${DEPTHS:-"8192 32768"}
NGEN=${NGEN:-32}
REPS=${REPS:-2}
MEM_CTX=${MEM_CTX:-"32768 131072"}
TYPES=${TYPES:-"upstream:f16 ours:nuq4 upstream:q4_0 upstream:q8_0 ours:nuq3"}
BUDGET=${BUDGET:-420}
for f in "$prefix/bin/llama-bench" "$prefix/bin/llama-cli" "$up/llama-bench" "$up/llama-cli"; do
  [ -x "$f" ] || { echo "error: $f not found (or not executable)" >&2; exit 2; }
done
for f in "$model" "$calib"; do
  [ -f "$f" ] || { echo "error: $f not found" >&2; exit 2; }
done
mkdir -p "$out"
: > "$out/tg.jsonl"
printf 'build\ttype\tn_ctx\tkv_MiB\tK_MiB\tV_MiB\n' > "$out/kv_mem.tsv"
t_start=$(date +%s)

run() {  # run BUILD TOOL ARGS...: the tool of one build with that build's libraries
  local build=$1 tool=$2
  shift 2
  if [ "$build" = ours ]; then
    LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$prefix/bin/$tool" "$@"
  else
    LD_LIBRARY_PATH="$up:$up/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$up/$tool" "$@"
  fi
}

{
  echo "# KVQuant cache in llama.cpp: $(date -u +%FT%TZ)"
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) logical CPUs), threads $THREADS, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "model: $model; calibration: $calib"
  echo "ours: $prefix ($(run ours llama-bench --version 2>&1 | grep -m1 -i version || true))"
  echo "upstream: $up ($(run upstream llama-bench --version 2>&1 | grep -m1 -i version || true))"
  echo "llama-bench -p 0 -n $NGEN -d D -r $REPS -fa 1 -t $THREADS -ngl 0 -nopo 1 -ctk T -ctv T (D in $DEPTHS; ours: --kv-calib)"
  echo
} > "$out/summary.md"

# decode speed at depth, one llama-bench per build, type and depth (K and V of that type)
first=1
for d in $DEPTHS; do
  for bt in $TYPES; do
    build=${bt%%:*} t=${bt#*:}
    used=$(( $(date +%s) - t_start ))
    if [ $first = 0 ] && [ "$BUDGET" -gt 0 ] && [ $used -ge "$BUDGET" ]; then
      echo "skipped: $build $t at depth $d (BUDGET $BUDGET s used up after $used s)" | tee -a "$out/skipped.txt" >&2
      continue
    fi
    extra=()
    [ "$build" = ours ] && extra=(--kv-calib "$calib")
    echo "tg: $build $t at depth $d ($used s so far)" >&2
    log="$out/tg-$build-$t-d$d.log"
    t0=$(date +%s)
    run "$build" llama-bench -m "$model" -p 0 -n "$NGEN" -d "$d" -r "$REPS" -fa 1 -t "$THREADS" -ngl 0 -nopo 1 \
      -ctk "$t" -ctv "$t" "${extra[@]}" -o jsonl > "$out/tg-$build-$t-d$d.jsonl" 2> "$log" ||
      { echo "error: llama-bench $build $t -d $d failed:" >&2; tail -20 "$log" >&2; exit 1; }
    echo "  $(( $(date +%s) - t0 )) s" >&2
    sed "s/^{/{\"build\": \"$build\", \"wall_s\": $(( $(date +%s) - t0 )), /" "$out/tg-$build-$t-d$d.jsonl" >> "$out/tg.jsonl"
  done
  first=0
done

# KV memory as llama.cpp reports it when it allocates the cache
for bt in $TYPES; do
    build=${bt%%:*} t=${bt#*:}
    for n in $MEM_CTX; do
      extra=()
      [ $build = ours ] && extra=(--kv-calib "$calib")
      log="$out/mem-$build-$t-$n.log"
      run "$build" llama-cli -m "$model" -c "$n" -n 1 -st -p hi --temp 0 -fa on -ctk "$t" -ctv "$t" -t "$THREADS" -ngl 0 \
        --no-warmup --simple-io -v "${extra[@]}" < /dev/null > "$log" 2>&1 ||
        { echo "error: llama-cli $build $t -c $n failed:" >&2; tail -20 "$log" >&2; exit 1; }
      line=$(grep 'llama_kv_cache: size =' "$log" | tail -1) ||
        { echo "error: no 'llama_kv_cache: size' line in $log" >&2; exit 1; }
      # llama_kv_cache: size =  X MiB (N cells, L layers, 1/1 seqs), K (t):  Y MiB, V (t):  Z MiB
      echo "$line" | sed -E "s/.*size = *([0-9.]+) MiB \( *([0-9]+) cells.*K \([^)]*\): *([0-9.]+) MiB, V \([^)]*\): *([0-9.]+) MiB.*/$build\t$t\t\2\t\1\t\3\t\4/" \
        >> "$out/kv_mem.tsv"
      rm -f "$log"  # -v logs are large; the line is kept in kv_mem.tsv
    done
done

python3 - "$out" <<'EOF' >> "$out/summary.md"
import csv, json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "tg.jsonl").read_text().splitlines() if l.strip()]
depths = sorted({r["n_depth"] for r in rows})
base = {r["n_depth"]: r["avg_ts"] for r in rows if r["build"] == "upstream" and r["type_k"] == "f16"}
print("| build | cache K / V | " + " | ".join(f"tg{rows[0]['n_gen']} @ d{d} (t/s)" for d in depths)
      + " | " + " | ".join(f"vs upstream f16 @ d{d}" for d in depths) + " |")
print("|---|---|" + "---|" * (2 * len(depths)))
for key in dict.fromkeys((r["build"], r["type_k"]) for r in rows):
    by_d = {r["n_depth"]: r for r in rows if (r["build"], r["type_k"]) == key}
    cells = [f"{by_d[d]['avg_ts']:.2f} ± {by_d[d]['stddev_ts']:.2f}" if d in by_d else "skipped" for d in depths]
    rel = [f"{by_d[d]['avg_ts'] / base[d]:.2f}x" if d in by_d and d in base else "-" for d in depths]
    print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " | " + " | ".join(rel) + " |")
print()
mem = list(csv.DictReader(open(out / "kv_mem.tsv"), delimiter="\t"))
ctxs = sorted({int(m["n_ctx"]) for m in mem})
print("KV cache size as llama.cpp reports it at allocation (MiB, K + V, all layers):")
print()
print("| build | cache K / V | " + " | ".join(f"{c // 1024}K cells" for c in ctxs) + " |")
print("|---|---|" + "---|" * len(ctxs))
for key in dict.fromkeys((m["build"], m["type"]) for m in mem):
    by_c = {int(m["n_ctx"]): m for m in mem if (m["build"], m["type"]) == key}
    print(f"| {key[0]} | {key[1]} | " + " | ".join(by_c[c]["kv_MiB"] if c in by_c else "-" for c in ctxs) + " |")
EOF
echo >> "$out/summary.md"
[ -f "$out/skipped.txt" ] && cat "$out/skipped.txt" >> "$out/summary.md"
echo "total $(( $(date +%s) - t_start )) s; load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/summary.md"
cat "$out/summary.md"
