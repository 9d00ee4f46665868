#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "GPU path" (the two-GPU rows): every format over two GPUs (-sm layer, -sm tensor)
# against one GPU, perplexity and speed, on the default model.
# Steps (STEPS, default "build files ppl bench"; the files and the build are kept in /tmp, so a later call on the
# same warm machine picks up where the last stopped):
#   build  our CUDA tree (device_lib.sh; reused when $BUILD holds it). SRC, the pinned llama.cpp source: unset,
#          .device/llama.cpp-src.tar.xz is unpacked (the device has no PyPI to fetch it from)
#   files  from the default model's HF folder HF (default /tmp/assets/smollm2-hf; missing, bench/device/
#          device_assets.py is asked to make it from SmolLM2 pieces carried in .device/), by our converter, all at
#          once (torch work split over cuda:0 and cuda:1): f16; Q4_0_8_8 and IQ4_NL_8_8 (the interleaved files
#          `convert --type q4_0_8_8 / iq4_nl_8_8` writes); CB2 and CB3 (act-importance on CALIB tokens of TRAIN);
#          one any-precision file (--method anyprec --bits 3-8, Fisher on CALIB tokens of TRAIN); a KV calibration
#          (`ggml-ext calibrate kv`, CALIB tokens of TRAIN, nuq3 and nuq4 tables) for the NUQ cache rows
#   ppl    llama-perplexity -c 512 --chunks CHUNKS -b 512 -ngl 99 on TEST, each row on one GPU (-dev CUDA0), over
#          both by layers (-dev CUDA0,CUDA1 -sm layer) and cut by tensors (-sm tensor): the files above; the APQ
#          file at --apq-bits 4 and 8; the f16 file with nuq4 and nuq3 K and V caches (--kv-calib, -fa on). APQ and
#          NUQ caches are refused under -sm tensor (bitplanes and calibrated caches cannot be cut across
#          devices): the table keeps the refusal line, and a row that ran where a refusal was due is marked
#   bench  llama-bench -ngl 99 -p NPP -n NGEN -r REPS of every row that ran, in the same three modes (APQ
#          precision through GGML_EXT_APQ_BITS: llama-bench does not parse --apq-bits)
#   test   scripts/test_cuda.sh with this machine's assets (--default-hf, --wiki-test, --wiki-train): the C
#          programs on every GPU, and with two GPUs tests/cuda/test_two_gpus.py (not in the default STEPS: its
#          own files and runs take minutes more)
# Writes TOP/two_gpu.md (file | mode | PPL | PPL one GPU | delta | tg t/s | pp t/s, or the refusal or failure),
# TOP/summary.txt and TOP/logs.tgz (every tool's log). One failing step or row is logged and the run goes on.
# Usage (device with two GPUs, repository root):
#   bash bench/device/device_two_gpu.sh $OUT
# A fresh machine's build takes about 5 minutes of the device's 10 a call: there, first
#   STEPS="build files" bash bench/device/device_two_gpu.sh $OUT    then    STEPS="ppl bench" ... (same OUT name)
# Assets on the device: HF as above; TEST (default the first of /tmp/assets/wiki.test.txt, .device/wiki.test.txt)
# and TRAIN (default /tmp/assets/wiki.train.txt, .device/wiki.train.txt, else TEST): carry the wiki-test /
# wiki-train assets' files (`ggml-ext assets path wiki-test`) in .device/.
# Environment: BUILD (/tmp/bc), WORK (files, /tmp/two-gpu), CHUNKS (8), REPS (3), NPP (512), NGEN (128), CALIB
#   (8x512: samples x tokens), ROWS (default every row: f16 q4_0_8_8 iq4_nl_8_8 cb2 cb3 apq4 apq8 nuq4 nuq3),
#   PYTHON (the converter's python, default the device's torch venv).
# device_assets.py needs the gguf package on the device (carry its wheel: that script's header).
# A dry run of the script on a machine without GPUs: NO_BUILD=1 P=PREFIX (an installed build of ours), DEV_ONE /
#   DEV_TWO (default CUDA0 / CUDA0,CUDA1: e.g. RPC0 / RPC0,RPC1), TOOL_ARGS (e.g. "--rpc 127.0.0.1:50052,
#   127.0.0.1:50053" without the space) and CAL_DEVICES (the torch work's two devices, default "cuda:0 cuda:1";
#   "cpu" there). Give it rpc-servers started for it: the pinned rpc-server, after serving earlier clients, can
#   compute NaN for a later -sm tensor client (seen after a larger batch, and after -dev RPC0 then -sm layer runs;
#   pristine upstream's server too).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
top=${1:?usage: device_two_gpu.sh OUT}
mkdir -p "$top"
top=$(cd "$top" && pwd)
. bench/device/device_lib.sh
device_setup "$top" "device_two_gpu"
STEPS=${STEPS:-build files ppl bench}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
W=${WORK:-/tmp/two-gpu}
mkdir -p "$W"
CHUNKS=${CHUNKS:-8}
REPS=${REPS:-3}
CALIB=${CALIB:-8x512}
NPP=${NPP:-512}
NGEN=${NGEN:-128}
ROWS=${ROWS:-f16 q4_0_8_8 iq4_nl_8_8 cb2 cb3 apq4 apq8 nuq4 nuq3}
DEV_ONE=${DEV_ONE:-CUDA0}
DEV_TWO=${DEV_TWO:-CUDA0,CUDA1}
read -ra TOOL_ARGS <<< "${TOOL_ARGS:-}"
HF=${HF:-/tmp/assets/smollm2-hf}
first_file() { local f; for f in "$@"; do [ -n "$f" ] && [ -f "$f" ] && { echo "$f"; return; }; done; }
TEST=${TEST:-$(first_file /tmp/assets/wiki.test.txt .device/wiki.test.txt)}
TRAIN=${TRAIN:-$(first_file /tmp/assets/wiki.train.txt .device/wiki.train.txt "$TEST")}
[ -n "$TEST" ] && TEST=$(realpath "$TEST")
[ -n "$TRAIN" ] && TRAIN=$(realpath "$TRAIN")

