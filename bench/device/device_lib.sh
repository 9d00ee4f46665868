# Shared by the device scripts that build our CUDA tree (sourced, not run): device_codebooks.sh,
# device_anyprec_op.sh.
#   device_setup TOP NAME   $out = TOP/logs (tarred into TOP/logs.tgz, summary.txt copied to TOP on exit),
#                           say() appends to the summary, $PY = the device's torch venv unless PYTHON is set,
#                           $B = BUILD (default /tmp/bc), $jobs; writes the header (date, commit, GPUs)
#   device_build_cuda       configure $B once (GGML_EXT_CUDA=ON, sm_90), build ggml_ext_all and install into
#                           $B/install on every call (ninja redoes only what changed: a warm machine whose $B
#                           holds an older build picks up the current kernels; an unchanged tree costs seconds);
#                           exports P (the prefix), BIN, PYTHONPATH, GGML_EXT_PREFIX, LD_LIBRARY_PATH
#   device_test_cuda PATTERN N [ROUNDS]  scripts/test_cuda.sh ROUNDS times (default 2: a result that changes from
#                           run to run shows) into $out/test_cuda-{1,2}.log; the summary keeps rc, the lines matching PATTERN and the
#                           first N FAIL lines of each round
device_setup() {
    top=$1
    out=$top/logs
    mkdir -p "$out"
    trap 'tar czf "$top/logs.tgz" -C "$out" . && cp "$out/summary.txt" "$top/" 2>/dev/null; rm -rf "$out"' EXIT
    B=${BUILD:-/tmp/bc}
    PY=${PYTHON:-python3}  # the converter needs numpy, torch, transformers, safetensors, tqdm: the torch venv
    [ -z "${PYTHON:-}" ] && [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
    jobs=$(nproc)
    say "$2: $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    command -v nvidia-smi >/dev/null && nvidia-smi -L | tee -a "$out/summary.txt"
}

say() { echo "$*" | tee -a "$out/summary.txt"; }

device_build_cuda() {
    local t0
    t0=$(date +%s)
    { [ -f "$B/build.ninja" ] || cmake -S . -B "$B" -G Ninja -DGGML_EXT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
            -DPython3_EXECUTABLE="$(command -v "$PY")" > "$out/build.log" 2>&1; } &&
        cmake --build "$B" -j "$jobs" --target ggml_ext_all >> "$out/build.log" 2>&1 &&
        cmake --install "$B" --component ggml_ext --prefix "$B/install" >> "$out/build.log" 2>&1 ||
        { tail -60 "$out/build.log" | tee -a "$out/summary.txt"; exit 1; }
    say "build (ours, CUDA): $(( $(date +%s) - t0 )) s on $jobs cores"
    P=$B/install/ggml_ext
    BIN=$P/bin
    export PYTHONPATH=$PWD/python GGML_EXT_PREFIX=$P
    export LD_LIBRARY_PATH=$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

device_test_cuda() {
    local round
    for round in $(seq "${3:-2}"); do
        bash scripts/test_cuda.sh "$P" > "$out/test_cuda-$round.log" 2>&1
        say "make test-cuda (round $round): rc=$? | $(grep -E "$1" "$out/test_cuda-$round.log" | tr '\n' '|')"
        grep FAIL "$out/test_cuda-$round.log" | head -"$2" | tee -a "$out/summary.txt"
    done
}
