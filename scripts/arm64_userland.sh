#!/usr/bin/env bash
# A Debian arm64 userland from Debian's own packages, for running the aarch64 release bundle on a real aarch64
# glibc (not the cross toolchain's sysroot) on an x86-64 host:
#
#   scripts/arm64_userland.sh        prints the root folder, ~/.cache/ggml-ext/debian-arm64-bookworm
#
# debootstrap --foreign unpacks the packages on the host; its second stage (the packages' own scripts, arm64
# programs) runs under proot -q qemu-aarch64-static, which sends every exec of the userland through qemu: no
# binfmt_misc and no root needed for that part. Programs run the same way:
#
#   proot -q qemu-aarch64-static -r ROOT -b /path/to/bundle:/opt/bundle /opt/bundle/bin/llama-cli ...
#
# Needs debootstrap, proot and qemu-user-static (apt-get install debootstrap proot qemu-user-static) and Debian's
# package mirror (DEBIAN_MIRROR, default deb.debian.org). Done once; a finished userland is reused.
set -euo pipefail
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=${GGML_EXT_CACHE:-$HOME/.cache/ggml-ext}/debian-arm64-$suite
for t in debootstrap proot qemu-aarch64-static; do
  command -v "$t" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "$t" >/dev/null || {
    echo "arm64_userland: $t not found (apt-get install debootstrap proot qemu-user-static)" >&2; exit 2; }
done
export PATH=$PATH:/usr/sbin:/sbin
if [[ -f $root/.complete ]]; then
  echo "$root"
  exit 0
fi
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9
[[ -f $root/.complete ]] && { echo "$root"; exit 0; }
rm -rf "$root"
log=$root.log
# python3 and venv for the wheel and the Python package; ca-certificates for pip
debootstrap --foreign --arch=arm64 --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$suite" "$root" "$mirror" >"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
# fakeroot-like (-0) so the packages' scripts may chown; DEBOOTSTRAP_DIR: proot's view of the first stage's copy
DEBOOTSTRAP_DIR=/debootstrap proot -0 -q qemu-aarch64-static -r "$root" -w / /debootstrap/debootstrap --second-stage \
  >>"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
touch "$root/.complete"
echo "$root"
