# Sourced by hack/busybox-image.sh and hack/redis-image.sh: what both image builds share. An OCI
# image layout of one uncompressed layer, deterministic (sorted, owner 0, mtime 0), written under
# $work (set by the caller, a fresh temporary directory):
#
#   oci_busybox ROOTFS               Debian's busybox-static as ROOTFS/bin/busybox, a symlink per applet
#   oci_layer ROOTFS                 the layer of ROOTFS (sets layer_digest, layer_size)
#   oci_image NAME CONFIG CREATED_BY an image of that layer: its config (CONFIG, a JSON object, merged
#                                    over the default Env and WorkingDir) and manifest; prints its
#                                    index entry, tagged NAME for containerd
#   oci_layout OUT                   the index of the entries on stdin, written with the blobs as the
#                                    tar OUT (imports with `ctr -n k8s.io images import OUT`)
# shellcheck shell=bash
# shellcheck disable=SC2154 # work comes from the caller

bb=/bin/busybox
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

oci_busybox() {
  local rootfs=$1 applet
  cp "$bb" "$rootfs/bin/busybox"
  for applet in $("$bb" --list); do
    [[ "$applet" == busybox ]] || ln -s busybox "$rootfs/bin/$applet"
  done
}

oci_layer() {
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$1" -cf "$work/layer.tar" .
  read -r layer_digest layer_size < <(put_blob "$work/layer.tar")
}

oci_image() {
  local name=$1 cfg=$2 created_by=$3 cd cs md ms
  jq -cn --arg diff "sha256:$layer_digest" --argjson cfg "$cfg" --arg by "$created_by" '{
      architecture: "amd64", os: "linux", created: "1970-01-01T00:00:00Z",
      config: ({Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], WorkingDir: "/"} + $cfg),
      rootfs: {type: "layers", diff_ids: [$diff]},
      history: [{created: "1970-01-01T00:00:00Z", created_by: $by}]
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

oci_layout() {
  jq -s '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: .}' >"$work/layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/layout" -cf "$1" .
}
