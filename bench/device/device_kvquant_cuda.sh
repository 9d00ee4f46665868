#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "KVQuant": NUQ caches in VRAM, perplexity, decode speed and memory against pristine upstream.
# The KVQuant cache types NUQ4 / NUQ3 / NUQ2 with the cache in VRAM (issue 20, docs/KVQUANT.md "The CUDA path";
# ggml_ext/src/cuda/kvquant_cuda.cu, patch 0421) on the device machine, in one run:
#   build    our CUDA tree (device_lib.sh) and the pristine upstream CUDA build of llama-perplexity / llama-bench
#            from SRC (the baseline of every stock-type row), reused on a warm machine (NO_BUILD=1 with P=prefix
#            takes an existing build of ours: a CPU dry run of this script)
#   test     make test-cuda (tests/c/test_kvquant_cuda.cpp among the programs: NUQ SET_ROWS bytes, CPY /
#            GET_ROWS values bit for bit against the CPU, with and without outliers and the sink, flash attention)
#   calib    `ggml-ext calibrate kv` (CALIB samples x tokens of $TRAIN, 1% outliers, on CAL_DEVICE) for each model,
#            unless SMOL_CALIB / GEMMA_CALIB name existing files
#   ppl      llama-perplexity -ngl 99 -fa on on $TEST, K and V of the type:
#            SmolLM2-135M at ctx CTX_SMOL (2048), Gemma-3-270M at each ctx of CTX_GEMMA (8192 32768: 32768 is its
#            full context): upstream f16, q8_0, q4_0 (rotated, upstream's default) and q4_0 unrotated
#            (LLAMA_ATTN_ROT_DISABLE=1); ours f16, and nuq4 / nuq3 / nuq2 with --kv-outliers 0.01 --kv-sink 1;
#            then the agreement check: the same nuq3 setting with the cache in VRAM and on the CPU
#            (--no-kv-offload: the cache and attention on the CPU), CHUNKS_CPU windows at ctx CTX_CPU (2048),
#            with the default keys (block-scaled: the calibrations made here have the k_nuqB_ho tables) and with
#            GGML_EXT_KV_KBLOCK=0 (build column "ours-kchannel": keys per channel alone).
#            Each row logs the KV cache size llama.cpp prints, its buffer (CUDA0 or CPU) and the graph splits.
#   bench    llama-bench -ngl 99 -fa 1 -p 0 -n NGEN -d D (D in DEPTHS: 8192 32768) on BENCH_MODEL (gemma, or smol):
#            upstream f16 and q4_0, ours f16, nuq4 / nuq3 / nuq2 (+ outliers + sink through GGML_EXT_KV_OUTLIERS /
#            GGML_EXT_KV_SINK)
#   mem      llama-bench -v -d MEM_DEPTH (131072) -n 16 -r 1 on BENCH_MODEL: upstream f16 / q8_0 / q4_0, ours nuq4 /
#            nuq3 / nuq2: tg at that depth and the KV cache size from llama.cpp's log
# One failing row is logged FAILED and the run goes on. Writes $OUT/kvquant_cuda_ppl.md / _bench.md (the tables)
# and the summary. The device allows 10 minutes a command: run the steps as separate calls on one warm machine
# (the builds are reused; each call rebuilds nothing that is current), e.g. STEPS=test, then "ppl_gemma",
# then "bench mem".
#
# Usage (device, repository root):
#   SRC=/tmp/src/llama.cpp-0c1e57098 TEST=... [TRAIN=...] bash bench/device/device_kvquant_cuda.sh $OUT
# Environment: SMOL_GGUF (default /tmp/assets/SmolLM2-135M-Instruct.Q4_1.gguf), GEMMA_GGUF (default
#   /tmp/assets/gemma-3-270m-q4_k_m.gguf), SMOL_HF / GEMMA_HF (HF folders for the calibration, default
#   /tmp/assets/smollm2-hf, /tmp/assets/gemma3-hf: bench/device/device_assets.py makes both and the GGUFs),
#   SMOL_CALIB / GEMMA_CALIB (carried calibrations), CALIB (16x2048), CAL_DEVICE (cuda), CTX_SMOL (2048),
#   CTX_GEMMA ("8192 32768"), CHUNKS_SMOL / CHUNKS_GEMMA (windows per row, 0 = every window the text holds),
#   CTX_CPU (2048), CHUNKS_CPU (4), DEPTHS ("8192 32768"), NGEN (64), REPS (3), MEM_DEPTH (131072),
#   BENCH_MODEL (gemma | smol, default gemma), UP (pristine build dir, /tmp/up-kvq), BUILD (our build dir,
#   /tmp/bc), WORK (calibrations, /tmp/kvq-cuda), STEPS (default all: "test upstream calib ppl_smol ppl_gemma
#   bench mem"; "ppl" = both ppl steps).
set -uo pipefail
cd "$(dirname "$0")/../.."
top=${1:?usage: device_kvquant_cuda.sh OUT}
. bench/device/device_lib.sh
device_setup "$top" "device_kvquant_cuda"
STEPS=${STEPS:-test upstream calib ppl_smol ppl_gemma bench mem}
case " $STEPS " in *" ppl "*) STEPS="$STEPS ppl_smol ppl_gemma" ;; esac
TRAIN=${TRAIN:-}
TEST=${TEST:-}  # wiki-test (the ppl steps)
A=${ASSETS:-/tmp/assets}
SMOL_GGUF=${SMOL_GGUF:-$A/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA_GGUF=${GEMMA_GGUF:-$A/gemma-3-270m-q4_k_m.gguf}
SMOL_HF=${SMOL_HF:-$A/smollm2-hf}
GEMMA_HF=${GEMMA_HF:-$A/gemma3-hf}
CALIB=${CALIB:-16x2048}
CTX_SMOL=${CTX_SMOL:-2048}
CTX_GEMMA=${CTX_GEMMA:-8192 32768}
DEPTHS=${DEPTHS:-8192 32768}
NGEN=${NGEN:-64}
REPS=${REPS:-3}
UP=${UP:-/tmp/up-kvq}
w=${WORK:-/tmp/kvq-cuda}
mkdir -p "$w"
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if [ "${NO_BUILD:-0}" = 1 ]; then  # a CPU dry run of the script: our existing build at $P
    : "${P:?NO_BUILD=1 needs P=our prefix (holding bin/, lib/)}"
    BIN=$P/bin
    export PYTHONPATH=$PWD/python GGML_EXT_PREFIX=$P LD_LIBRARY_PATH=$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    device_build_cuda
fi
# the pristine upstream CUDA build (the stock rows' baseline), for the steps that use it
t0=$(date +%s)
UBIN=
if ! has upstream && ! has ppl_smol && ! has ppl_gemma && ! has bench && ! has mem; then
    :
elif [ -n "${UBIN_GIVEN:-}" ]; then  # an existing pristine build's bin folder (the CPU dry run)
    UBIN=$UBIN_GIVEN
elif [ -n "${SRC:-}" ] && [ -d "$SRC" ]; then
    { [ -f "$UP/build.ninja" ] || cmake -S "$SRC" -B "$UP" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
          -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release > "$out/up-build.log" 2>&1; } &&
        cmake --build "$UP" -j "$jobs" --target llama-perplexity llama-bench >> "$out/up-build.log" 2>&1 &&
        UBIN=$UP/bin
    [ -n "$UBIN" ] && say "pristine upstream CUDA build: $(( $(date +%s) - t0 )) s" ||
        { say "pristine upstream CUDA build FAILED (stock rows skipped)"; tail -30 "$out/up-build.log" | tee -a "$out/summary.txt"; }
else
    say "SRC (the pinned llama.cpp source) not given or missing: the pristine upstream rows are skipped"
fi

if has test; then
    device_test_cuda '^(OK|FAIL|SKIP|nuq[234]|backend:)' 30 "${TEST_ROUNDS:-1}"
fi

# ---- calibrations ----
calib() {  # name hf_dir preset -> prints the calibration path (empty on failure)
    local name=$1 hf=$2 preset=$3 f=$w/$1.kvq.gguf
    if [ -n "$preset" ]; then
        [ -s "$preset" ] && { echo "$preset"; return; }
        say "calibration $preset ($name) missing" >&2
    fi
    if [ ! -s "$f" ] && has calib; then
        [ -n "$TRAIN" ] || { say "TRAIN not set: no calibration for $name" >&2; return; }
        local t0=$(date +%s)
        "$PY" -m ggml_ext.cli calibrate kv "$hf" -o "$f" --text "$TRAIN" --samples "${CALIB%x*}" \
            --seq-len "${CALIB#*x}" --device "${CAL_DEVICE:-cuda}" --force -q > "$out/calib-$name.log" 2>&1 ||
            { say "calibrate kv $name FAILED" >&2; tail -20 "$out/calib-$name.log" | tee -a "$out/summary.txt" >&2; rm -f "$f"; }
        [ -s "$f" ] && say "calibrate kv $name: $CALIB tokens, $(( $(date +%s) - t0 )) s" >&2
    fi
    [ -s "$f" ] && echo "$f"
}
SMOL_KVQ=$(calib smollm2 "$SMOL_HF" "${SMOL_CALIB:-}")
GEMMA_KVQ=$(calib gemma3 "$GEMMA_HF" "${GEMMA_CALIB:-}")
say "calibrations: smollm2 ${SMOL_KVQ:-none}, gemma3 ${GEMMA_KVQ:-none}"

table=$top/kvquant_cuda_ppl.md
if has ppl_smol || has ppl_gemma; then
    { echo "# KVQuant cache in VRAM: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"
      echo
      echo "llama-perplexity -ngl 99 -fa on on $(basename "$TEST"); stock rows by the pristine upstream CUDA build, nuq rows by ours"
      echo "with --kv-calib (SmolLM2: $(basename "${SMOL_KVQ:-none}"), Gemma: $(basename "${GEMMA_KVQ:-none}"); made here from $CALIB"
      echo "tokens of $(basename "${TRAIN:-?}") unless carried) --kv-outliers 0.01 --kv-sink 1."
      echo "KV MiB: llama.cpp's 'llama_kv_cache: size' line (all layers, K + V; Gemma: both caches of its iSWA pair)."
      echo
      echo "| model | ctx | windows | build | K | V | PPL | +-  | KV MiB | KV buffer | graph splits |"
      echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"; } > "$table"
fi

# one perplexity row: model_label model ctx chunks build K V [extra args...]
n_row=0
ppl() {
    local label=$1 model=$2 ctx=$3 chunks=$4 build=$5 tk=$6 tv=$7
    shift 7
    local bin log v kv buf splits shown=$build
    case $build in upstream*) bin=$UBIN ;; *) bin=$BIN ;; esac
    case " $* " in *" --no-kv-offload "*) shown="$build, KV on CPU" ;; esac
    n_row=$((n_row + 1))
    log=$out/ppl-$n_row-$label-$ctx-$build-$tk-$tv.log
    if [ -z "$bin" ] || [ ! -f "$model" ] || [ ! -f "$TEST" ]; then
        echo "| $label | $ctx | $chunks | $shown | $tk | $tv | SKIPPED (no build, model or TEST) | | | | |" >> "$table"
        return
    fi
    local ch=(); [ "$chunks" != 0 ] && ch=(--chunks "$chunks")
    if [ "$build" = upstream-norot ]; then
        LLAMA_ATTN_ROT_DISABLE=1 LD_LIBRARY_PATH=$UBIN timeout 3000 "$UBIN/llama-perplexity" -m "$model" -f "$TEST" -c "$ctx" "${ch[@]}" \
            -ngl 99 -fa on -ctk "$tk" -ctv "$tv" -v "$@" > "$log" 2>&1
    elif [ "$build" = upstream ]; then
        LD_LIBRARY_PATH=$UBIN timeout 3000 "$bin/llama-perplexity" -m "$model" -f "$TEST" -c "$ctx" "${ch[@]}" \
            -ngl 99 -fa on -ctk "$tk" -ctv "$tv" -v "$@" > "$log" 2>&1
    else
        timeout 3000 "$bin/llama-perplexity" -m "$model" -f "$TEST" -c "$ctx" "${ch[@]}" \
            -ngl 99 -fa on -ctk "$tk" -ctv "$tv" -v "$@" > "$log" 2>&1
    fi
    local rc=$?
    v=$(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$log" | awk '{print $5" | "$7}')
    # the last context's caches (llama.cpp may make a probe context first; Gemma's iSWA pair prints two lines)
    kv=$(awk '/llama_context: constructing/ {s = 0; n = 0} /llama_kv_cache: size =/ {for (i = 1; i < NF; i++) if ($i == "size") {s += $(i + 2); n++}} END {if (n) printf "%.2f (%s)", s, c} /llama_kv_cache: size =/ {c = $0; sub(/.*MiB \( */, "", c); sub(/ cells.*/, " cells", c)}' "$log")
    buf=$(awk '/llama_context: constructing/ {delete b} /KV buffer size/ {for (i = 2; i < NF; i++) if ($i == "KV") b[$(i - 1)] = 1} END {for (k in b) printf "%s ", k}' "$log")
    splits=$(grep -o 'graph: nodes = [0-9]*, splits = [0-9]*' "$log" | tail -1 | awk '{print $NF}')
    [ -n "$v" ] || v="FAILED (rc $rc, $(basename "$log")) | "
    echo "| $label | $ctx | $chunks | $shown | $tk | $tv | $v | ${kv:--} | ${buf:--} | ${splits:--} |" | tee -a "$table" >> "$out/summary.txt"
}

