#!/usr/bin/env bash
# The any-precision CUDA kernels of the op on an NVIDIA machine, standalone (no llama.cpp build needed): builds
# tests/cuda/anyprec_cuda_bench.cu with ggml_ext/src/cuda/anyprec_cuda.cu and the C reference
# (formats/anyprec/anyprec.c, generic/anyprec.c), checks every GPU path against the CPU reference at 3..8 bits
# (the GEMV at 1, 2, 3, 5 and 8 tokens on the row-lane layout; the dequantize kernel bit-exact; dequantize +
# cuBLAS at 16 tokens) and times them against cuBLAS fp16 for 4096x4096, 11008x4096, 4096x11008, 14336x4096
# and 1000x1536 (padded row groups), as a fraction of the measured copy bandwidth. Timings are L2-cold and
# back to back (40 launches between two events, each on its own copy of the weights, the copies rotated over
# >= 3 x L2), the one-token GEMV and cuBLAS also in a CUDA graph and alone (one launch between two events,
# L2-warm); an empty kernel gives the launch floor of each method (first lines of the output). Writes
# $OUT/anyprec_cuda_bench.md (tables), anyprec_gpu.txt and anyprec_ptxas.txt (registers/spills per kernel).
# Exit status 1 on a mismatch. APQ_BITS=3 or 3-5: only those precisions.
# Usage: bench/device/device_anyprec.sh [OUTDIR] (default $OUT or /tmp). CUDA_ARCH (default 90), NVCC.
#
# Also anyprec_sass.txt: the SASS of the one-token GEMV at 3, 4 (8 warps) and 8 bits (16 warps), the
# 2..8-token GEMV at 3 bits, 2 and 8 tokens, and the dequantize kernel at 3 bits, when cuobjdump is there.
#
# The issue's table, $OUT/anyprec_gemv_table.md: per shape (the four Llama shapes), the one-token GEMV at each
# width 3..8 and cuBLAS fp16 (from the bench), then llama.cpp's own CUDA mat-vec of Q3_K, Q4_K, Q4_0 and F16 in
# the same run (bench/device/bench_mul_mat_backend.cpp, N = 1, weights streamed from memory: MB there is the
# weight bytes), each in us, GB/s and % of the copy bandwidth the bench measured. The llama.cpp rows need a CUDA
# build of ggml: GGML_PREFIX (an install prefix with include/ and lib/; default $BUILD/install/ggml_ext, BUILD
# default /tmp/bc, which MODE=op makes: our build runs llama.cpp's kernels for stock types; GGML_INCLUDE and
# GGML_LIBDIR for a build laid out otherwise, e.g. the pristine one of device_gpu_baseline.sh: $SRC/ggml/include
# and /tmp/up-cuda/bin); BUILD_GGML=1 makes ours first (cmake with GGML_EXT_CUDA=ON, as MODE=op; ~10 min cold on
# 16 cores). Without one, those rows are skipped with a line saying so. After the build the whole call takes
# ~3 minutes on an H200.
#
# Optional llama.cpp baseline: with LLAMA_TEST_BACKEND_OPS=/path/to/test-backend-ops (a CUDA build of the
# pristine llama.cpp: cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=ON, target
# test-backend-ops), runs `test-backend-ops perf -o MUL_MAT -b CUDA0` and keeps its q4_0 / q3_K mat-vec rows
# (n=1) in anyprec_llama_mulmat.txt; those shapes are upstream's perf cases (4096 x 4096 among them), not all
# of ours.
#
# MODE=op: the op, not the launchers: APQ_MUL_MAT in our llama.cpp's CUDA backend (src/cuda/apq_mul_mat.cu;
# APQ weights held in the row-lane layout in GPU memory, patches 0400 / 0420), in one call:
#   build  ours with GGML_EXT_CUDA=ON into $BUILD (default /tmp/bc, shared with device_codebooks.sh: a warm
#          machine's build is reused, ninja redoes what changed)
#   test   scripts/test_cuda.sh twice (tests/c/test_ext_ops.cpp: APQ_MUL_MAT on the GPU against the CPU at
#          precisions 3..8, 1 / 2 / 5 / 8 / 9 / 33 tokens, odd row counts, padded row lengths, piecewise
#          uploads read back; the other ops and types too); the summary keeps its "APQ GPU:" line
#   files  (with HF_DIR) the default model: f16 and an any-precision file (convert --method anyprec --bits
#          3-8, Fisher on TEXT, CALIB_SAMPLES x 512 tokens, on the GPU) by our converter, Q4_K and Q3_K by
#          llama-quantize from the f16; kept in /tmp/apq-models for a later call on the same machine
#   ppl    llama-perplexity of the APQ file at 4 bits on the CPU (-ngl 0) and at -ngl 99 with -ub 512 (dequantize
#          + cuBLAS) and -ub 8 (the GEMVs), and at 3 and 8 bits at -ngl 99: the GPU's must match the CPU's
#          closely; each line shows the offload and the CUDA buffer size (the APQ weights must be in it)
#   bench  llama-bench -ngl 99 (pp512, tg128) of the APQ file at each of BITS (default 3..8, through
#          GGML_EXT_APQ_BITS: llama-bench does not parse --apq-bits) and of the Q4_K / Q3_K files,
#          alternating over two rounds
#   big    (BIG=1; BIG=only skips files/ppl/bench above) Llama-2-7B-shaped random files
#          (bench/runtime/make_bench_gguf.py --type apq / q4_k / q3_k; the APQ file's embedding and output are
#          Q4_K, so only the decoder layers differ; tokenizer from TEMPLATE, default the f16 file made above:
#          see device_codebooks.sh), llama-bench -ngl 99 at each of BITS and Q4_K / Q3_K, one round (ROUNDS)
# Usage (device, repository root):
#   MODE=op bash bench/device/device_anyprec.sh OUT [HF_DIR TEXT]
# Writes OUT/summary.txt and OUT/logs.tgz. Environment: BUILD, SKIP_TESTS=1, PPL=0, BENCH=0, BIG, TEMPLATE,
# BITS, CHUNKS (perplexity chunks, 8), CALIB_SAMPLES (8), ROUNDS, PYTHON (default /opt/torch/.venv/bin/python3
# where it exists). See docs/formats/anyprec.md, "CUDA op".
#
# MODE=ppl: the quantizer's quality (no GPU kernel involved; the Fisher pass runs on the GPU): one model per
#   call (MODELS: smollm2 or gemma3), bench/anyprec/bench_anyprec.py: the one file (--bits 3-8, refinement depth
#   REFINE, default the method's) scored by our CPU llama-perplexity at every precision 3..8 (--apq-bits), the
#   same with BASELINE_REFINE (default 0: the paper's greedy upscaling; '' skips it), and the independent
#   Fisher-weighted k-means file at each width of INDEPENDENT (default 3,4,5,6,7,8), all on the same CALIB
#   (16x256) tokens of TRAIN; wiki-test ctx 512, CHUNKS (20) windows; STOCK (default none) stock types too
#   (without and with an imatrix of IMATRIX_CHUNKS x 512 TRAIN tokens, default 16; by our build unless
#   UPSTREAM names a pristine build's bin folder). STARTS / GAIN: the refinement's extra starts and gain
#   (bench/anyprec/bench_anyprec.py --starts / --gain; default the method's).
#   Needs SMOLLM2_HF / GEMMA3_HF (folders from bench/device/device_assets.py), TRAIN and TEST. GGML_EXT_PREFIX: an
#   installed build; unset: a CPU-only build of ours is made in BUILD_DIR (default /tmp/ggml-ext-apq-cpu,
#   reused on a warm machine). Writes OUTDIR/ppl-<model>.md / .json / .log and appends to OUTDIR/summary.txt.
# MODE=qtime: the quantizer's time (seed + upscaling, C, all cores) on LAYERS_7B (default 1) Llama-2-7B-shaped
#   random decoder layers at refinement depths REFINES (default 0,2), extrapolated to 32 layers
#   (bench/anyprec/bench_anyprec_sse.py --time-7b); appends to OUTDIR/summary.txt.
if [ "${MODE:-kernels}" = op ]; then
    exec bash "$(dirname "$0")/device_anyprec_op.sh" "$@"
