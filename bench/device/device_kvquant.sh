#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "KVQuant": the torch simulation ladder at full context.
# KVQuant's Table 2 ladder at full context on the device (docs/RESULTS.md "KVQuant"): for
# SmolLM2-135M-Instruct (8192 tokens) and Gemma-3-270M (32768 tokens), `ggml-ext calibrate kv` with the
# paper's 16 x 2048 tokens of wiki-train on the GPU, then perplexity on wiki-test with every window the
# text holds, for fp16, int4/3/2 (per-token keys after RoPE), int4/3/2 per-channel keys before and after
# RoPE, nf4/3/2, nuq4/3/2 and nuq4/3/2 with 1% outliers, all in one run per model (the fp16 row is the
# baseline). Needs only torch, transformers, scikit-learn, safetensors, tqdm (no build, no gguf package).
# Usage (device, repository root):
#   bash bench/device/device_kvquant.sh SMOLLM2_HF GEMMA3_HF WIKI_TRAIN WIKI_TEST OUT [SCHEMES]
# Assets: the GGUF assets in pieces, one carried folder per call, joined and dequantized on the device
#   by bench/device/device_assets.py (its header; docs/KVQUANT.md "Kernels and the device ladder"), then:
#   bash bench/device/device_kvquant.sh /tmp/assets/smollm2-hf /tmp/assets/gemma3-hf TRAIN TEST $OUT
# Environment: PYTHON (default /opt/torch/.venv/bin/python3), DEVICE (cuda), CHUNKS (0: every window),
# CALIB (16x2048), MODELS (smollm2,gemma3).
set -uo pipefail
smol=$1 gemma=$2 train=$3 test=$4 out=$5
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
DEVICE=${DEVICE:-cuda}
CHUNKS=${CHUNKS:-0}
CALIB=${CALIB:-16x2048}
LADDER=${6:-fp16,int4,int3,int2,int4-pc,int3-pc,int2-pc,int4-pc-post,int3-pc-post,int2-pc-post,nf4,nf3,nf2,nuq4,nuq3,nuq2,nuq4-1%,nuq3-1%,nuq2-1%,nuq4-1%+sink,nuq3-1%+sink,nuq2-1%+sink}
mkdir -p "$out"
say() { echo "$*" | tee -a "$out/summary.txt"; }
say "device_kvquant: $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') device $DEVICE calib $CALIB"
command -v nvidia-smi >/dev/null && nvidia-smi -L | tee -a "$out/summary.txt"
"$PY" -c "import torch, transformers, sklearn; print('torch', torch.__version__, 'transformers', transformers.__version__, 'sklearn', sklearn.__version__)" | tee -a "$out/summary.txt"
IFS=, read -ra models <<<"${MODELS:-smollm2,gemma3}"
for m in "${models[@]}"; do
    case $m in smollm2) hf=$smol ;; gemma3) hf=$gemma ;; *) say "unknown model $m"; continue ;; esac
    t0=$(date +%s)
    PYTHONPATH=python "$PY" bench/kvquant/bench_kvquant.py --model "$m" --hf "$hf" --test-text "$test" --calib-text "$train" \
        --ctx "${CTX:-0}" --chunks "$CHUNKS" --calib-samples "${CALIB%x*}" --calib-seq-len "${CALIB#*x}" \
        --device "$DEVICE" --schemes "$LADDER" --json "$out/$m.json" --calib-out "$out/$m.kvq.gguf" \
        >"$out/$m.md" 2>"$out/$m.log"
    rc=$?
    say "== $m: exit $rc, $(( $(date +%s) - t0 )) s"
    cat "$out/$m.md" | tee -a "$out/summary.txt"
    [ $rc -eq 0 ] || tail -n 20 "$out/$m.log" | tee -a "$out/summary.txt"
done
