#!/usr/bin/env bash
# Build the pristine pinned llama.cpp (no ggml-ext patches) beside ours, so
# benchmarks can put upstream's own paths in the same run.
# Output: $GGML_EXT_CACHE/upstream-<commit>/bin (printed at the end). UPSTREAM_CMAKE_ARGS adds options
# (the device's CUDA baseline: "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90", UPSTREAM_BUILD_DIR elsewhere).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
src=$("$py" "$here/fetch_llama_cpp.py" tree)
commit=$("$py" -c "import sys; sys.path.insert(0, '$here'); import fetch_llama_cpp as f; print(f.COMMIT)")
cache=$(dirname "$src")
build=${UPSTREAM_BUILD_DIR:-$cache/upstream-$commit}
jobs=${JOBS:-$(nproc)}
targets=(llama-server llama-cli llama-bench llama-perplexity llama-quantize llama-imatrix ggml-rpc-server)

# Without llama.cpp's AMX mat-mul on x86-64, as our build (cmake/ggml-ext-amx.cmake says why).
amx=()
[ "$(uname -m)" = x86_64 ] && amx=("-DCMAKE_C_FLAGS=-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__"
                                   "-DCMAKE_CXX_FLAGS=-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__")
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${amx[@]}" \
  -DGGML_NATIVE=ON -DGGML_RPC=ON -DGGML_CCACHE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF ${UPSTREAM_CMAKE_ARGS:-} >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
echo "$build/bin"
