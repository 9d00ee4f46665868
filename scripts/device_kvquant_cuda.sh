#!/usr/bin/env bash
# The KVQuant cache types NUQ4 / NUQ3 / NUQ2 with the cache in VRAM (issue 20, docs/KVQUANT.md "The CUDA path";
# ggml_ext/src/cuda/kvquant_cuda.cu, patch 0421) on the device machine, in one run:
#   build    our CUDA tree (device_lib.sh) and the pristine upstream CUDA build of llama-perplexity / llama-bench
#            from SRC (the baseline of every stock-type row), reused on a warm machine
#   test     make test-cuda twice (tests/c/test_kvquant_cuda.cpp among the programs: NUQ SET_ROWS bytes, CPY /
#            GET_ROWS values bit for bit against the CPU, with and without outliers and the sink, flash attention)
#   calib    `ggml-ext calibrate kv` (CALIB samples x tokens of $TRAIN, 1% outliers, on CAL_DEVICE) for each model,
#            unless SMOL_CALIB / GEMMA_CALIB name existing files
#   ppl      llama-perplexity -ngl 99 -fa on on $TEST:
#            SmolLM2-135M at ctx CTX_SMOL (2048): upstream f16, q8_0, q4_0 (K and V); ours f16, and nuq4 / nuq3 /
#            nuq2 for K and V with --kv-outliers 0.01 --kv-sink 1; then the CPU reference of the same nuq3 setting
#            (--no-kv-offload: the cache and attention on the CPU) beside the VRAM cache, both on CHUNKS_CPU windows
#            (the end-to-end agreement check);
#            Gemma-3-270M at each ctx of CTX_GEMMA (8192 32768): upstream f16, q8_0, q4_0; ours f16 K with nuq4 /
#            nuq3 / nuq2 V (+ outliers + sink): KVQuant keys are refused for Gemma's sliding-window cache and its
#            K norm (docs/KVQUANT.md), so Gemma's rows quantize V only, and say so.
#            Each row logs the KV cache size llama.cpp prints, its buffer (CUDA0 or CPU) and the graph splits.
#   bench    llama-bench -ngl 99 -fa 1 -p 0 -n NGEN -d D (D in DEPTHS: 8192 32768) on SmolLM2: upstream f16 and q4_0,
#            ours f16, nuq4 and nuq3 (+ outliers + sink through GGML_EXT_KV_OUTLIERS / GGML_EXT_KV_SINK)
# One failing row is logged FAILED and the run goes on. Writes $OUT/kvquant_cuda_ppl.md / _bench.md (the tables)
# and the summary. The device allows 10 minutes a command: run the steps as separate calls on one warm machine
# (the builds and calibrations are reused; each call rebuilds nothing that is current):
#   STEPS=test     our build (cold ~5 min on the H100's 16 cores) + make test-cuda twice
#   STEPS=upstream the pristine upstream CUDA build
#   STEPS=calib    the two KV calibrations (TRAIN)
#   STEPS=ppl_smol, STEPS=ppl_gemma, STEPS=bench
#
# Usage (device, repository root):
#   SRC=/tmp/src/llama.cpp-0c1e57098 TRAIN=... TEST=... bash scripts/device_kvquant_cuda.sh $OUT
# Environment: SMOL_GGUF (default /tmp/assets/SmolLM2-135M-Instruct.Q4_1.gguf), GEMMA_GGUF (default
#   /tmp/assets/gemma-3-270m-q4_k_m.gguf), SMOL_HF / GEMMA_HF (HF folders for the calibration, default
#   /tmp/assets/smollm2-hf, /tmp/assets/gemma3-hf: scripts/device_assets.py makes both and the GGUFs),
#   SMOL_CALIB / GEMMA_CALIB, CALIB (16x2048), CAL_DEVICE (cuda), CTX_SMOL (2048), CTX_GEMMA ("8192 32768"),
#   CHUNKS_SMOL / CHUNKS_GEMMA (windows per row, 0 = every window the text holds; defaults 0 and 0),
#   CHUNKS_CPU (4), DEPTHS ("8192 32768"), NGEN (64), REPS (3), UP (pristine build dir, /tmp/up-kvq),
#   BUILD (our build dir, /tmp/bc), WORK (calibrations, /tmp/kvq-cuda), STEPS (default all: "test upstream calib
#   ppl_smol ppl_gemma bench"; "ppl" = both ppl steps).
set -uo pipefail
cd "$(dirname "$0")/.."
top=${1:?usage: device_kvquant_cuda.sh OUT}
. scripts/device_lib.sh
device_setup "$top" "device_kvquant_cuda"
STEPS=${STEPS:-test upstream calib ppl_smol ppl_gemma bench}
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

