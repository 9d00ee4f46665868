#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "Codebooks (CB2/CB3)": CUDA correctness, perplexity and 7B-shaped speed.
# The codebook types CB2 / CB3 on CUDA, on the device machine (ggml_ext/src/cuda/codebooks_cuda.cu, patch 0410):
#   build  ours with GGML_EXT_CUDA=ON into $BUILD (default /tmp/bc) unless $BUILD/install already holds it
#   test   scripts/test_cuda.sh (tests/c/test_types_backends.cpp: CB2/CB3 mul_mat on each GPU against the
#          exact product and the CPU, batches 1, 2..8, 9, 33, 512; plus the interleaved types and the ops),
#          twice with the default integer mat-vec (q8_1 activations, dp4a), once with GGML_EXT_CB_MMV=f32 (the
#          f32 mat-vec it replaced, kept for comparison)
#   files  from the default model's HF folder: f16, cb2 and cb3 by our converter (act-importance on CALIB,
#          16 x 512 tokens, layers on the GPU), Q2_K / Q3_K_S / Q4_0 twins by llama-quantize from the f16
#   ppl    llama-perplexity of the cb2 file on TEXT (16 chunks of 512) with -ngl 99 and on the CPU only
#          (CUDA_VISIBLE_DEVICES= -ngl 0): the two must agree closely (the GPU runs f32 / f16 activations,
#          the CPU Q8_K); cb3 likewise
#   bench  llama-bench -ngl 99 (pp512, tg128) of cb2, cb3, q2_k, q3_k_s, q4_0, alternating over two rounds
#          (SmolLM2's only matrices with rows of a multiple of 256 are ffn_down: the rest of its cb files fall
#          back to other types, and 135M parameters measure kernel launches more than the weights' reads)
#   big    (BIG=1; BIG=only skips everything above but the build) Llama-2-7B-shaped random files of CB2, CB3,
#          Q2_K, Q3_K, Q4_0 in every matrix (bench/runtime/make_bench_gguf.py; its tokenizer from TEMPLATE, default
#          the f16 file an earlier call made, else llama.cpp's vocab-only ggml-vocab-llama-spm.gguf from a tree
#          with models/: the device's pinned tarball has none, so give TEMPLATE there): llama-bench
#          -ngl 99 pp512 / tg128, alternating; CB2 / CB3 also with GGML_EXT_CB_MMV=f32 (bench lines
#          big-cb2-f32mmv-*: the f32 mat-vec, against big-cb2-* the integer one);
#          this is where decode is bound by reading the weights, the kernels' real comparison
# Usage (device, repository root):
#   bash bench/device/device_codebooks.sh HF_DIR TEXT OUT [CALIB]
#   HF_DIR  the default model's HF folder (bench/device/device_assets.py unpacks it to /tmp/assets/smollm2-hf)
#   TEXT    perplexity text (wiki-test); CALIB: calibration text for the converter (wiki-train; default TEXT)
# Needs a python with numpy, torch, transformers, safetensors, tqdm (PYTHON; default /opt/torch/.venv/bin/python3
# where it exists, else python3); writes OUT/summary.txt and OUT/logs.tgz. Environment: BUILD, SKIP_TESTS=1, CALIB_SAMPLES (16),
# CHUNKS (perplexity chunks, 16), PPL=0 (no perplexity), BENCH=0 (no llama-bench), F32MMV=0 (no test / big bench of
# the f32 mat-vec beside the default integer one). The files stay in
# /tmp/cb-models and are reused by a later call on the same warm machine. Each device call has 10 minutes:
#   call 1  PPL=0 BENCH=0 bash bench/device/device_codebooks.sh /tmp/assets/smollm2-hf WIKI_TEST $OUT WIKI_TRAIN
#           (test-cuda, the files: a cb conversion took 8 min on 2 busy cores here with CALIB_SAMPLES=2)
#   call 2  SKIP_TESTS=1 BENCH=0 bash bench/device/device_codebooks.sh ...same...   (perplexity)
#   call 3  SKIP_TESTS=1 PPL=0 bash bench/device/device_codebooks.sh ...same...     (llama-bench)
#   call 4  BIG=only bash bench/device/device_codebooks.sh - - $OUT                  (7B-shaped speed)
#           or, without call 1's f16 file (as measured for docs/RESULTS.md):
#           SKIP_TESTS=1 BIG=only TEMPLATE=<llama.cpp checkout>/models/ggml-vocab-llama-spm.gguf \
#               bash bench/device/device_codebooks.sh - - $OUT
set -uo pipefail
hf=$1 text=$2 top=$3 calib=${4:-$2}
. bench/device/device_lib.sh   # from the repository root (cmake -S .)
device_setup "$top" "device_codebooks"
device_build_cuda