# ---- assets (before the build, which sets PYTHONPATH: device_assets.py imports the gguf package from the
# caller's, e.g. carried wheels unpacked into /tmp/site) ----
if [ ! -f "$HF/config.json" ] && [ "$HF" = /tmp/assets/smollm2-hf ] && has files; then
    "$PY" bench/device/device_assets.py /tmp/assets .device > "$out/assets.log" 2>&1
    say "device_assets.py: rc=$? | $(tail -3 "$out/assets.log" | tr '\n' '|')"
fi
say "assets: HF ${HF} ($([ -f "$HF/config.json" ] && echo present || echo MISSING)), TEST ${TEST:-MISSING}, TRAIN ${TRAIN:-MISSING}"

# ---- build ----
if [ "${NO_BUILD:-0}" = 1 ]; then  # a dry run on an existing build of ours
    : "${P:?NO_BUILD=1 needs P=our prefix (holding bin/, lib/)}"
    BIN=$P/bin
    export PYTHONPATH=$PWD/python GGML_EXT_PREFIX=$P LD_LIBRARY_PATH=$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    if [ -z "${GGML_EXT_LLAMA_CPP_SRC:-}" ]; then  # cmake reads it when it configures, ninja's reruns included
        if [ -z "${SRC:-}" ]; then
            SRC=/tmp/src/llama.cpp-0c1e57098
            [ -d "$SRC" ] || [ ! -f .device/llama.cpp-src.tar.xz ] ||
                { mkdir -p /tmp/src && tar -xJf .device/llama.cpp-src.tar.xz -C /tmp/src; }
        fi
        if [ -d "$SRC" ]; then
            export GGML_EXT_LLAMA_CPP_SRC=$SRC
        else
            say "no pinned llama.cpp source (SRC, or .device/llama.cpp-src.tar.xz): the build fetches it"
        fi
    fi
    if has build || [ ! -x "$B/install/ggml_ext/bin/llama-perplexity" ]; then
        device_build_cuda  # exits on a failed build: no step below can run without it
    else
        P=$B/install/ggml_ext BIN=$B/install/ggml_ext/bin
        export PYTHONPATH=$PWD/python GGML_EXT_PREFIX=$P LD_LIBRARY_PATH=$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
fi

