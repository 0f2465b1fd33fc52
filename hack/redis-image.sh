#!/usr/bin/env bash
# Writes an OCI image layout tar holding docker.io/library/redis:7.0, made from Debian's packages
# (no registry pull): redis-server, redis-cli and redis-check-aof from redis-tools and redis-server,
# the shared libraries they load (from the downloaded packages and the installed Debian ones, as
# ldd resolves them), and Debian's busybox-static for sh and the usual tools, so that the scripts
# of example/redis run unchanged in it and in the official redis:7.0 image (Debian based, Redis 7.0).
#
#   hack/redis-image.sh OUT.tar
#
# The .debs are downloaded with `apt-get download` into the cache beside the control plane
# (SCALEDOWN_E2E_CACHE) and reused while they are apt's candidate version; so is the tar (below). It imports with
# `ctr -n k8s.io images import <tar>`. One uncompressed layer; deterministic for the same packages.
set -euo pipefail

out=${1:?usage: redis-image.sh OUT.tar}
name=docker.io/library/redis:7.0
# The packages whose files go in (their Depends that Debian does not install by default).
packages=(redis-tools redis-server libjemalloc2 liblzf1)
cache=${SCALEDOWN_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-scaledown-e2e}
debs="$cache/debs"
log() { printf '[redis-image] %s\n' "$*" >&2; }
here=$(dirname "${BASH_SOURCE[0]}")
bb=/bin/busybox
file -b "$bb" 2>/dev/null | grep -q 'statically linked' ||
  { log "$bb is not Debian's busybox-static (apt-get install busybox-static)"; exit 1; }

# fetch PKG: the path of PKG's candidate .deb in the cache, downloaded if missing.
fetch() {
  local pkg=$1 want f
  want=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
  [[ -n "$want" && "$want" != "(none)" ]] || { log "apt knows no candidate for $pkg (apt-get update?)"; return 1; }
  for f in "$debs/${pkg}_"*.deb; do
    [[ -e "$f" && "$(dpkg-deb -f "$f" Version)" == "$want" ]] && { echo "$f"; return 0; }
  done
  mkdir -p "$debs"
  (cd "$debs" && apt-get download -q "$pkg=$want" >&2 2>/dev/null) || { log "apt-get download $pkg=$want failed"; return 1; }
  for f in "$debs/${pkg}_"*.deb; do
    [[ -e "$f" && "$(dpkg-deb -f "$f" Version)" == "$want" ]] && { echo "$f"; return 0; }
  done
  log "apt-get download $pkg=$want left no .deb in $debs"
  return 1
}

# The tar is cached, keyed by this script, the packages' candidate versions and the installed
# packages (whose libraries go in): 1 s (apt-cache policy) instead of about 6 s when nothing changed.
key=$({ cat "${BASH_SOURCE[0]}" "$here/oci-lib.sh"; apt-cache policy "${packages[@]}" | grep -E '^[^ ]|Candidate:'
  dpkg-query -W; } | sha256sum | cut -c1-16)
cached="$cache/images/redis-$key.tar"
if [[ -s "$cached" ]]; then
  cp "$cached" "$out"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=SCRIPTDIR/oci-lib.sh
source "$here/oci-lib.sh"
x="$work/extracted"
rootfs="$work/rootfs"
mkdir -p "$x" "$rootfs"/{bin,etc,tmp,proc,sys,dev,root,data,usr/bin}
chmod 1777 "$rootfs/tmp"
for p in "${packages[@]}"; do
  dpkg-deb -x "$(fetch "$p")" "$x"
done

oci_busybox "$rootfs"
for b in redis-check-rdb redis-check-aof redis-cli; do cp "$x/usr/bin/$b" "$rootfs/usr/bin/$b"; done
ln -s redis-check-rdb "$rootfs/usr/bin/redis-server" # as the redis-server package does
# Every library the binaries load, at the path the loader finds it (the downloaded ones first).
libs=$(LD_LIBRARY_PATH="$x/usr/lib/x86_64-linux-gnu" ldd "$x/usr/bin/redis-check-rdb" "$x/usr/bin/redis-cli")
if grep -q 'not found' <<<"$libs"; then
  log "libraries not found: $(grep 'not found' <<<"$libs" | tr -s ' \t\n' ' ')"
  exit 1
fi
while read -r lib; do
  dest="/usr/lib/x86_64-linux-gnu/${lib##*/}"
  [[ "$lib" == /lib64/* ]] && dest=$lib
  mkdir -p "$rootfs${dest%/*}"
  cp -L "$lib" "$rootfs$dest"
done < <(awk '/=> \// {print $3} /^[[:space:]]*\/lib64\// {print $1}' <<<"$libs" | sort -u)
ln -s usr/lib "$rootfs/lib"
printf 'root:x:0:0:root:/root:/bin/sh\nredis:x:999:999:redis:/data:/bin/false\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nredis:x:999:\nnobody:x:65534:\n' >"$rootfs/etc/group"
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
"$rootfs/lib64/ld-linux-x86-64.so.2" --library-path "$rootfs/usr/lib/x86_64-linux-gnu" "$rootfs/usr/bin/redis-cli" --version >/dev/null ||
  { log "redis-cli does not run with the libraries collected"; exit 1; }

find "$rootfs" -exec touch -h -d @0 {} +
oci_layer "$rootfs"
version=$(dpkg-deb -f "$(fetch redis-tools)" Version)
oci_image "$name" '{"WorkingDir": "/data", "Cmd": ["redis-server"], "ExposedPorts": {"6379/tcp": {}}}' \
  "hack/redis-image.sh (Debian redis-tools $version, busybox-static)" | oci_layout "$out.tmp"
mkdir -p "$cache/images"
rm -f "$cache"/images/redis-*.tar
cp "$out.tmp" "$cached"
mv "$out.tmp" "$out"
log "$name ($version): $(stat -c %s "$out") bytes"
