#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "KVQuant" (decode speed in VRAM): the NUQ caches' decode against upstream's q4_0 and
# f16 caches at depth, per head dim, on random-weight models (speed does not depend on the values; the device takes
# no model files: bench/runtime/make_bench_gguf.py makes them there, with KV calibrations of their shapes):
#   smollm2  SmolLM2-135M's shape, head dim 64 (9 heads, 3 KV heads), Q4_0 weights
#   hd256    Gemma-3-270M's attention in the llama architecture: head dim 256 (4 heads, 1 KV head)
#   8b-gqa   Llama-3-8B's shape, head dim 128 (32 heads, 8 KV heads)
# Steps (STEPS, default "build models test bench"; a later call on the same warm machine can pick up where the
# last one stopped, the builds and models are kept in /tmp):
#   build   our CUDA tree (device_lib.sh) and, beside it at the same time, the pristine llama.cpp's llama-bench with
#           -DGGML_CUDA=ON, sm_90 (SRC: the pinned source; .device/llama.cpp-src.tar.xz is unpacked when SRC is unset)
#   models  the three files and their calibrations in /tmp/kvm
#   test    tests/c/test_kvquant_cuda.cpp (the cache types' kernels: SET_ROWS bytes bit for bit against the CPU) and
#           tests/c/test_kvattn_cuda.cpp (the decode op's kernels against the CPU op, NMSE <= 1e-6)
#   bench   llama-bench -ngl 99 -fa 1 -p PP -n NGEN -r REPS -d D, for D in each shape's depths (one process per row,
#           model loaded once per row, every depth in it: decode tg NGEN and prefill pp PP after D cells): pristine upstream f16 and q4_0 caches, ours q4_0, nuq4 and
#           nuq3 (--kv-calib, GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1, the decode op's lane kernel), nuq3 with
#           the block kernel (GGML_EXT_KV_ATTN_SPLIT=0); passes alternate the builds
#   profile ncu's kernel times of a few decode tokens (smollm2 at DEPTH_PROFILE, default 8192): the nuq3 cache's
#           decode op and cache writes, our build's q4_0 cache's flash attention and cache writes, when ncu is there
# Writes TOP/kvattn_speed.md (a decode table and a prefill table, tokens/s and the ratio to upstream's q4_0 cache) and
# TOP/summary.txt.
# Usage (device, repository root): bash bench/device/device_kvattn_speed.sh $OUT
# Environment: SHAPES ("smollm2 hd256 8b-gqa"), DEPTHS_smollm2 / DEPTHS_hd256 / DEPTHS_8b_gqa (comma lists; default
#   8192,32768 / 8192,32768,131072 / 8192,32768,131072), NGEN (32), PP (512; 0: no prefill rows), REPS (2), BUILD (/tmp/bc), UP (/tmp/up-cuda),
#   UPSTREAM=0 (ours alone: no pristine build or rows, ratios to our stock q4_0), ONE_PASS=1 (one pass, not two),
#   BLOCK_ROW=0 (no block-kernel row).
set -uo pipefail
cd "$(dirname "$0")/../.."
top=${1:?usage: device_kvattn_speed.sh OUT}
. bench/device/device_lib.sh
device_setup "$top" "device_kvattn_speed"
STEPS=${STEPS:-build models test bench}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
SHAPES=${SHAPES:-smollm2 hd256 8b-gqa}
NGEN=${NGEN:-32}
PP=${PP:-512}
REPS=${REPS:-2}
UP=${UP:-/tmp/up-cuda}
M=/tmp/kvm
if [ -z "${SRC:-}" ]; then
    SRC=/tmp/src/llama.cpp-0c1e57098
    [ -d "$SRC" ] || { mkdir -p /tmp/src && tar -xJf .device/llama.cpp-src.tar.xz -C /tmp/src; }
fi
export GGML_EXT_LLAMA_CPP_SRC=$SRC

if has build && [ "${UPSTREAM:-1}" = 0 ]; then  # ours alone (the pristine rows then read "-")
    device_build_cuda