# the devices the two-device rows name, as this build's registry lists them
devices=$("$BIN/llama-perplexity" "${TOOL_ARGS[@]}" --list-devices 2>&1)
echo "$devices" > "$out/devices.txt"
two_ok=1
for d in ${DEV_TWO//,/ }; do
    grep -qE "^\s*$d:" <<< "$devices" || two_ok=0
done
# the converters' torch work: split over both GPUs where there are two
read -ra CAL_DEV <<< "${CAL_DEVICES:-$([ "$two_ok" = 1 ] && echo cuda:0 cuda:1 || echo cuda:0)}"
[ "${#CAL_DEV[@]}" -ge 2 ] || CAL_DEV+=("${CAL_DEV[0]}")
[ "$two_ok" = 1 ] || say "this build lists no $DEV_TWO (devices: $(grep -E '^\s+\S+:' <<< "$devices" | tr -s ' ' | tr '\n' ';')): the two-device rows are skipped"

# ---- files ----
cli() { "$PY" -c 'import sys; from ggml_ext.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
conv() {  # name file args...: our converter (or `calibrate kv` when the first arg is "kv"), kept when made before
    local name=$1 f=$2 t0
    shift 2
    [ -s "$f" ] && { say "$name: $f kept from an earlier call"; return 0; }
    t0=$(date +%s)
    if [ "$1" = kv ]; then
        shift
        cli calibrate kv "$HF" -o "$f" "$@" --force -q > "$out/convert-$name.log" 2>&1
    else
        cli convert "$HF" -o "$f" "$@" > "$out/convert-$name.log" 2>&1
    fi
    local rc=$?
    if [ $rc -ne 0 ] || [ ! -s "$f" ]; then
        rm -f "$f"
        say "$name: FAILED (rc=$rc) | $(grep -vE '^\s*$' "$out/convert-$name.log" | tail -3 | tr '\n' '|')"
        return 1
    fi
    say "$name: $(( $(date +%s) - t0 )) s, $(numfmt --to=iec-i --suffix=B "$(stat -c %s "$f")")"
}
if has files; then
    if [ ! -f "$HF/config.json" ] || [ -z "$TRAIN" ]; then
        say "files: no HF folder or no calibration text: no files made"
    else
        t0=$(date +%s)
        cal=(--calib "$TRAIN" --calib-samples "${CALIB%x*}" --calib-seq-len "${CALIB#*x}")
        # side by side: the CPU-bound conversions and, split over the two GPUs, the ones that calibrate with torch
        conv f16 "$W/f16.gguf" --type f16 &
        conv q4_0_8_8 "$W/q4_0_8_8.gguf" --type q4_0_8_8 &
        conv iq4_nl_8_8 "$W/iq4_nl_8_8.gguf" --type iq4_nl_8_8 &
        { conv cb2 "$W/cb2.gguf" --type cb2 "${cal[@]}" --device "${CAL_DEV[0]}"
          conv apq "$W/apq.gguf" --method anyprec --bits 3-8 "${cal[@]}" --device "${CAL_DEV[0]}"; } &
        { conv cb3 "$W/cb3.gguf" --type cb3 "${cal[@]}" --device "${CAL_DEV[1]}"
          conv kv "$W/kv.kvq.gguf" kv --text "$TRAIN" --samples "${CALIB%x*}" --seq-len "${CALIB#*x}" --bits 3,4 \
              --device "${CAL_DEV[1]}"; } &
        wait
        say "files: $(( $(date +%s) - t0 )) s | $(find "$W" -maxdepth 1 -name '*.gguf' -printf '%f %s\n' | sort | numfmt --field=2 --to=iec-i --suffix=B | tr -s ' ' | tr '\n' ';')"
    fi
fi

# ---- one row: file, extra tool arguments, environment; the refusal expected under -sm tensor ----
row_file() {
    case $1 in
        f16 | nuq4 | nuq3) echo "$W/f16.gguf" ;;
        apq4 | apq8) echo "$W/apq.gguf" ;;
        *) echo "$W/$1.gguf" ;;
    esac
}
row_ppl_args() {  # llama-perplexity's arguments beyond the mode's
    case $1 in
        apq4) echo "--apq-bits 4" ;;
        apq8) echo "--apq-bits 8" ;;
        nuq4 | nuq3) echo "-ctk $1 -ctv $1 --kv-calib $W/kv.kvq.gguf -fa on" ;;
    esac
}
row_bench_args() {  # llama-bench's
    case $1 in
        nuq4 | nuq3) echo "-ctk $1 -ctv $1 --kv-calib $W/kv.kvq.gguf -fa 1" ;;
    esac
}
row_bench_env() {  # llama-bench reads the APQ precision from the environment only
    case $1 in apq4 | apq8) echo "GGML_EXT_APQ_BITS=${1#apq}" ;; esac
}
refused_under_tensor() { case $1 in apq* | nuq*) return 0 ;; esac; return 1; }
row_label() {
    case $1 in
        apq4 | apq8) echo "apq.gguf (3-8 bits) at ${1#apq} bits" ;;
        nuq4 | nuq3) echo "f16.gguf, $1 K and V cache" ;;
        *) echo "$1.gguf" ;;
    esac
}
mode_ppl_args() {
    case $1 in
        one) echo "-dev $DEV_ONE" ;;
        layer) echo "-dev $DEV_TWO -sm layer" ;;
        tensor) echo "-dev $DEV_TWO -sm tensor" ;;
    esac
}
mode_bench_args() { mode_ppl_args "$1" | sed 's|,|/|g'; }  # llama-bench separates one run's devices by '/'
mode_label() { case $1 in one) echo "one GPU ($DEV_ONE)" ;; *) echo "-sm $1 ($DEV_TWO)" ;; esac; }

