#!/usr/bin/env bash
# Reproduces docs/RESULTS.md "Build and test times": cold build of our targets.
# Build times of our patched llama.cpp on this machine: cold (no ccache, fresh
# folder) and no-op (the same folder again). The warm case, a fresh clone with
# ccache filled, is timed by running `git clone` + `bash .ci/run` (see docs/RESULTS.md).
# Prints wall and CPU seconds; CPU seconds / cores approximates the wall time of
# a quiet machine when other work shares the cores.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
cmake=$(dirname "$py")/cmake
mkdir -p "$here/build"
cold=$(mktemp -d "$here/build/bench-cold.XXXX")
trap 'rm -rf "$cold"' EXIT
export CCACHE_BASEDIR=$here
build() {  # name, build dir, extra env
  local name=$1 dir=$2; shift 2
  local t0 t1 c0 c1
  c0=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
  t0=$(date +%s.%N)
  env "$@" bash -c "'$cmake' -S '$here' -B '$dir' -G Ninja -DPython3_EXECUTABLE='$py' >/dev/null && '$cmake' --build '$dir' --target ggml_ext_all >/dev/null"
  t1=$(date +%s.%N)
  c1=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
  printf '| %s | %.0f | %.0f |\n' "$name" "$(echo "$t1 - $t0" | bc)" "$(echo "($c1 - $c0) / $(getconf CLK_TCK)" | bc -l)"
}
echo "machine: $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "| build | wall s | CPU s |"
echo "| --- | --- | --- |"
build "cold (CCACHE_DISABLE=1, fresh folder)" "$cold" CCACHE_DISABLE=1
build "no-op (nothing changed)" "$cold"