elif has build; then
    t0=$(date +%s)
    { [ -f "$UP/build.ninja" ] || cmake -S "$SRC" -B "$UP" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/up-build.log" 2>&1; } &&
        cmake --build "$UP" -j "$((jobs / 2))" --target llama-bench >> "$out/up-build.log" 2>&1 &
    upid=$!
    jobs=$((jobs / 2)) device_build_cuda
    wait "$upid" || { tail -30 "$out/up-build.log" | tee -a "$out/summary.txt"; exit 1; }
    say "builds (ours and pristine, side by side): $(( $(date +%s) - t0 )) s"
else
    device_build_cuda  # an unchanged tree: seconds
fi
UPBIN=$UP/bin

if has models; then
    mkdir -p "$M"
    for s in $SHAPES; do
        [ -s "$M/$s.gguf" ] && [ -s "$M/$s.kv" ] && continue
        "$PY" bench/runtime/make_bench_gguf.py .device/ggml-vocab-llama-spm.gguf "$M/$s.gguf" --shape "$s" \
            --type q4_0 --kv-calib "$M/$s.kv" >> "$out/models.log" 2>&1 || { tail -5 "$out/models.log" | tee -a "$out/summary.txt"; exit 1; }
    done
    say "models: $(ls -s "$M" | tr '\n' ' ')"
fi

if has test; then
    g++ -std=c++17 -O2 -I"$P/include" tests/c/test_kvquant_cuda.cpp -L"$P/lib" -lggml -lggml-base -lggml-cpu \
        -lggml-rpc -Wl,-rpath,"$P/lib" -o /tmp/test_kvquant_cuda && /tmp/test_kvquant_cuda --require-gpu > "$out/test_kvquant.log" 2>&1
    say "test_kvquant_cuda: rc=$? | $(grep -cE '^FAIL' "$out/test_kvquant.log") failing lines | $(tail -1 "$out/test_kvquant.log")"
    grep -E "^FAIL" "$out/test_kvquant.log" | head -10 | tee -a "$out/summary.txt"
    g++ -std=c++17 -O2 -I"$P/include" tests/c/test_kvattn_cuda.cpp -L"$P/lib" -lggml -lggml-base -lggml-cpu \
        -lggml-rpc -Wl,-rpath,"$P/lib" -o /tmp/test_kvattn_cuda && /tmp/test_kvattn_cuda --require-gpu > "$out/test_kvattn.log" 2>&1
    say "test_kvattn_cuda: rc=$? | $(grep -cE '^FAIL' "$out/test_kvattn.log") failing lines | $(tail -1 "$out/test_kvattn.log")"
    grep -E "^FAIL" "$out/test_kvattn.log" | head -10 | tee -a "$out/summary.txt"
fi

# one llama-bench process: label bin model depths env... -ctk/-ctv args after "--"; prints "kind depth avg stddev"
# lines (kind tg: decode, pp: prefill)
bench_row() {
    local label=$1 bin=$2 m=$3 depths=$4
    shift 4
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local log=$out/bench-$label-$(basename "$m" .gguf).log
    env "${envs[@]}" timeout 1200 "$bin/llama-bench" -m "$m" -p "$PP" -n "$NGEN" -r "$REPS" -d "$depths" -ngl 99 -fa 1 \
        -o json "$@" > "$log.json" 2> "$log"
    "$PY" -c "
import json, sys
for x in json.load(open(sys.argv[1])):
    print('pp' if x['n_prompt'] else 'tg', x['n_depth'], f\"{x['avg_ts']:.1f}\", f\"{x['stddev_ts']:.1f}\")" "$log.json" 2>/dev/null
}

# bench_row's figures into R[KIND-KEY-DEPTH-PASS] ("avg sd"): KEY PASS, then bench_row's arguments after its label
bench_into() {
    local key=$1 pass=$2 kind dd a sd
    shift 2
    while read -r kind dd a sd; do [ -n "$dd" ] && R[$kind-$key-$dd-$pass]="$a $sd"; done < <(bench_row "$key-$pass" "$@")
}
best() {  # KIND-KEY DEPTH: the better pass's "avg ± sd"
    "$PY" -c "
import sys
xs = [tuple(map(float, a.split())) for a in sys.argv[1:] if a.strip()]
print('%.1f ± %.1f' % max(xs) if xs else 'FAILED')" "${R[$1-$2-1]:-}" "${R[$1-$2-2]:-}"
}
ratio() {  # "a ± s" "b ± s": a / b
    "$PY" -c "
import sys
a, b = sys.argv[1].split(' ± ')[0], sys.argv[2].split(' ± ')[0]
print(f'{float(a) / float(b):.2f}x' if a != 'FAILED' and b != 'FAILED' else '-')" "$1" "$2"
}

if has bench; then
    table=$top/kvattn_speed.md
    { echo "# KVQuant decode in VRAM: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null), $(date -u +%F)"
      echo
      echo "llama-bench -ngl 99 -fa 1 -p $PP -n $NGEN -r $REPS -d DEPTH; random Q4_0 weights; nuq rows --kv-calib (made-up"
      echo "tables of the shape), GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1. t/s ± stddev; x = / pristine q4_0."; } > "$table"
    head="| shape | depth | pristine f16 | pristine q4_0 | ours q4_0 | nuq4 | nuq3 | nuq3, block kernel |"
    rows_tg=() rows_pp=()
    nuq=(GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1)
    for s in $SHAPES; do
        v=DEPTHS_${s//-/_}
        d=${!v:-$([ "$s" = smollm2 ] && echo 8192,32768 || echo 8192,32768,131072)}
        m=$M/$s.gguf cal=$M/$s.kv
        declare -A R=()
        for pass in 1 2; do  # passes alternate the builds; the better pass of each row is kept
            [ "${UPSTREAM:-1}" != 0 ] && bench_into upf16 "$pass" "$UPBIN" "$m" "$d" X=1 -- -ctk f16 -ctv f16
            bench_into nuq3 "$pass" "$BIN" "$m" "$d" "${nuq[@]}" -- -ctk nuq3 -ctv nuq3 --kv-calib "$cal"
            [ "${UPSTREAM:-1}" != 0 ] && bench_into upq4 "$pass" "$UPBIN" "$m" "$d" X=1 -- -ctk q4_0 -ctv q4_0
            bench_into nuq4 "$pass" "$BIN" "$m" "$d" "${nuq[@]}" -- -ctk nuq4 -ctv nuq4 --kv-calib "$cal"
            bench_into ourq4 "$pass" "$BIN" "$m" "$d" X=1 -- -ctk q4_0 -ctv q4_0
            [ "$pass" = 1 ] && [ "${BLOCK_ROW:-1}" = 1 ] &&
                bench_into blk "$pass" "$BIN" "$m" "$d" "${nuq[@]}" GGML_EXT_KV_ATTN_SPLIT=0 -- -ctk nuq3 -ctv nuq3 --kv-calib "$cal"
            [ "${ONE_PASS:-0}" = 1 ] && break
        done
        for kind in tg pp; do
            for dd in ${d//,/ }; do
                uq=$(best "$kind-upq4" "$dd")
                [ "$uq" = FAILED ] && uq="$(best "$kind-ourq4" "$dd") (ours)"  # UPSTREAM=0: ratios to our stock q4_0 cache
                row="| $s | $dd | $(best "$kind-upf16" "$dd") | $uq |"
                for k in ourq4 nuq4 nuq3 blk; do x=$(best "$kind-$k" "$dd"); row="$row $x ($(ratio "$x" "$uq")) |"; done
                echo "$kind $row" >> "$out/summary.txt"
                [ "$kind" = tg ] && rows_tg+=("$row") || rows_pp+=("$row")
            done
        done
        unset R
    done
    { echo; echo "Decode, tg$NGEN:"; echo; echo "$head"; echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      printf '%s\n' "${rows_tg[@]}"
      if [ "$PP" != 0 ]; then
          echo; echo "Prefill, pp$PP after the depth:"; echo; echo "$head"; echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
          printf '%s\n' "${rows_pp[@]}"
      fi; } >> "$table"
    cat "$table"
fi

if has profile && command -v ncu > /dev/null; then
    # the decode tokens' kernels only: a name filter, then the depth fill's launches of those kernels skipped
    # (batches of 512 cells x SmolLM2's 30 layers x PER_LAYER: the cache writes, for q4_0 also flash attention and
    # its fixup); the nuq3 cache's (the decode op and the cache write) and our build's q4_0 cache's (upstream's
    # vector flash attention). The caller's environment assignments reach llama-bench.
    depth=${DEPTH_PROFILE:-8192}
    prof() {  # label regex per_layer cache args...
        local label=$1 re=$2 skip=$(( depth / 512 * 30 * $3 + 40 ))
        shift 3
        timeout 600 ncu --target-processes all --kernel-name "regex:$re" --launch-skip "$skip" \
            --launch-count 150 --metrics gpu__time_duration.sum --csv "$BIN/llama-bench" -m "$M/smollm2.gguf" -p 0 \
            -n 8 -r 1 -d "$depth" -ngl 99 -fa 1 "$@" > "$out/ncu-$label.csv" 2> "$out/ncu-$label.err"
        say "ncu $label (depth $depth): rc=$? | per kernel (name: launches, mean us):"
        "$PY" - "$out/ncu-$label.csv" <<'EOF2' | tee -a "$out/summary.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("  (no rows)"); raise SystemExit
h = rows[0]; ki, vi = h.index("Kernel Name"), h.index("Metric Value")
t = collections.defaultdict(list)
for r in rows[1:]:
    try:
        t[r[ki][:60]].append(float(r[vi].replace(",", "")))
    except ValueError:
        pass
for k, v in sorted(t.items(), key=lambda kv: -sum(kv[1])):
    print(f"  {k}: {len(v)}, {sum(v) / len(v) / 1000:.2f}")
EOF2
    }
    GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 prof nuq3 'k_lanes|k_partial|k_combine|k_table|k_quantize' 2 \
        -ctk nuq3 -ctv nuq3 --kv-calib "$M/smollm2.kv"
    prof q4_0 'flash_attn|set_rows' 4 -ctk q4_0 -ctv q4_0
fi