# the reason a tool stopped: its refusal or error line, without the log's time, level and function prefixes
# (markdown-safe)
why() {
    { grep -m1 -E "cut across devices|cannot|refus" "$1" || grep -m1 -iE "error|failed|abort" "$1" || tail -1 "$1"; } |
        sed -E 's/^[0-9.]+ [A-Z] //; s/^([a-z_]+: *)+//; s/^(error loading model|failed to initialize the context): //;
            s/\|/\\|/g' | cut -c1-"${2:-300}"
}

declare -A PPL=() PPLERR=() STATE=()
run_ppl() {  # row mode: llama-perplexity; PPL[row-mode] or STATE[row-mode] = "refused: ..." / "FAILED: ..."
    local row=$1 mode=$2 f log rc
    f=$(row_file "$row")
    log=$out/ppl-$row-$mode.log
    if [ ! -s "$f" ]; then
        STATE[$row-$mode]="FAILED: no file (files step)"
        return
    fi
    case $row in nuq*) [ -s "$W/kv.kvq.gguf" ] || { STATE[$row-$mode]="FAILED: no file (files step: KV calibration)"; return; } ;; esac
    # shellcheck disable=SC2046  # the row's and mode's arguments are words
    for _ in 1 2 3; do  # llama.cpp's log thread can lose the last lines when a tool exits at once
        timeout 300 "$BIN/llama-perplexity" -m "$f" -f "$TEST" -c 512 --chunks "$CHUNKS" -b 512 \
            -ngl 99 -lv 4 "${TOOL_ARGS[@]}" $(mode_ppl_args "$mode") $(row_ppl_args "$row") > "$log" 2>&1
        rc=$?
        grep -q "Final estimate" "$log" && break
        [ $rc -ne 0 ] && grep -qE "cut across devices|cannot|error" "$log" && break
    done
    local v
    v=$(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$log")
    if [ -n "$v" ]; then
        PPL[$row-$mode]=$(awk '{print $5}' <<< "$v")
        PPLERR[$row-$mode]=$(awk '{print $7}' <<< "$v")
        if [ "$mode" = tensor ] && refused_under_tensor "$row"; then
            STATE[$row-$mode]="NOT REFUSED: ran under -sm tensor"
        fi
    elif [ "$mode" = tensor ] && refused_under_tensor "$row" && [ $rc -ne 0 ] && [ $rc -lt 128 ] &&
            grep -q "cut across devices" "$log"; then
        STATE[$row-$mode]="refused (as due): $(why "$log")"
    else
        STATE[$row-$mode]="FAILED (rc=$rc): $(why "$log")"
    fi
    say "ppl $row $mode: ${PPL[$row-$mode]:-} ${STATE[$row-$mode]:-} | $(grep -oE '\S+ +model buffer size = *[0-9.]+ MiB' "$log" |
        tr -s ' ' | tr '\n' ';')"
}