fi
if [ "${MODE:-kernels}" = ppl ] || [ "${MODE:-kernels}" = qtime ]; then
    set -euo pipefail
    cd "$(dirname "$0")/../.."
    out=${1:-${OUT:?give OUTDIR or set OUT}}
    mkdir -p "$out"
    PY=${PYTHON:-$( [ -x /opt/torch/.venv/bin/python3 ] && echo /opt/torch/.venv/bin/python3 || echo python3)}
    if [ -z "${GGML_EXT_PREFIX:-}" ]; then
        build=${BUILD_DIR:-/tmp/ggml-ext-apq-cpu}
        cmake -S . -B "$build" -G Ninja -DPython3_EXECUTABLE="$(command -v "$PY")" >"$out/configure.log" 2>&1
        cmake --build "$build" -j "$(nproc)" --target ggml_ext_all >"$out/build.log" 2>&1
        cmake --install "$build" --component ggml_ext --prefix "$build/install" >/dev/null
        export GGML_EXT_PREFIX=$build/install/ggml_ext
    fi
    export LD_LIBRARY_PATH=$GGML_EXT_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    { date -u; git rev-parse --short HEAD 2>/dev/null || true; nvidia-smi -L 2>/dev/null || echo "no GPU"; nproc; } >>"$out/summary.txt"
    if [ "$MODE" = qtime ]; then
        PYTHONPATH=python "$PY" bench/anyprec/bench_anyprec_sse.py --time-7b --refine "${REFINES:-0,2}" ${VARIANTS:+--variants "$VARIANTS"} \
            --layers-7b "${LAYERS_7B:-1}" --threads "$(nproc)" 2>&1 | tee -a "$out/summary.txt"
        exit "${PIPESTATUS[0]}"
    fi
    calib=${CALIB:-16x256}
    m=${MODELS:-smollm2}
    case $m in smollm2) hf=${SMOLLM2_HF:?set SMOLLM2_HF} ;; gemma3) hf=${GEMMA3_HF:?set GEMMA3_HF} ;;
        *) echo "MODELS: one of smollm2, gemma3 per call, got $m" >&2; exit 2 ;; esac
    br=${BASELINE_REFINE-0}
    t0=$(date +%s)
    rc=0
    PYTHONPATH=python "$PY" bench/anyprec/bench_anyprec.py --models "$m" --hf "$m=$hf" --bits 3-8 \
        ${REFINE:+--refine "$REFINE"} ${STARTS:+--starts "$STARTS"} ${GAIN:+--gain "$GAIN"} \
        ${br:+--baseline-refine "$br"} --imatrix-chunks "${IMATRIX_CHUNKS:-16}" --upstream "${UPSTREAM:-none}" \
        --independent "${INDEPENDENT-3,4,5,6,7,8}" --stock "${STOCK:-}" \
        --calib-samples "${calib%x*}" --calib-seq-len "${calib#*x}" --chunks "${CHUNKS:-20}" --threads "$(nproc)" \
        --train "${TRAIN:?set TRAIN}" --test "${TEST:?set TEST}" --device "${DEVICE:-cuda}" \
        --json "$out/ppl-$m.json" >"$out/ppl-$m.md" 2>"$out/ppl-$m.log" || rc=$?
    { echo "== anyprec $m: exit $rc, $(( $(date +%s) - t0 )) s"; cat "$out/ppl-$m.md"; } | tee -a "$out/summary.txt"
    [ $rc -eq 0 ] || tail -n 20 "$out/ppl-$m.log" | tee -a "$out/summary.txt"
    exit $rc
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp}}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${CUDA_ARCH:-90}
for f in formats/anyprec/anyprec.c generic/anyprec.c; do
    gcc -std=gnu11 -O2 -Iggml_ext/include -Iggml_ext/src -c "ggml_ext/src/$f" -o "$work/$(echo "$f" | tr / _).o"
