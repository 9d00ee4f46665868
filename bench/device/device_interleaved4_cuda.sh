#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "GPU path": interleaved types on CUDA against pristine upstream (agreement, perplexity, speed).
# The interleaved types on CUDA, on the device machine (docs/RESULTS.md "GPU path"):
#   build  ours with GGML_EXT_CUDA=ON (and, with --upstream, the pristine pinned llama.cpp with GGML_CUDA=ON,
#          same flags) unless already built
#   test   make test-cuda (tests/c/test_ext_ops.cpp, tests/c/test_types_backends.cpp on every GPU), and
#          test_types_backends through a CUDA ggml-rpc-server to a client that sees no GPU
#   model  MODEL (a Q4_0_8_8 GGUF, e.g. the default model repacked) and its Q4_0 / Q4_0_4_4 / Q4_0_4_8
#          twins (ggml-ext repack): perplexity on TEXT with -ngl 0, -ngl 10 and -ngl 99, over RPC with the
#          weights on the rpc-server's GPU, and -sm layer / -sm row over every GPU when there are two or more
#   bench  llama-bench -ngl 99 (pp512, tg128) of the Q4_0_8_8 file on ours and of the Q4_0 file on ours and
#          on upstream (with --upstream), in the same run; load time and GPU memory from the logs
#   big    (BIG=1; BIG=only skips the runs above) Llama-2-7B-shaped random Q4_0 and IQ4_NL files (bench/runtime/make_bench_gguf.py, MODEL as the
#          tokenizer template) and their 8x8 twins: llama-bench -ngl 99 on ours, the plain files on upstream,
#          alternating rounds; this is where decode is bound by memory bandwidth, as it is for users
# Placement: every perplexity run logs at -lv 4, so the summary shows where the loader put the weights
# ("CUDA0 model buffer size", "offloaded N/M layers").
# Usage (device, repository root): [BIG=1] bash bench/device/device_interleaved4_cuda.sh MODEL TEXT OUT [--upstream]
# Needs GGML_EXT_LLAMA_CPP_SRC (the unpacked pinned tree); writes OUT/summary.txt and OUT/logs.tgz.
set -uo pipefail
model=$1 text=$2 top=$3 upstream=${4:-}
out=$top/logs   # every log; packed into $top/logs.tgz at the end (the device returns few files)
mkdir -p "$out"
trap 'tar czf "$top/logs.tgz" -C "$out" . && cp "$out/summary.txt" "$top/" 2>/dev/null; rm -rf "$out"' EXIT
B=${BUILD:-/tmp/bc}
U=${UPSTREAM_BUILD:-/tmp/bu}
jobs=$(nproc)
say() { echo "$*" | tee -a "$out/summary.txt"; }

if [ ! -x "$B/install/ggml_ext/bin/llama-perplexity" ]; then
    t0=$(date +%s)
    cmake -S . -B "$B" -G Ninja -DGGML_EXT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DPython3_EXECUTABLE="$(command -v python3)" > "$out/build.log" 2>&1 &&
        cmake --build "$B" -j "$jobs" --target ggml_ext_all >> "$out/build.log" 2>&1 &&
        cmake --install "$B" --component ggml_ext --prefix "$B/install" >> "$out/build.log" 2>&1 ||
        { tail -60 "$out/build.log"; exit 1; }
    say "build (ours, CUDA): $(( $(date +%s) - t0 )) s on $jobs cores"
fi
if [ "$upstream" = --upstream ] && [ ! -x "$U/bin/llama-bench" ]; then
    t0=$(date +%s)
    UPSTREAM_BUILD_DIR=$U UPSTREAM_CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" JOBS=$jobs \
        bash scripts/build_upstream.sh > "$out/build_upstream.log" 2>&1 || { tail -40 "$out/build_upstream.log"; exit 1; }
    say "build (upstream, CUDA): $(( $(date +%s) - t0 )) s"
fi
P=$B/install/ggml_ext
BIN=$P/bin
export PYTHONPATH=$PWD/python GGML_EXT_PREFIX=$P

rpc_up() {  # a ggml-rpc-server on GPU 0 at port $1
    CUDA_VISIBLE_DEVICES=0 "$BIN/ggml-rpc-server" -H 127.0.0.1 -p "$1" > "$out/rpc-server-$1.log" 2>&1 &
    for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.2; done
    return 1
}
if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: a second call on the same machine, models only
for round in 1 2 3; do  # three rounds: a result that changes from run to run shows
    bash scripts/test_cuda.sh "$P" > "$out/test_cuda-$round.log" 2>&1
    say "make test-cuda (round $round): rc=$? | $(grep -E '^(OK|FAILED)' "$out/test_cuda-$round.log" | tr '\n' '|')"
    grep FAIL "$out/test_cuda-$round.log" | head -5
done

g++ -std=c++17 -O2 -I"$P/include" tests/c/test_types_backends.cpp -L"$P/lib" -lggml -lggml-base -lggml-cpu \
    -lggml-rpc -Wl,-rpath,"$P/lib" -o /tmp/test_types_backends