declare -A TG=() PP=()
run_bench() {  # row mode: llama-bench pp512 / tg128 into PP / TG ("avg ± sd") or "FAILED"
    local row=$1 mode=$2 f log
    f=$(row_file "$row")
    log=$out/bench-$row-$mode.log
    # shellcheck disable=SC2046
    env $(row_bench_env "$row") timeout 300 "$BIN/llama-bench" -m "$f" -ngl 99 -p "$NPP" -n "$NGEN" -r "$REPS" -o json \
        "${TOOL_ARGS[@]}" $(mode_bench_args "$mode") $(row_bench_args "$row") > "$log.json" 2> "$log"
    local rc=$? r
    r=$("$PY" -c "
import json, sys
pp = tg = 'FAILED'
for x in json.load(open(sys.argv[1])):
    v = f\"{x['avg_ts']:.1f} ± {x['stddev_ts']:.1f}\"
    if x['n_prompt'] > 0: pp = v
    if x['n_gen'] > 0: tg = v
print(pp + '|' + tg)" "$log.json" 2>/dev/null)
    PP[$row-$mode]=${r%%|*}
    TG[$row-$mode]=${r##*|}
    [ -n "$r" ] || { PP[$row-$mode]="FAILED (rc=$rc): $(why "$log" 120)"; TG[$row-$mode]=FAILED; }
    say "bench $row $mode: pp ${PP[$row-$mode]} | tg ${TG[$row-$mode]}"
}

modes=(one)
[ "$two_ok" = 1 ] && modes+=(layer tensor)
if has ppl; then
    if [ -z "$TEST" ]; then
        say "ppl: no TEST text: no perplexity rows"
    else
        for row in $ROWS; do
            for mode in "${modes[@]}"; do run_ppl "$row" "$mode"; done
        done
    fi
fi
if has bench; then
    for row in $ROWS; do
        for mode in "${modes[@]}"; do
            case ${STATE[$row-$mode]:-} in refused* | "FAILED: no file"*) continue ;; esac
            [ -s "$(row_file "$row")" ] && run_bench "$row" "$mode"
        done
    done
fi

# ---- the table ----
if has ppl || has bench; then
    table=$top/two_gpu.md
    { echo "# Two GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | tr '\n' ' ')commit $(git rev-parse --short HEAD 2>/dev/null), $(date -u +%F)"
      echo
      echo "SmolLM2-135M-Instruct (HF folder dequantized from the smollm2 asset), files by our converter ($CALIB calibration"
      echo "tokens of $(basename "${TRAIN:-?}") where a method calibrates). PPL: llama-perplexity -c 512 --chunks $CHUNKS -b 512"
      echo "-ngl 99 on $(basename "${TEST:-?}"); delta against the same row on one GPU. Speed: llama-bench -ngl 99 -p $NPP -n $NGEN"
      echo "-r $REPS, t/s ± stddev. Modes: one GPU (-dev $DEV_ONE), -sm layer / -sm tensor over -dev $DEV_TWO."
      echo
      echo "| file | mode | PPL | PPL one GPU | delta | tg t/s | pp t/s |"
      echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"; } > "$table"
    for row in $ROWS; do
        for mode in "${modes[@]}"; do
            k=$row-$mode
            p=${PPL[$k]:-} p1=${PPL[$row-one]:-}
            if [ -n "$p" ]; then
                pcell="$p ± ${PPLERR[$k]}"
                delta=$( [ -n "$p1" ] && [ "$mode" != one ] && awk -v a="$p" -v b="$p1" 'BEGIN { printf "%+.3f %%", (a - b) / b * 100 }' || echo -)
            else
                pcell=${STATE[$k]:-"-"} delta=-
            fi
            [ -n "$p" ] && [ -n "${STATE[$k]:-}" ] && pcell="$pcell (${STATE[$k]})"
            echo "| $(row_label "$row") | $(mode_label "$mode") | $pcell | ${p1:--} | $delta | ${TG[$k]:--} | ${PP[$k]:--} |"
        done
    done >> "$table"
    tee -a "$out/summary.txt" < "$table"
fi

# ---- test-cuda with this machine's assets (the two-GPU checks among them) ----
if has test; then
    targs=()
    [ -f "$HF/config.json" ] && targs+=(--default-hf "$HF")
    [ -n "$TEST" ] && targs+=(--wiki-test "$TEST")
    [ -n "$TRAIN" ] && targs+=(--wiki-train "$TRAIN")
    PYTHON=$PY bash scripts/test_cuda.sh "$P" "${targs[@]}" > "$out/test_cuda.log" 2>&1
    say "make test-cuda (with the assets): rc=$? | $(grep -E '^(OK|FAIL)|passed|failed|skipped|SKIPPED' "$out/test_cuda.log" | tr '\n' '|')"
    grep -E "FAIL|Error" "$out/test_cuda.log" | head -20 | tee -a "$out/summary.txt"
fi
exit 0
