#!/bin/bash
# Reproduces docs/RESULTS.md "Interleaved Q4_0": runtime repack and Q4_0_8_8 file against pristine upstream on the GPU machine's Xeon.
# AVX-512 VNNI host of the GPU machine: stock Q4_0 through the pristine build's runtime repack vs ours (CPU-only builds,
# same compiler/flags: -O3 -march=native), SmolLM2-135M shape with random weights (speed does not depend on values).
# Run on the lent GPU machine (its host CPU; no PyPI there), from a folder D prepared here:
#   D=.device (ignored by git, named in the device run's carry):
#   tar the pinned tree to D/llama.cpp.tgz (docs/DEVELOPING.md "GPU"), `git archive HEAD | tar -x -C D/main`,
#   cp ~/.cache/ggml-ext/assets/smollm2-hf/{config.json,generation_config.json,tokenizer*.json} D/hf/,
#   cp bench/device/bench_device_runtime_repack.sh D/bench.sh; then run `bash .device/bench.sh` there.
# Prints the table of docs/RESULTS.md "Interleaved Q4_0" (AVX-512 host); $OUT gets the raw llama-bench JSON.
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
export GGML_EXT_LLAMA_CPP_SRC=/tmp/src/llama.cpp-0c1e57098 PYTHON=python3
[ -d $GGML_EXT_LLAMA_CPP_SRC ] || { mkdir -p /tmp/src && tar xzf $D/llama.cpp.tgz -C /tmp/src; }
t0=$(date +%s)
UPSTREAM_BUILD_DIR=/tmp/up JOBS=16 bash $D/main/scripts/build_upstream.sh > $OUT/up-build.log 2>&1 &
(cmake -S $D/main -B /tmp/ours -G Ninja -DPython3_EXECUTABLE=$(command -v python3) > $OUT/ours-configure.log 2>&1 &&
 cmake --build /tmp/ours -j 16 --target ggml_ext_all > $OUT/ours-build.log 2>&1 &&
 cmake --install /tmp/ours --component ggml_ext --prefix /tmp/ours/install > /dev/null) &
wait
echo "builds done in $(( $(date +%s) - t0 )) s"
python3 - "$D/hf" /tmp/hf <<'PY'
import shutil, sys, torch, transformers
src, dst = sys.argv[1:]
cfg = transformers.AutoConfig.from_pretrained(src)
torch.manual_seed(0)
m = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
m.save_pretrained(dst, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(f"{src}/{f}", dst)
print("random model saved")
PY
export GGML_EXT_PREFIX=/tmp/ours/install/ggml_ext
PYTHONPATH=$D/main/python python3 -c "
import ggml_ext; from ggml_ext import repack
ggml_ext.convert('/tmp/hf', '/tmp/q4_0.gguf', 'q4_0')
repack.repack('/tmp/q4_0.gguf', '/tmp/q4_0_8_8.gguf', '8x8')
print('files made')"
UB=/tmp/up/bin/llama-bench OB=$GGML_EXT_PREFIX/bin/llama-bench
export LD_LIBRARY_PATH=
echo "host: $(lscpu | grep 'Model name'); flags: $(grep -o -w 'avx512_vnni\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
run() { "$@" -p 512 -n 128 -t 1,2 -r 3 --repack 1 -o json 2>/dev/null; }
for rnd in 1 2 3; do
  for c in up ours0 ours file; do
    case $c in
      up) run $UB -m /tmp/q4_0.gguf > $OUT/r$rnd-$c.json ;;
      ours0) GGML_EXT_RUNTIME_REPACK=0 run $OB -m /tmp/q4_0.gguf > $OUT/r$rnd-$c.json ;;
      ours) run $OB -m /tmp/q4_0.gguf > $OUT/r$rnd-$c.json ;;
      file) run $OB -m /tmp/q4_0_8_8.gguf > $OUT/r$rnd-$c.json ;;
    esac
  done
done
python3 - <<'PY'
import glob, json, os, statistics as st
out = os.environ["OUT"]; S = {}
for f in glob.glob(f"{out}/r*-*.json"):
    c = f.rsplit("-", 1)[1][:-5]
    for r in json.load(open(f)):
        k = ("pp512" if r["n_prompt"] else "tg128", r["n_threads"])
        S.setdefault(c, {}).setdefault(k, []).extend(r["samples_ts"])
names = {"up": "upstream build, Q4_0", "ours0": "ours, Q4_0, GGML_EXT_RUNTIME_REPACK=0", "ours": "ours, Q4_0", "file": "ours, Q4_0_8_8 file"}
print("| test | threads | " + " | ".join(names[c] + " t/s" for c in names) + " | " + " | ".join(names[c] + " / upstream build" for c in list(names)[1:]) + " |")
print("|" + " --- |" * 9)
for k in sorted(S["up"]):
    m = {c: st.mean(S[c][k]) for c in names}
    print(f"| {k[0]} | {k[1]} | " + " | ".join(f"{m[c]:.1f} ± {st.pstdev(S[c][k]):.1f}" for c in names) + " | " + " | ".join(f"{m[c] / m['up']:.2f}" for c in list(names)[1:]) + " |")
PY