rpc_up 50052
CUDA_VISIBLE_DEVICES= /tmp/test_types_backends --rpc 127.0.0.1:50052 --rpc-gpu > "$out/test_types_rpc.log" 2>&1
say "types through a CUDA rpc-server to a GPU-less client: rc=$? | $(tail -1 "$out/test_types_rpc.log")"
kill %1 2>/dev/null; wait 2>/dev/null
fi

[ -f "$model" ] || { say "no model at $model: model runs skipped"; exit 0; }
m=/tmp/models; mkdir -p $m
cp "$model" $m/q4_0_8_8.gguf
for lay in q4_0 4x4 4x8; do
    python3 -c 'import sys; from ggml_ext.cli import main; sys.exit(main(sys.argv[1:]))' repack $m/q4_0_8_8.gguf \
        $m/$lay.gguf --layout $lay > "$out/repack-$lay.log" 2>&1 || { say "repack $lay failed"; tail -5 "$out/repack-$lay.log"; }
done
ppl() {  # name file args...: final estimate of llama-perplexity
    local name=$1 file=$2; shift 2
    "$BIN/llama-perplexity" -m "$file" -f "$text" -c 512 --chunks 16 -b 512 -lv 4 "$@" > "$out/ppl-$name.log" 2>&1
    grep -q "Final estimate" "$out/ppl-$name.log" || grep -E "error|abort|ASSERT|pre-allocated" "$out/ppl-$name.log" | head -5
    say "ppl $name: $(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$out/ppl-$name.log" || echo FAILED) | $(grep -o 'offloaded [0-9]*/[0-9]* layers to GPU' "$out/ppl-$name.log") |$(grep -o '[A-Za-z0-9_]* model buffer size = *[0-9.]* MiB' "$out/ppl-$name.log" | tr -s ' ' | tr '\n' ';')"
}
if [ "${BIG:-}" != only ]; then  # BIG=only: a later call on the same machine, the big files only
CUDA_VISIBLE_DEVICES= ppl q4_0_8_8-cpu $m/q4_0_8_8.gguf -ngl 0 -t 16
ppl q4_0_8_8-ngl10 $m/q4_0_8_8.gguf -ngl 10
ppl q4_0_8_8-ngl99 $m/q4_0_8_8.gguf -ngl 99
ppl q4_0-ngl99 $m/q4_0.gguf -ngl 99
ppl q4_0_4_4-ngl99 $m/4x4.gguf -ngl 99
ppl q4_0_4_8-ngl99 $m/4x8.gguf -ngl 99
rpc_up 50053
CUDA_VISIBLE_DEVICES= ppl q4_0_8_8-rpc $m/q4_0_8_8.gguf -ngl 99 --rpc 127.0.0.1:50053
kill %1 2>/dev/null; wait 2>/dev/null
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    ppl q4_0_8_8-sm-layer $m/q4_0_8_8.gguf -ngl 99 -sm layer
    ppl q4_0_8_8-sm-row $m/q4_0_8_8.gguf -ngl 99 -sm row
    ppl q4_0_8_8-sm-tensor $m/q4_0_8_8.gguf -ngl 99 -sm tensor -fa on
    ppl q4_0-sm-tensor $m/q4_0.gguf -ngl 99 -sm tensor -fa on
fi
fi

bench() {  # name bin file [reps]
    "$2/llama-bench" -m "$3" -ngl 99 -p 512 -n 128 -r "${4:-10}" -o md > "$out/bench-$1.log" 2>&1
    say "bench $1:"; grep -E '^\|' "$out/bench-$1.log" | tail -2 | tee -a "$out/summary.txt"
}
if [ -n "${BIG:-}" ]; then
    for ty in q4_0 iq4_nl; do
        python3 bench/runtime/make_bench_gguf.py "$model" $m/big-$ty.gguf --type $ty > "$out/make-big-$ty.log" 2>&1 &&
        python3 -c 'import sys; from ggml_ext.cli import main; sys.exit(main(sys.argv[1:]))' repack \
            $m/big-$ty.gguf $m/big-${ty}_8_8.gguf --layout 8x8 >> "$out/make-big-$ty.log" 2>&1 ||
            { say "big $ty: make/repack failed"; tail -5 "$out/make-big-$ty.log"; }
    done
    say "big files: $(cd $m && ls -l big-* | awk '{printf "%s %d MiB; ", $9, $5/1048576}')"
    for round in 1 2; do
        for ty in q4_0 iq4_nl; do
            bench big-ours-${ty}_8_8-$round "$BIN" $m/big-${ty}_8_8.gguf 5
            bench big-ours-$ty-$round "$BIN" $m/big-$ty.gguf 5
            [ -x "$U/bin/llama-bench" ] && bench big-upstream-$ty-$round "$U/bin" $m/big-$ty.gguf 5
        done
    done
    rm -f $m/big-*.gguf
fi
[ "${BIG:-}" = only ] && exit 0
for round in 1 2; do  # alternating, so drift of clocks or temperature hits all three alike
    bench ours-q4_0_8_8-$round "$BIN" $m/q4_0_8_8.gguf
    bench ours-q4_0-$round "$BIN" $m/q4_0.gguf
    [ -x "$U/bin/llama-bench" ] && bench upstream-q4_0-$round "$U/bin" $m/q4_0.gguf
done
exit 0
