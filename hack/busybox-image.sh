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
rootfs="$work/rootfs"
mkdir -p "$rootfs"/{bin,etc,tmp,proc,sys,dev,root,var,data}
chmod 1777 "$rootfs/tmp"
cp "$bb" "$rootfs/bin/busybox"
for applet in $("$bb" --list); do
  [[ "$applet" == busybox ]] || ln -s busybox "$rootfs/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\n' >"$rootfs/etc/group"

blobs="$work/layout/blobs/sha256"
mkdir -p "$blobs"
# put_blob FILE: moves FILE into the blob store, prints its digest (hex) and size.
put_blob() {
  local d s
  d=$(sha256sum "$1" | cut -d' ' -f1)
  s=$(stat -c %s "$1")
  mv "$1" "$blobs/$d"
  echo "$d $s"
}

tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
read -r layer_digest layer_size < <(put_blob "$work/layer.tar")

# image NAME CONFIG_JSON_FRAGMENT: writes config and manifest, prints the index entry.
image() {
  local name=$1 cfg=$2 cd cs md ms
  jq -cn --arg diff "sha256:$layer_digest" --argjson cfg "$cfg" '{
      architecture: "amd64", os: "linux", created: "1970-01-01T00:00:00Z",
      config: ({Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], WorkingDir: "/"} + $cfg),
      rootfs: {type: "layers", diff_ids: [$diff]},
      history: [{created: "1970-01-01T00:00:00Z", created_by: "hack/busybox-image.sh (Debian busybox-static)"}]
    }' >"$work/config.json"
  read -r cd cs < <(put_blob "$work/config.json")
  jq -cn --arg cd "sha256:$cd" --argjson cs "$cs" --arg ld "sha256:$layer_digest" --argjson ls "$layer_size" '{
      schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $ld, size: $ls}]
    }' >"$work/manifest.json"
  read -r md ms < <(put_blob "$work/manifest.json")
  jq -cn --arg md "sha256:$md" --argjson ms "$ms" --arg name "$name" '{
      mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $md, size: $ms,
      platform: {architecture: "amd64", os: "linux"},
      annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": ($name | sub(".*:"; ""))}
    }'
}

{
  image docker.io/library/busybox:latest '{"Cmd": ["sh"]}'
  image localhost/scaledown/sandbox:busybox '{"Entrypoint": ["/bin/sleep", "2147483647"]}'
} | jq -s '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: .}' >"$work/layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/layout" -cf "$out.tmp" .
mv "$out.tmp" "$out"