bench() {  # name file [reps]
    "$BIN/llama-bench" -m "$2" -ngl 99 -p 512 -n 128 -r "${3:-5}" -o md > "$out/bench-$1.log" 2>&1
    say "bench $1:"; grep -E '^\|' "$out/bench-$1.log" | tail -2 | tee -a "$out/summary.txt"
    grep -q '^|' "$out/bench-$1.log" || tail -5 "$out/bench-$1.log" | tee -a "$out/summary.txt"
}
m=/tmp/cb-models; mkdir -p $m
# any llama GGUF with a tokenizer: by default call 1's f16 file (SmolLM2's 49152 tokens), else llama.cpp's
# vocab-only models/ggml-vocab-llama-spm.gguf (Llama-2's own 32000 tokens) where a llama.cpp tree with models/
# is at hand. The device's llama.cpp is the pinned release tarball unpacked at $GGML_EXT_LLAMA_CPP_SRC, which
# has no models/ folder: there, without call 1's file, TEMPLATE must be given (copy that GGUF from a llama.cpp
# git checkout into the working tree, untracked, and pass its path)
TEMPLATE=${TEMPLATE:-$m/f16.gguf}
if [ ! -f "$TEMPLATE" ]; then
    for src in "${GGML_EXT_LLAMA_CPP_SRC:-}" "$("$PY" scripts/fetch_llama_cpp.py 2>/dev/null | tail -1)"; do
        [ -n "$src" ] && [ -f "$src/models/ggml-vocab-llama-spm.gguf" ] &&
            { TEMPLATE=$src/models/ggml-vocab-llama-spm.gguf; break; }
    done
fi
if [ -n "${BIG:-}" ]; then
    if [ -f "$TEMPLATE" ]; then
        for ty in cb2 cb3 q2_k q3_k q4_0; do
            "$PY" bench/runtime/make_bench_gguf.py "$TEMPLATE" /tmp/big-$ty.gguf --type $ty > "$out/make-big-$ty.log" 2>&1 ||
                { say "big $ty: make failed"; tail -5 "$out/make-big-$ty.log"; }
        done
        say "big files: $(cd /tmp && ls -l big-*.gguf | awk '{printf "%s %d MiB; ", $9, $5/1048576}')"
        for round in 1 2; do
            for ty in cb2 cb3 q2_k q3_k q4_0; do
                [ -s /tmp/big-$ty.gguf ] && bench big-$ty-$round /tmp/big-$ty.gguf 3
                # the codebook types once more through the f32 mat-vec (the integer one's predecessor)
                case $ty in cb*) [ "${F32MMV:-1}" != 0 ] && [ -s /tmp/big-$ty.gguf ] &&
                    GGML_EXT_CB_MMV=f32 bench big-$ty-f32mmv-$round /tmp/big-$ty.gguf 3 ;; esac
            done
        done
        rm -f /tmp/big-*.gguf
    else
        say "BIG: no template GGUF at $TEMPLATE (run call 1 first, or set TEMPLATE=<llama.cpp checkout>/models/ggml-vocab-llama-spm.gguf: the pinned tarball at \$GGML_EXT_LLAMA_CPP_SRC has no models/): big files skipped"
    fi
    [ "$BIG" = only ] && exit 0
fi