device_build_cuda
# the pristine upstream CUDA build (the stock rows' baseline), for the steps that use it
t0=$(date +%s)
UBIN=
if ! has upstream && ! has ppl_smol && ! has ppl_gemma && ! has bench; then
    :
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
    device_test_cuda '^(OK|FAIL|SKIP|nuq[234]|backend:)' 30
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
      echo "with --kv-calib (calibration $CALIB tokens of $(basename "${TRAIN:-?}"), 1% outliers) --kv-outliers 0.01 --kv-sink 1."
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
    if [ "$build" = upstream ]; then bin=$UBIN; else bin=$BIN; fi
    case " $* " in *" --no-kv-offload "*) shown="$build, KV on CPU" ;; esac
    n_row=$((n_row + 1))
    log=$out/ppl-$n_row-$label-$ctx-$build-$tk-$tv.log
    if [ -z "$bin" ] || [ ! -f "$model" ] || [ ! -f "$TEST" ]; then
        echo "| $label | $ctx | $chunks | $shown | $tk | $tv | SKIPPED (no build, model or TEST) | | | | |" >> "$table"
        return
    fi
    local ch=(); [ "$chunks" != 0 ] && ch=(--chunks "$chunks")
    if [ "$build" = upstream ]; then
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
if has ppl_smol; then
    cs=${CHUNKS_SMOL:-0}
    for t in f16 q8_0 q4_0; do ppl smollm2 "$SMOL_GGUF" "$CTX_SMOL" "$cs" upstream "$t" "$t"; done
    ppl smollm2 "$SMOL_GGUF" "$CTX_SMOL" "$cs" ours f16 f16
    if [ -n "$SMOL_KVQ" ]; then
        for t in nuq4 nuq3 nuq2; do
            ppl smollm2 "$SMOL_GGUF" "$CTX_SMOL" "$cs" ours "$t" "$t" --kv-calib "$SMOL_KVQ" "${nuq[@]}"
        done
        # the end-to-end agreement: the same nuq3 setting with the cache in VRAM and on the CPU (--no-kv-offload)
        cc=${CHUNKS_CPU:-4}
        ppl smollm2 "$SMOL_GGUF" "$CTX_SMOL" "$cc" ours nuq3 nuq3 --kv-calib "$SMOL_KVQ" "${nuq[@]}"
        ppl smollm2 "$SMOL_GGUF" "$CTX_SMOL" "$cc" ours nuq3 nuq3 --kv-calib "$SMOL_KVQ" "${nuq[@]}" --no-kv-offload
    else
        say "no SmolLM2 calibration: its nuq rows are skipped"
    fi
fi
if has ppl_gemma; then
    cg=${CHUNKS_GEMMA:-0}
    for ctx in $CTX_GEMMA; do
        for t in f16 q8_0 q4_0; do ppl gemma3 "$GEMMA_GGUF" "$ctx" "$cg" upstream "$t" "$t"; done
        ppl gemma3 "$GEMMA_GGUF" "$ctx" "$cg" ours f16 f16
        if [ -n "$GEMMA_KVQ" ]; then
            for t in nuq4 nuq3 nuq2; do
                ppl gemma3 "$GEMMA_GGUF" "$ctx" "$cg" ours f16 "$t" --kv-calib "$GEMMA_KVQ" "${nuq[@]}"
            done
        else
            say "no Gemma-3 calibration: its nuq rows are skipped"
        fi
    done
fi

if has bench; then
    table=$top/kvquant_cuda_bench.md
    { echo "# KVQuant cache in VRAM, decode speed: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"
      echo
      echo "llama-bench -ngl 99 -fa 1 -p 0 -n $NGEN -d D -r $REPS on SmolLM2-135M ($(basename "$SMOL_GGUF")), K and V of the type;"
      echo "ours nuq with GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 --kv-calib; stock rows by the pristine upstream build."
      echo "(SmolLM2 was trained to 8192 positions: the 32768 rows time the cache, not the model's quality.)"
      echo
      echo "| build | K / V | depth | tg t/s | stddev |"
      echo "| --- | --- | --- | --- | --- |"; } >> "$table"
    bench() {  # build type depth
        local build=$1 t=$2 d=$3 r log=$out/bench-$1-$2-$3.log
        local args=(-m "$SMOL_GGUF" -p 0 -n "$NGEN" -d "$d" -r "$REPS" -ngl 99 -fa 1 -ctk "$t" -ctv "$t" -o json)
        if [ "$build" = upstream ]; then
            [ -n "$UBIN" ] || { echo "| upstream | $t | $d | SKIPPED (no build) | |" >> "$table"; return; }
            r=$(LD_LIBRARY_PATH=$UBIN timeout 1800 "$UBIN/llama-bench" "${args[@]}" 2> "$log")
        else
            case $t in nuq*)
                [ -n "$SMOL_KVQ" ] || { echo "| ours | $t | $d | SKIPPED (no calibration) | |" >> "$table"; return; }
                args+=(--kv-calib "$SMOL_KVQ") ;;
            esac
            r=$(GGML_EXT_KV_OUTLIERS=0.01 GGML_EXT_KV_SINK=1 timeout 1800 "$BIN/llama-bench" "${args[@]}" 2> "$log")
        fi
        local rc=$?
        echo "$r" >> "$log"
        r=$(echo "$r" | "$PY" -c "import json,sys; x=json.load(sys.stdin)[0]; print(f\"{x['avg_ts']:.1f} | {x['stddev_ts']:.1f}\")" 2>/dev/null) ||
            r="FAILED (rc $rc, $(basename "$log")) |"
        echo "| $build | $t | $d | $r |" | tee -a "$table" >> "$out/summary.txt"
    }
    for d in $DEPTHS; do
        bench upstream f16 "$d"
        bench upstream q4_0 "$d"
        bench ours f16 "$d"
        bench ours nuq4 "$d"
        bench ours nuq3 "$d"
    done
fi
for f in "$top"/kvquant_cuda_*.md; do
    [ -f "$f" ] && { say "table: $f"; cat "$f"; }
done
