#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "Any-precision": the APQ op on CUDA in llama.cpp (MODE=op of device_anyprec.sh).
# The APQ_MUL_MAT op on CUDA in our llama.cpp, on the device machine: `MODE=op bash bench/device/device_anyprec.sh`
# runs this (what it does, its arguments and environment: the header of bench/device/device_anyprec.sh).
#   bash bench/device/device_anyprec_op.sh OUT [HF_DIR TEXT]
set -uo pipefail
cd "$(dirname "$0")/../.."
top=${1:?usage: device_anyprec_op.sh OUT [HF_DIR TEXT]} hf=${2:-} text=${3:-}
. bench/device/device_lib.sh   # from the repository root (cmake -S .)
device_setup "$top" "device_anyprec op"
BITS=${BITS:-3 4 5 6 7 8}
device_build_cuda

if [ -z "${SKIP_TESTS:-}" ]; then
    device_test_cuda '^(OK|FAILED|APQ|codebooks:)' 20
fi

bench() {  # name file [reps] (GGML_EXT_APQ_BITS from the caller's environment)
    "$BIN/llama-bench" -m "$2" -ngl 99 -p 512 -n 128 -r "${3:-5}" -o md > "$out/bench-$1.log" 2>&1
    say "bench $1:"; grep -E '^\|' "$out/bench-$1.log" | tail -2 | tee -a "$out/summary.txt"
    grep -q '^|' "$out/bench-$1.log" || tail -5 "$out/bench-$1.log" | tee -a "$out/summary.txt"
}
m=/tmp/apq-models; mkdir -p $m
TEMPLATE=${TEMPLATE:-$m/f16.gguf}

if [ "${BIG:-}" != only ] && [ -d "$hf" ]; then
    device=cpu
    "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && device=cuda
    conv() {  # name file args...
        local name=$1 f=$2; shift 2
        [ -s "$f" ] && return 0
        local t0=$(date +%s)
        "$PY" -c 'import sys; from ggml_ext.cli import main; sys.exit(main(sys.argv[1:]))' convert "$hf" -o "$f" "$@" \
            > "$out/convert-$name.log" 2>&1 || { say "convert $name FAILED"; tail -8 "$out/convert-$name.log" | tee -a "$out/summary.txt"; return 1; }
        say "convert $name: $(( $(date +%s) - t0 )) s, $(( $(stat -c %s "$f") / 1048576 )) MiB"
    }
    conv f16 $m/f16.gguf --type f16
    conv apq $m/apq.gguf --method anyprec --bits 3-8 --calib "$text" --calib-samples "${CALIB_SAMPLES:-8}" \
        --calib-seq-len 512 --device $device
    for ty in Q4_K Q3_K; do
        lc=$(echo $ty | tr A-Z a-z)
        [ -s $m/$lc.gguf ] || "$BIN/llama-quantize" $m/f16.gguf $m/$lc.gguf $ty > "$out/quantize-$lc.log" 2>&1 ||
            { say "llama-quantize $ty FAILED"; tail -5 "$out/quantize-$lc.log"; }
    done
    say "files: $(cd $m && ls -l *.gguf | awk '{printf "%s %.1f MiB; ", $9, $5/1048576}')"

    ppl() {  # name file args...: final estimate, offload and the CUDA weights' buffer
        local name=$1 file=$2; shift 2
        "$BIN/llama-perplexity" -m "$file" -f "$text" -c 512 --chunks "${CHUNKS:-8}" -b 512 "$@" > "$out/ppl-$name.log" 2>&1
        grep -q "Final estimate" "$out/ppl-$name.log" || grep -E "error|abort|ASSERT" "$out/ppl-$name.log" | head -5 | tee -a "$out/summary.txt"
        say "ppl $name: $(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$out/ppl-$name.log" || echo FAILED) | $(grep -o 'offloaded [0-9]*/[0-9]* layers to GPU' "$out/ppl-$name.log") | $(grep -o 'CUDA0 model buffer size = *[0-9.]* MiB' "$out/ppl-$name.log" | tr -s ' ') | $(grep -o 'CPU_Mapped model buffer size = *[0-9.]* MiB' "$out/ppl-$name.log" | tr -s ' ')"
    }
    if [ "${PPL:-1}" != 0 ] && [ -s $m/apq.gguf ] && [ -f "$text" ]; then
        CUDA_VISIBLE_DEVICES= ppl apq4-cpu $m/apq.gguf --apq-bits 4 -ngl 0 -t "$jobs"
        ppl apq4-ngl99 $m/apq.gguf --apq-bits 4 -ngl 99
        ppl apq4-ngl99-ub8 $m/apq.gguf --apq-bits 4 -ngl 99 -ub 8  # every batch through the GEMVs (v8)
        ppl apq4-ngl99-ub1 $m/apq.gguf --apq-bits 4 -ngl 99 -ub 1 --chunks 1  # one token at a time (v4)
        CUDA_VISIBLE_DEVICES= ppl apq4-cpu-1chunk $m/apq.gguf --apq-bits 4 -ngl 0 -t "$jobs" --chunks 1
        for b in 3 8; do
            ppl apq$b-ngl99 $m/apq.gguf --apq-bits $b -ngl 99
        done
        for ty in q4_k q3_k; do
            [ -s $m/$ty.gguf ] && ppl $ty-ngl99 $m/$ty.gguf -ngl 99
        done
    fi
    if [ "${BENCH:-1}" != 0 ]; then
        for round in $(seq 1 "${ROUNDS:-2}"); do  # alternating, so drift of clocks or temperature hits all alike
            for b in $BITS; do
                [ -s $m/apq.gguf ] && GGML_EXT_APQ_BITS=$b bench apq$b-$round $m/apq.gguf
            done
            for ty in q4_k q3_k; do
                [ -s $m/$ty.gguf ] && bench $ty-$round $m/$ty.gguf
            done
        done
    fi
elif [ "${BIG:-}" != only ]; then
    say "no HF folder (HF_DIR '$hf'): the default model's files, perplexity and bench skipped"
fi

if [ -n "${BIG:-}" ]; then
    if [ -f "$TEMPLATE" ]; then
        for ty in apq q4_k q3_k; do
            [ -s /tmp/big-$ty.gguf ] && continue
            t0=$(date +%s)
            "$PY" bench/runtime/make_bench_gguf.py "$TEMPLATE" /tmp/big-$ty.gguf --type $ty > "$out/make-big-$ty.log" 2>&1 ||
                { say "big $ty: make failed"; tail -5 "$out/make-big-$ty.log" | tee -a "$out/summary.txt"; }
            say "big $ty: $(tail -1 "$out/make-big-$ty.log") ($(( $(date +%s) - t0 )) s)"
        done
        for round in $(seq 1 "${ROUNDS:-1}"); do
            for b in $BITS; do
                [ -s /tmp/big-apq.gguf ] && GGML_EXT_APQ_BITS=$b bench big-apq$b-$round /tmp/big-apq.gguf 3
            done
            for ty in q4_k q3_k; do
                [ -s /tmp/big-$ty.gguf ] && bench big-$ty-$round /tmp/big-$ty.gguf 3
            done
        done
        [ -n "${KEEP_BIG:-}" ] || rm -f /tmp/big-*.gguf
    else
        say "BIG: no template GGUF at $TEMPLATE (run once with HF_DIR first, or set TEMPLATE=<llama.cpp checkout>/models/ggml-vocab-llama-spm.gguf): big files skipped"
    fi
fi
exit 0
