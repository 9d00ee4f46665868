#!/usr/bin/env bash
# Release bundles: our patched llama.cpp's server and tools for Linux on x86-64 and aarch64, each a tar.gz that
# runs on any CPU of its architecture with nothing else installed but glibc.
#
#   scripts/dist.sh [x86_64] [aarch64]     (default: both) writes dist/ggml-ext-<version>-linux-<arch>.tar.gz
#
# How: upstream's own mechanism for one build on many CPUs. GGML_BACKEND_DL=ON + GGML_CPU_ALL_VARIANTS=ON +
# GGML_NATIVE=OFF build one CPU backend module per instruction-set level, each with all of ggml_ext's CPU
# kernels compiled under its flags (cmake/ggml-ext-sources.cmake); at start ggml loads every libggml-cpu-*.so next
# to the program and keeps the one scoring best on the CPU it runs on ("load_backend: loaded CPU backend from
# .../libggml-cpu-<variant>.so"). Of upstream's variants (ggml/src/CMakeLists.txt) the bundles carry those that
# change which of our kernels or upstream's SIMD paths run on the CPUs they are for (patch 0002 filters the list;
# DIST_CPU_VARIANTS=all builds every one, DIST_CPU_VARIANTS="tag;tag" a list of one's own):
#   aarch64  armv8.0_1 (NEON: Cortex-A53/A72, Raspberry Pi 4)  armv8.2_2 (dotprod, fp16: Graviton2, Cortex-A55/A76,
#            Raspberry Pi 5)  armv8.6_1 (SVE, i8mm: Graviton3)  armv8.6_2 (SVE2, i8mm: Graviton4, Cortex-A710+)
#   x86_64   x64 (SSE2)  haswell (AVX2, FMA: Haswell+, Zen 1-3)  skylakex (AVX-512)  cascadelake (AVX-512 VNNI: our
#            avx512-vnni kernels)  icelake (AVX-512 VNNI, VBMI: Ice Lake+, Sapphire Rapids, Zen 4+)
# A CPU between two levels gets the lower one (a CPU with SME gets armv8.6_2; Alder Lake's AVX-VNNI, haswell).
#
# Layout (the bundle's folder ggml-ext-<version>-linux-<arch>/):
#   bin/      llama-server llama-cli llama-bench llama-perplexity llama-quantize llama-imatrix ggml-rpc-server,
#             and the backend modules (libggml-cpu-<variant>.so, libggml-rpc.so), which ggml looks for there
#   lib/      libllama, libggml, libggml-base, ... found through RPATH $ORIGIN/../lib
#   include/  llama.h, ggml.h, ggml-ext.h ... (programs built against the bundle's libllama)
#   share/webui/index.html   llama-server's browser page (--path share/webui)
# libstdc++ and libgcc are linked statically and OpenMP is off (ggml's own thread pool), so the only
# libraries taken from the system are glibc's; the script refuses to write a bundle needing anything else.
# aarch64 is cross-built with Debian's gcc-aarch64-linux-gnu (cmake/toolchain-aarch64-linux-gnu.cmake): the
# bundle needs glibc 2.36 or newer on the target (Debian 12, Ubuntu 22.10+, Amazon Linux 2023).
#
# Build folders: build/dist-<arch> (incremental, ccache). tests/runtime/test_dist.py runs the bundles.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
py=${PYTHON:-$here/.venv/bin/python}
[[ -x $py ]] || py=python3
bindir=$(dirname "$py")
cmake=$bindir/cmake
[[ -x $cmake ]] || cmake=cmake
export PATH=$bindir:$PATH
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
version=$("$py" -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
variants=${DIST_CPU_VARIANTS:-}
declare -A default_variants=([aarch64]="armv8.0_1;armv8.2_2;armv8.6_1;armv8.6_2"
                             [x86_64]="x64;haswell;skylakex;cascadelake;icelake")
arches=("$@")
[[ ${#arches[@]} -gt 0 ]] || arches=(x86_64 aarch64)

# What a bundle may take from the system: glibc's libraries (and the dynamic loader).
SYSTEM_LIBS='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|ld-linux-aarch64)\.so\.[0-9]+$'

check_tools() {
  local missing=()
  for t in "$@"; do command -v "$t" >/dev/null || missing+=("$t"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "dist: ${missing[*]} not found (make system-deps installs the cross toolchain; make venv cmake and ninja)" >&2
    exit 2
  fi
}

build_one() {
  local arch=$1 build=$here/build/dist-$1 name=ggml-ext-$version-linux-$1 extra=()
  case $arch in
    x86_64) check_tools "$cmake" ninja gcc g++ readelf ;;
    aarch64)
      check_tools "$cmake" ninja aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ readelf
      extra=(-DCMAKE_TOOLCHAIN_FILE="$here/cmake/toolchain-aarch64-linux-gnu.cmake") ;;
    *) echo "dist: unknown architecture '$arch' (x86_64, aarch64)" >&2; exit 2 ;;
  esac
  [[ $arch == x86_64 && $(uname -m) != x86_64 ]] && { echo "dist: x86_64 bundles are built on x86_64 hosts" >&2; exit 2; }
  [[ $arch == aarch64 && $(uname -m) == aarch64 ]] && extra=()   # native build on an Arm host
  local static="-static-libstdc++ -static-libgcc" keep=${variants:-${default_variants[$arch]}}
  [[ $keep == all ]] && keep=""
  mkdir -p "$here/build"
  echo "dist: $name (build/dist-$arch; log build/dist-$arch.log)"
  "$cmake" -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}" \
    -DPython3_EXECUTABLE="$py" -DGGML_EXT_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_EXT_CPU_VARIANTS="$keep" \
    -DGGML_OPENMP=OFF -DGGML_CCACHE=ON -DGGML_EXT_INSTALL_DIR=. -Wno-dev \
    -DCMAKE_EXE_LINKER_FLAGS="$static" -DCMAKE_SHARED_LINKER_FLAGS="$static" -DCMAKE_MODULE_LINKER_FLAGS="$static" \
    >"$build.log" 2>&1 || { tail -40 "$build.log" >&2; exit 1; }
  "$cmake" --build "$build" --target ggml_ext_all >>"$build.log" 2>&1 || { tail -60 "$build.log" >&2; exit 1; }

  local stage=$build/stage
  rm -rf "$stage"
  "$cmake" --install "$build" --prefix "$stage/$name" --component ggml_ext --strip >>"$build.log" 2>&1 \
    || { tail -20 "$build.log" >&2; exit 1; }
  echo "$version" >"$stage/$name/VERSION"

  # every library a program or module needs is in the bundle, or glibc's
  local f lib bad=0
  for f in "$stage/$name"/bin/* "$stage/$name"/lib/*.so; do
    for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      [[ -e $stage/$name/lib/$lib || -e $stage/$name/bin/$lib ]] && continue
      [[ $lib =~ $SYSTEM_LIBS ]] && continue
      echo "dist: ${f#"$stage/"} needs $lib, which is neither in the bundle nor glibc's" >&2
      bad=1
    done
  done
  [[ $bad == 0 ]] || exit 1
  ls "$stage/$name"/bin/libggml-cpu-*.so >/dev/null 2>&1 || { echo "dist: no CPU backend variants were built" >&2; exit 1; }

  mkdir -p "$here/dist"
  tar -C "$stage" -czf "$here/dist/$name.tar.gz.tmp" "$name"
  mv "$here/dist/$name.tar.gz.tmp" "$here/dist/$name.tar.gz"
  echo "dist/$name.tar.gz $(du -h "$here/dist/$name.tar.gz" | cut -f1) ($(ls "$stage/$name"/bin/libggml-cpu-*.so | wc -l) CPU variants)"
}

for a in "${arches[@]}"; do build_one "$a"; done
