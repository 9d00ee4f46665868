#!/usr/bin/env bash
# Pack what scripts/device_kvquant.sh needs for the device (which has no asset cache and no PyPI): the two
# Hugging Face folders (SmolLM2-135M-Instruct and Gemma-3-270M, weights stored as float16: half the size
# of the float32 assets; both are dequantized 4-bit GGUFs, so little is lost) and the wiki-train / wiki-test
# texts, as one tar.zst split into parts of at most 60 MB (the device's carry limit is 64 MiB a call).
# Usage: PYTHON=.venv/bin/python bash scripts/pack_kvquant_device_assets.sh [OUTDIR]   (default /tmp/kvquant-device)
# Then carry OUTDIR/partNN one per call (copy each into a git-excluded folder such as .dev19a/), and on the
# device: cat /tmp/kvq/part* | zstd -d | tar -x -C /tmp/kvq  (device_kvquant.sh's header shows the calls).
set -euo pipefail
out=${1:-/tmp/kvquant-device}
PY=${PYTHON:-python3}
assets=${GGML_EXT_ASSETS:-$HOME/.cache/ggml-ext/assets}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out" "$stage/kvq"
for m in smollm2-hf gemma3-hf; do
    mkdir -p "$stage/kvq/$m"
    cp "$assets/$m"/*.json "$stage/kvq/$m/"
    cp "$assets/$m"/tokenizer* "$stage/kvq/$m/" 2>/dev/null || true
    "$PY" - "$assets/$m/model.safetensors" "$stage/kvq/$m/model.safetensors" <<'PYEOF'
import sys
from safetensors.numpy import load_file, save_file
import numpy as np
t = load_file(sys.argv[1])
save_file({k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in t.items()}, sys.argv[2],
          metadata={"format": "pt"})
PYEOF
done
cp "$assets/wiki/wiki.train.txt" "$assets/wiki/wiki.test.txt" "$stage/kvq/"
rm -f "$out"/part*
tar -C "$stage" -cf - kvq | zstd -T0 -6 -q | split -b 60000000 -d - "$out/part"
ls -l "$out"
du -sh "$out"