done
"$NVCC" -O3 -std=c++17 -arch=sm_$ARCH -Xptxas -v -c ggml_ext/src/cuda/anyprec_cuda.cu -o "$work/anyprec_cuda.o" \
    2> "$out/anyprec_ptxas.txt" || { grep -v "^ptxas info" "$out/anyprec_ptxas.txt" | tail -n 30; exit 1; }
"$NVCC" -O3 -std=c++17 -arch=sm_$ARCH -Xcompiler -fopenmp tests/cuda/anyprec_cuda_bench.cu "$work/anyprec_cuda.o" \
    "$work"/*anyprec.c.o -lcublas -lgomp -o "$work/anyprec_cuda_bench"
if command -v cuobjdump >/dev/null; then
    for f in _Z21apq_gemv_token_kernelILi3ELi8ELi2ELi3EEv13apq_token_setlPKf \
             _Z21apq_gemv_token_kernelILi4ELi8ELi2ELi3EEv13apq_token_setlPKf \
             _Z21apq_gemv_token_kernelILi8ELi16ELi2ELi1EEv13apq_token_setlPKf \
             _Z21apq_gemv_batch_kernelILi3ELi2ELi8ELb1EEvPK5uint4PK6__halflliiilPKfPf \
             _Z21apq_gemv_batch_kernelILi3ELi8ELi8ELb1EEvPK5uint4PK6__halflliiilPKfPf \
             _Z24apq_dequantize_rl_kernelILi3EEvPK5uint4PK6__halflliilPS3_; do
        cuobjdump -sass -fun "$f" "$work/anyprec_cuda.o" >> "$out/anyprec_sass.txt" 2>&1 || true
    done
fi
if [ -n "${LLAMA_TEST_BACKEND_OPS:-}" ]; then
    "$LLAMA_TEST_BACKEND_OPS" perf -o MUL_MAT -b CUDA0 2>&1 | grep -E "type_a=(q4_0|q3_K).*n=1," \
        > "$out/anyprec_llama_mulmat.txt" || true
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv > "$out/anyprec_gpu.txt" || true
rc=0
"$work/anyprec_cuda_bench" | tee "$out/anyprec_cuda_bench.md" || rc=$?  # 1 on a mismatch: the table still follows

# llama.cpp's own CUDA mat-vec on the same shapes, in the same run (see the header)
table=$out/anyprec_gemv_table.md
awk '/^## / { on = /^## one-token GEMV per width and shape/ } on && NF' "$out/anyprec_cuda_bench.md" > "$table"
bw=$(awk '/^bandwidth_GBps/ {print $2}' "$out/anyprec_cuda_bench.md")
gp=${GGML_PREFIX:-${BUILD:-/tmp/bc}/install/ggml_ext}
if [ "${BUILD_GGML:-0}" = 1 ]; then
    b=${BUILD:-/tmp/bc}
    { [ -f "$b/build.ninja" ] || cmake -S . -B "$b" -G Ninja -DGGML_EXT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH; } \
        > "$out/ggml_build.log" 2>&1 && cmake --build "$b" -j "$(nproc)" --target ggml_ext_all >> "$out/ggml_build.log" 2>&1 &&
        cmake --install "$b" --component ggml_ext --prefix "$b/install" >> "$out/ggml_build.log" 2>&1 ||
        { tail -30 "$out/ggml_build.log"; echo "BUILD_GGML failed"; }
fi
gi=${GGML_INCLUDE:-$gp/include} gl=${GGML_LIBDIR:-$gp/lib}
if [ -f "$gi/ggml.h" ] && ls "$gl"/libggml-base.* >/dev/null 2>&1 && [ -n "$bw" ]; then
    c++ -O2 -std=c++17 bench/device/bench_mul_mat_backend.cpp -I"$gi" -L"$gl" -lggml -lggml-base \
        -Wl,-rpath,"$gl" -o "$work/bmm" || exit 1
    for s in 4096x4096 11008x4096 4096x11008 14336x4096; do
        for t in q3_K q4_K q4_0 f16; do
            # prints: type M K N us_per_op weight_GB/s
            r=$("$work/bmm" "$t" "${s%x*}" "${s#*x}" 1 --backend CUDA0 --iters 10 --min-bytes 256M 2>>"$out/bmm.log" | tail -1) || true
            echo "$r" | awk -v bw="$bw" -v s="$s" 'NF == 6 { printf "| %s | llama.cpp %s | %.2f | %.2f | %.0f | %.1f |\n",
                s, $1, $6 * $5 / 1000, $5, $6, 100 * $6 / bw }' >> "$table"
        done
    done
else
    echo "(llama.cpp mat-vec rows skipped: no CUDA ggml at $gi, $gl; MODE=op or BUILD_GGML=1 builds one, or set GGML_PREFIX)" >> "$table"
fi
# one block per shape: APQ widths, cuBLAS, then llama.cpp's types (a stable sort on the shape column)
{ head -1 "$table"; echo; sed -n '2,3p' "$table"; tail -n +4 "$table" | grep '^|' | sort -s -t'|' -k2,2
  tail -n +4 "$table" | grep -v '^|' || true; } > "$table.tmp" && mv "$table.tmp" "$table"
echo; cat "$table"
exit $rc
