#!/usr/bin/env bash
# Build of our patched llama.cpp for Linux/aarch64: the same CMakeLists.txt (fetched tree + patch
# series + ggml_ext sources), static, for one -march (default armv8.6-a+dotprod+i8mm). On an x86-64
# host a cross build (cmake/toolchain-aarch64-linux-gnu.cmake) run under qemu-aarch64-static; on an
# aarch64 host the native gcc / g++ without the toolchain file, run directly.
#
#   scripts/build_aarch64.sh [MARCH]     prints the folder holding llama-cli and llama-perplexity
#
# Output: $GGML_EXT_CACHE/aarch64-<commit>/<march>-<key>/bin, where <key> hashes everything the
# binaries are made of (patches, ggml_ext, the CMake files, this script, the compiler), so a
# rerun with nothing changed is a no-op that never calls cmake. One build folder serves every
# -march: switching recompiles ggml-cpu only (ccache keeps both), and a lock keeps two
# checkouts from building at once.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
march=${1:-armv8.6-a+dotprod+i8mm}
[[ $march =~ ^armv[0-9.]+-a(\+[a-z0-9]+)*$ ]] || { echo "build_aarch64: bad -march '$march' (e.g. armv8-a, armv8.6-a+dotprod+i8mm)" >&2; exit 2; }
py=${PYTHON:-$here/.venv/bin/python}
[[ -x $py ]] || py=python3
cmake=$(dirname "$py")/cmake
[[ -x $cmake ]] || cmake=cmake
case $(uname -m) in
  aarch64|arm64) cc=gcc cxx=g++ toolchain=(-DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++) ;;  # native: no sysroot, no emulator
  *) cc=aarch64-linux-gnu-gcc cxx=aarch64-linux-gnu-g++
     toolchain=(-DCMAKE_TOOLCHAIN_FILE="$here/cmake/toolchain-aarch64-linux-gnu.cmake") ;;
esac
for t in "$cc" "$cxx" "$cmake" ninja; do
  command -v "$t" >/dev/null || [[ -x $t ]] || [[ -x $(dirname "$py")/$t ]] || {
    echo "build_aarch64: $t not found (make system-deps installs the compilers; make venv cmake and ninja)" >&2; exit 2; }
done
export PATH=$(dirname "$py"):$PATH
targets=(llama-cli llama-perplexity)

commit=$("$py" -c "import sys; sys.path.insert(0, '$here/scripts'); import fetch_llama_cpp as f; print(f.COMMIT)")
root=${GGML_EXT_CACHE:-$HOME/.cache/ggml-ext}/aarch64-$commit
key=$(cd "$here" && {
  find CMakeLists.txt cmake ggml_ext scripts/build_aarch64.sh scripts/apply_patches.py scripts/fetch_llama_cpp.py \
       -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  "$cc" -dumpfullversion
  echo "$march ${targets[*]}"
} | sha256sum | cut -c1-16)
out=$root/${march//+/_}-$key
if [[ -x $out/bin/llama-cli && -x $out/bin/llama-perplexity ]]; then
  echo "$out/bin"
  exit 0
fi

mkdir -p "$root"
exec 9>"$root/build.lock"
flock 9
if [[ -x $out/bin/llama-cli && -x $out/bin/llama-perplexity ]]; then  # built while we waited
  echo "$out/bin"
  exit 0
fi
build=$root/build
# The folder is shared by every checkout: one configured from another source folder starts over.
if [[ -f $build/CMakeCache.txt ]] && ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$here" "$build/CMakeCache.txt"; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Static executables need no aarch64 sysroot at run time; ggml's own threadpool instead of
# OpenMP (no libgomp.a juggling). GGML_EXT_NATIVE=OFF + GGML_CPU_ARM_ARCH: -march for ggml-cpu.
"$cmake" -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${toolchain[@]}" \
  -DPython3_EXECUTABLE="$py" -DBUILD_SHARED_LIBS=OFF -DCMAKE_EXE_LINKER_FLAGS=-static \
  -DGGML_EXT_NATIVE=OFF -DGGML_CPU_ARM_ARCH="$march" -DGGML_OPENMP=OFF -DGGML_CCACHE=ON \
  >"$root/configure.log" 2>&1 || { cat "$root/configure.log" >&2; exit 1; }
"$cmake" --build "$build" -j "${JOBS:-$(nproc)}" --target "${targets[@]}" >"$root/build.log" 2>&1 \
  || { tail -50 "$root/build.log" >&2; exit 1; }

tmp=$(mktemp -d "$root/.out.XXXXXX")
chmod 755 "$tmp"
mkdir "$tmp/bin"
for t in "${targets[@]}"; do cp "$build/bin/$t" "$tmp/bin/"; done
echo "$march" >"$tmp/march"
rm -rf "$out"
mv "$tmp" "$out"
# Earlier outputs of this -march (older keys) are a day's worth of cache at most.
find "$root" -maxdepth 1 -name "${march//+/_}-*" ! -path "$out" -mtime +0 -exec rm -rf {} +
echo "$out/bin"
