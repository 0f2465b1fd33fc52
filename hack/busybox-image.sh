#!/usr/bin/env bash
# Writes an OCI image layout tar holding two images made from Debian's busybox-static (/bin/busybox):
#
#   docker.io/library/busybox:latest          Cmd ["sh"], as the upstream image
#   localhost/scaledown/sandbox:busybox       Entrypoint sleeps forever: the CRI sandbox ("pause") image
#
# Both share one uncompressed layer (busybox and a symlink per applet in /bin). The tar imports with
# `ctr -n k8s.io images import <tar>`. Deterministic: the same busybox gives the same digests.
#
#   hack/busybox-image.sh OUT.tar
set -euo pipefail

out=${1:?usage: busybox-image.sh OUT.tar}
bb=/bin/busybox
[[ -x "$bb" ]] || { echo "busybox-image: $bb missing (apt-get install busybox-static)" >&2; exit 1; }
file -b "$bb" 2>/dev/null | grep -q 'statically linked' || ldd "$bb" 2>&1 | grep -q 'not a dynamic' ||
  { echo "busybox-image: $bb is not statically linked (install busybox-static)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=SCRIPTDIR/oci-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/oci-lib.sh"
rootfs="$work/rootfs"
mkdir -p "$rootfs"/{bin,etc,tmp,proc,sys,dev,root,var,data}
chmod 1777 "$rootfs/tmp"
oci_busybox "$rootfs"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\n' >"$rootfs/etc/group"
oci_layer "$rootfs"

by="hack/busybox-image.sh (Debian busybox-static)"
{
  oci_image docker.io/library/busybox:latest '{"Cmd": ["sh"]}' "$by"
  oci_image localhost/scaledown/sandbox:busybox '{"Entrypoint": ["/bin/sleep", "2147483647"]}' "$by"
} | oci_layout "$out.tmp"
mv "$out.tmp" "$out"
