#!/usr/bin/env bash
# A qemu-aarch64 that has the Neoverse N2 and V1 CPU models, for the release bundle's per-CPU checks
# (tests/runtime/test_dist.py): Graviton3 is a Neoverse V1 (SVE and i8mm, no SVE2) and its variant, armv8.6_1, is
# reached only on such a model. Debian 12's qemu 7.2 stops at neoverse-n1, and its `max` core cannot drop SVE2.
#
#   scripts/qemu_neoverse.sh     prints a folder whose qemu-aarch64-static has both models (put it first on PATH)
#
# The system's qemu-aarch64-static when it has them; otherwise Debian 13's qemu-user (qemu 10, statically linked:
# it runs on any x86-64 Linux) from Debian's mirror, unpacked once into ~/.cache/ggml-ext/qemu-<version>. The
# package is checked as apt checks it: the suite's InRelease signature against Debian's archive keyring (gpgv),
# then the SHA-256 of the package index it lists, then the SHA-256 of the package the index lists.
# Needs curl, gpgv, xz and dpkg-deb (all in Debian's base); DEBIAN_MIRROR as scripts/arm64_userland.sh.
set -euo pipefail
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=trixie
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cache=${GGML_EXT_CACHE:-$HOME/.cache/ggml-ext}

has_models() {  # the list whole first (grep -q stopping early would fail a pipe under pipefail)
  local cpus
  cpus=$("$1" -cpu help 2>/dev/null) || true  # qemu exits 1 after listing
  grep -qw neoverse-v1 <<<"$cpus" && grep -qw neoverse-n2 <<<"$cpus"
}
fail() { echo "qemu_neoverse: $*" >&2; exit 1; }

if sys=$(command -v qemu-aarch64-static) && has_models "$sys"; then
  dirname "$sys"
  exit 0
fi
[[ $(uname -m) == x86_64 ]] || fail "no qemu-aarch64-static with neoverse-v1 here (Debian's static build is for x86-64 hosts)"
for t in curl gpgv xz dpkg-deb sha256sum; do command -v "$t" >/dev/null || fail "$t not found"; done
[[ -f $keyring ]] || fail "$keyring not found (apt-get install debian-archive-keyring)"

mkdir -p "$cache"
exec 9>"$cache/qemu-neoverse.lock"
flock 9
for d in "$cache"/qemu-*/; do  # one unpacked before
  [[ -x $d/qemu-aarch64-static ]] && has_models "$d/qemu-aarch64-static" && { echo "${d%/}"; exit 0; }
done

tmp=$(mktemp -d "$cache/qemu-fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
get() { curl -fsS --retry 3 -o "$2" "$mirror/$1" || fail "could not fetch $mirror/$1"; }
get "dists/$suite/InRelease" "$tmp/InRelease"
gpgv --keyring "$keyring" --output "$tmp/Release" "$tmp/InRelease" 2>"$tmp/gpgv.log" ||
  fail "InRelease of $suite: bad signature ($(tail -1 "$tmp/gpgv.log"))"
index=main/binary-amd64/Packages.xz
want=$(awk -v f="$index" '/^SHA256:/ { s = 1; next } /^[A-Za-z]/ { s = 0 } s && $3 == f { print $1 }' "$tmp/Release")
[[ -n $want ]] || fail "$index is not listed in $suite's Release"
get "dists/$suite/$index" "$tmp/Packages.xz"
[[ $(sha256sum <"$tmp/Packages.xz" | cut -d' ' -f1) == "$want" ]] || fail "$index: SHA-256 differs from Release"
read -r file sum version < <(xz -dc "$tmp/Packages.xz" | awk '
  /^Package: / { p = ($2 == "qemu-user") } p && /^Version: / { v = $2 } p && /^Filename: / { f = $2 }
  p && /^SHA256: / { s = $2 } /^$/ && p && f { print f, s, v; exit }')
[[ -n ${file:-} && -n ${sum:-} ]] || fail "qemu-user is not in $suite's $index"
echo "qemu_neoverse: fetching $file" >&2
get "$file" "$tmp/qemu-user.deb"
[[ $(sha256sum <"$tmp/qemu-user.deb" | cut -d' ' -f1) == "$sum" ]] || fail "$file: SHA-256 differs from the index"
dpkg-deb -x "$tmp/qemu-user.deb" "$tmp/x"
out=$cache/qemu-${version//[^A-Za-z0-9.+-]/_}
rm -rf "$out" && mkdir -p "$out"
cp "$tmp/x/usr/bin/qemu-aarch64" "$out/qemu-aarch64-static"
has_models "$out/qemu-aarch64-static" || { rm -rf "$out"; fail "the qemu of $file has no neoverse-v1 / neoverse-n2"; }
echo "$out"