nuq=(--kv-outliers 0.01 --kv-sink 1)
# the agreement: the same nuq3 setting with the cache in VRAM and on the CPU (--no-kv-offload), same windows
agree() {  # label model kvq
    local cc=${CHUNKS_CPU:-4} cx=${CTX_CPU:-2048}
    ppl "$1" "$2" "$cx" "$cc" ours nuq3 nuq3 --kv-calib "$3" "${nuq[@]}"
    ppl "$1" "$2" "$cx" "$cc" ours nuq3 nuq3 --kv-calib "$3" "${nuq[@]}" --no-kv-offload
    GGML_EXT_KV_KBLOCK=0 ppl "$1" "$2" "$cx" "$cc" ours-kchannel nuq3 nuq3 --kv-calib "$3" "${nuq[@]}"
    GGML_EXT_KV_KBLOCK=0 ppl "$1" "$2" "$cx" "$cc" ours-kchannel nuq3 nuq3 --kv-calib "$3" "${nuq[@]}" --no-kv-offload
}
ladder() {  # label model ctx chunks kvq
    local t
    for t in f16 q8_0 q4_0; do ppl "$1" "$2" "$3" "$4" upstream "$t" "$t"; done
    ppl "$1" "$2" "$3" "$4" upstream-norot q4_0 q4_0
    ppl "$1" "$2" "$3" "$4" ours f16 f16
    if [ -n "$5" ]; then
        for t in nuq4 nuq3 nuq2; do ppl "$1" "$2" "$3" "$4" ours "$t" "$t" --kv-calib "$5" "${nuq[@]}"; done
    else
        say "no $1 calibration: its nuq rows are skipped"
    fi
}
if has ppl_smol; then
    ladder smollm2 "$SMOL_GGUF" "$CTX_SMOL" "${CHUNKS_SMOL:-0}" "$SMOL_KVQ"
    [ -n "$SMOL_KVQ" ] && agree smollm2 "$SMOL_GGUF" "$SMOL_KVQ"