if [ -z "${SKIP_TESTS:-}" ]; then
    device_test_cuda '^(OK|FAILED|codebooks:)' 10
    grep -E '^CUDA0 CB[23] ' "$out/test_cuda-1.log" | tee -a "$out/summary.txt"
    # the f32 mat-vec (GGML_EXT_CB_MMV=f32), kept for comparison, must pass too (F32MMV=0 skips it)
    if [ "${F32MMV:-1}" != 0 ]; then
        GGML_EXT_CB_MMV=f32 bash scripts/test_cuda.sh "$P" > "$out/test_cuda-f32mmv.log" 2>&1
        say "make test-cuda (GGML_EXT_CB_MMV=f32): rc=$? | $(grep -E '^(OK|FAILED|codebooks:)' "$out/test_cuda-f32mmv.log" | tr '\n' '|')"
        grep FAIL "$out/test_cuda-f32mmv.log" | head -10 | tee -a "$out/summary.txt"
        grep -E '^CUDA0 CB[23] ' "$out/test_cuda-f32mmv.log" | head -8 | tee -a "$out/summary.txt"
    fi
fi

[ -d "$hf" ] || { say "no HF folder at $hf: model runs skipped"; exit 0; }
device=cpu
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && device=cuda
conv() {  # type file extra-args...
    local ty=$1 f=$2; shift 2
    [ -s "$f" ] && return 0
    local t0=$(date +%s)
    "$PY" -c 'import sys; from ggml_ext.cli import main; sys.exit(main(sys.argv[1:]))' convert "$hf" -o "$f" \
        --type "$ty" "$@" > "$out/convert-$ty.log" 2>&1 || { say "convert $ty FAILED"; tail -8 "$out/convert-$ty.log" | tee -a "$out/summary.txt"; return 1; }
    say "convert $ty: $(( $(date +%s) - t0 )) s, $(( $(stat -c %s "$f") / 1048576 )) MiB"
}
conv f16 $m/f16.gguf
for ty in cb2 cb3; do
    conv $ty $m/$ty.gguf --calib "$calib" --calib-samples "${CALIB_SAMPLES:-16}" --calib-seq-len 512 --device $device
done
for ty in Q2_K Q3_K_S Q4_0; do
    lc=$(echo $ty | tr A-Z a-z)
    [ -s $m/$lc.gguf ] || "$BIN/llama-quantize" $m/f16.gguf $m/$lc.gguf $ty > "$out/quantize-$lc.log" 2>&1 ||
        { say "llama-quantize $ty FAILED"; tail -5 "$out/quantize-$lc.log"; }
done
say "files: $(cd $m && ls -l *.gguf | awk '{printf "%s %.1f MiB; ", $9, $5/1048576}')"
ppl() {  # name file args...: final estimate of llama-perplexity
    local name=$1 file=$2; shift 2
    "$BIN/llama-perplexity" -m "$file" -f "$text" -c 512 --chunks "${CHUNKS:-16}" -b 512 -lv 4 "$@" > "$out/ppl-$name.log" 2>&1
    grep -q "Final estimate" "$out/ppl-$name.log" || grep -E "error|abort|ASSERT" "$out/ppl-$name.log" | head -5 | tee -a "$out/summary.txt"
    say "ppl $name: $(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$out/ppl-$name.log" || echo FAILED) | $(grep -o 'offloaded [0-9]*/[0-9]* layers to GPU' "$out/ppl-$name.log") | $(grep -o 'type *[a-z0-9_]*: *[0-9]* tensors' "$out/ppl-$name.log" | tr -s ' ' | tr '\n' ';')"
}
[ "${PPL:-1}" = 0 ] || for ty in cb2 cb3; do
    [ -s $m/$ty.gguf ] || continue
    CUDA_VISIBLE_DEVICES= ppl $ty-cpu $m/$ty.gguf -ngl 0 -t "$jobs"
    ppl $ty-ngl99 $m/$ty.gguf -ngl 99
    ppl $ty-ngl99-ub8 $m/$ty.gguf -ngl 99 -ub 8   # every batch through the mat-vec (8 tokens), none through cuBLAS
done
[ "${PPL:-1}" = 0 ] || for ty in q2_k q3_k_s q4_0; do
    [ -s $m/$ty.gguf ] && ppl $ty-ngl99 $m/$ty.gguf -ngl 99
done

[ "${BENCH:-1}" = 0 ] && exit 0
for round in 1 2; do  # alternating, so drift of clocks or temperature hits all alike
    for ty in cb2 cb3 q2_k q3_k_s q4_0; do
        [ -s $m/$ty.gguf ] && bench $ty-$round $m/$ty.gguf
    done
done
exit 0
