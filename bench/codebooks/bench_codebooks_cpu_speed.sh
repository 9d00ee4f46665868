#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "Codebooks (CB2/CB3)": CPU llama-bench of 7B-shaped CB2 / Q2_K / IQ2_S files, ours and pristine.
# CPU decode/prefill speed of CB2 vs Q2_K vs IQ2_S (issue 15), ours vs the pristine upstream build, one run.
#
# Files: Llama-2-7B-shaped layers (d=4096, FFN 11008) with every matrix of one type, random codes
# (bench/runtime/make_bench_gguf.py; speed only, perplexity of such files means nothing). LAYERS layers keep a
# 2-core machine's run short; per-layer work is the 7B model's, so tokens/s scale by about LAYERS/32.
# The stock types run in both builds (ours routes them through upstream's unmodified CPU kernels); CB2 only
# in ours. Run on a quiet machine: llama-bench's stdev column says how quiet it was.
#
#   bash bench/codebooks/bench_codebooks_cpu_speed.sh [OUTDIR]   (env: LAYERS=4 THREADS=2 ARGS="-p 128 -n 32 -r 5")
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-/tmp/bench_cb_cpu}"; mkdir -p "$out"
LAYERS="${LAYERS:-4}"; THREADS="${THREADS:-$(nproc)}"; ARGS="${ARGS:--p 128 -n 32 -r 5}"
PY="${PY:-python3}"
prefix="${GGML_EXT_PREFIX:-$("$PY" -c 'import ggml_ext, pathlib; print(pathlib.Path(ggml_ext.__file__).parent)')}"
up="${GGML_EXT_UPSTREAM:-$HOME/.cache/ggml-ext/upstream-0c1e57098/bin}"
tpl="${TEMPLATE:-$HOME/.cache/ggml-ext/llama.cpp-0c1e57098/models/ggml-vocab-llama-spm.gguf}"
[ -x "$up/llama-bench" ] || { echo "no pristine upstream llama-bench at $up: run 'make upstream'" >&2; exit 2; }
[ -f "$tpl" ] || { echo "no template GGUF at $tpl (llama.cpp's models/ggml-vocab-llama-spm.gguf)" >&2; exit 2; }
for t in cb2 q2_k iq2_s; do
  [ -f "$out/$t.gguf" ] || "$PY" "$root/bench/runtime/make_bench_gguf.py" "$tpl" "$out/$t.gguf" --type "$t" --layers "$LAYERS"
done
echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), threads $THREADS, $LAYERS layers, llama-bench $ARGS"
for build in ours upstream; do
  if [ $build = ours ]; then bin="$prefix/bin/llama-bench"; else bin="$up/llama-bench"; fi
  for t in cb2 q2_k iq2_s; do
    [ $build = upstream ] && [ $t = cb2 ] && continue
    echo "## $build $t"
    LD_LIBRARY_PATH="$(dirname "$bin"):$(dirname "$bin")/../lib:${LD_LIBRARY_PATH:-}" \
      "$bin" -m "$out/$t.gguf" -t "$THREADS" $ARGS -o md | grep -E '^\|' | tail -n +3
  done
done