fi
if has ppl_gemma; then
    for ctx in $CTX_GEMMA; do ladder gemma3 "$GEMMA_GGUF" "$ctx" "${CHUNKS_GEMMA:-0}" "$GEMMA_KVQ"; done
    [ -n "$GEMMA_KVQ" ] && [ "${AGREE:-1}" = 1 ] && agree gemma3 "$GEMMA_GGUF" "$GEMMA_KVQ"
fi

case ${BENCH_MODEL:-gemma} in
    smol) BM=$SMOL_GGUF BKVQ=$SMOL_KVQ BNOTE="(SmolLM2 was trained to 8192 positions: deeper rows time the cache, not the model's quality.)" ;;
    *) BM=$GEMMA_GGUF BKVQ=$GEMMA_KVQ BNOTE="(Gemma-3-270M was trained to 32768 positions: deeper rows time the cache, not the model's quality.)" ;;
esac
# one llama-bench row: build type depth ngen reps [extra...] -> prints "tg | stddev | KV MiB" (KV MiB from -v logs)
bench_row() {
    local build=$1 t=$2 d=$3 n=$4 reps=$5 r log=$out/bench-$1-$2-$3.log rc
    shift 5
    local args=(-m "$BM" -p 0 -n "$n" -d "$d" -r "$reps" -ngl 99 -fa 1 -ctk "$t" -ctv "$t" -o json "$@")
    if [ "$build" = upstream ]; then
        [ -n "$UBIN" ] || { echo "SKIPPED (no build) | | "; return; }
        r=$(LD_LIBRARY_PATH=$UBIN timeout 1800 "$UBIN/llama-bench" "${args[@]}" 2> "$log")
        rc=$?
    else
        case $t in nuq*)
            [ -n "$BKVQ" ] || { echo "SKIPPED (no calibration) | | "; return; }
            args+=(--kv-calib "$BKVQ") ;;
        esac
        r=$(GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 timeout 1800 "$BIN/llama-bench" "${args[@]}" 2> "$log")
        rc=$?
    fi
    echo "$r" >> "$log"
    local kv
    kv=$(awk '/llama_context: constructing/ {s = 0} /llama_kv_cache: size =/ {for (i = 1; i < NF; i++) if ($i == "size") s += $(i + 2)} END {if (s) printf "%.2f", s}' "$log")
    r=$(echo "$r" | "$PY" -c "import json,sys; x=json.load(sys.stdin)[0]; print(f\"{x['avg_ts']:.1f} | {x['stddev_ts']:.1f}\")" 2>/dev/null) ||
        r="FAILED (rc $rc, $(basename "$log")) |"
    echo "$r | ${kv:--}"
}
bench_header() {  # table title
    { echo "# $2: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"
      echo
      echo "llama-bench -ngl 99 -fa 1 -p 0 on $(basename "$BM"), K and V of the type; ours nuq with"
      echo "GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 --kv-calib $(basename "${BKVQ:-none}"); stock rows by the pristine"
      echo "upstream build, same run. $BNOTE KV MiB: llama.cpp's 'llama_kv_cache: size' lines of the last context (-v)."
      echo
      echo "| build | K / V | depth | tg t/s | stddev | KV MiB |"
      echo "| --- | --- | --- | --- | --- | --- |"; } >> "$1"
}
if has bench; then
    table=$top/kvquant_cuda_bench.md
    bench_header "$table" "KVQuant cache in VRAM, decode speed (tg$NGEN, $REPS reps)"
    for d in $DEPTHS; do
        for bt in upstream:f16 upstream:q4_0 ours:f16 ours:nuq4 ours:nuq3 ours:nuq2; do
            echo "| ${bt%%:*} | ${bt#*:} | $d | $(bench_row "${bt%%:*}" "${bt#*:}" "$d" "$NGEN" "$REPS" -v) |" | tee -a "$table" >> "$out/summary.txt"
        done
    done
fi
if has mem; then
    table=$top/kvquant_cuda_mem.md
    MD=${MEM_DEPTH:-131072}
    bench_header "$table" "KVQuant cache in VRAM at depth $MD (tg16, 1 rep)"
    for bt in upstream:f16 upstream:q8_0 upstream:q4_0 ours:nuq4 ours:nuq3 ours:nuq2; do
        echo "| ${bt%%:*} | ${bt#*:} | $MD | $(bench_row "${bt%%:*}" "${bt#*:}" "$MD" 16 1 -v) |" | tee -a "$table" >> "$out/summary.txt"
    done
fi
for f in "$top"/kvquant_cuda_*.md; do
    [ -f "$f" ] && { say "table: $f"; cat "$f"; }
done
