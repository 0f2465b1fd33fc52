#!/usr/bin/env bash
# `make image`: builds the controller's OCI image without a container engine, reproducibly.
#
#   hack/image.sh IMAGE        e.g. ghcr.io/statefulset-scaledown/statefulset-scaledown-controller:0.1.0
#
# Output in target/image/:
#   oci/                                        OCI image layout, tagged with IMAGE's tag
#   statefulset-scaledown-controller.cdx.json   CycloneDX SBOM of the binary's crates
#   digest                                      the manifest digest (sha256:...)
#
# The image: one layer with the fully static binary (hack/build-static.sh) at
# /statefulset-scaledown-controller and /etc/passwd, /etc/group naming the non-root user 65532 (as
# distroless does); no shell, no libc, nothing else. USER 65532:65532, OCI labels (source, version,
# revision, licenses, created). Every timestamp is SOURCE_DATE_EPOCH (default: the commit's time),
# so building one commit twice gives the same digest. The Dockerfile produces the same layout.
set -euo pipefail

image=${1:?usage: $0 IMAGE}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/target/image"
tag=${image##*:}
repository=${image%:*}
[[ "$tag" != "$image" && "$tag" != */* ]] || {
  echo "image: IMAGE must end in :TAG (got $image)" >&2
  exit 1
}
log() { printf '[image] %s\n' "$*" >&2; }
# shellcheck source=SCRIPTDIR/progress.sh
source "$root/hack/progress.sh"
t0=$SECONDS

umoci=$("$root/hack/build-tools.sh" umoci | tail -n 1)
cyclonedx=$("$root/hack/build-tools.sh" cargo-cyclonedx | tail -n 1)

cd "$root"
meta=$(cargo metadata --locked --no-deps --format-version 1 | jq -c '.packages[] | select(.name == "statefulset-scaledown-controller")')
version=$(jq -r .version <<<"$meta")
source_url=$(jq -r .repository <<<"$meta")
licenses=$(jq -r .license <<<"$meta")
description=$(jq -r .description <<<"$meta")
commit=${SCALEDOWN_GIT_COMMIT:-$(git rev-parse HEAD)}
if [[ -z "${SCALEDOWN_GIT_COMMIT:-}" ]] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
  log "WARNING: the work tree has uncommitted changes; the revision is $commit"
fi
export SCALEDOWN_GIT_COMMIT=$commit
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
case "$(uname -m)" in
x86_64) arch=amd64 ;;
aarch64) arch=arm64 ;;
*) arch=$(uname -m) ;;
esac

# --- the root file system ---------------------------------------------------------------------
rm -rf "$out/rootfs" "$out/oci" "$out/digest"
mkdir -p "$out/rootfs/etc"
tb=$SECONDS
# Cargo's output goes to the log (its end is printed if the build fails). Typical: a cold target
# directory (2.5-4.5 min on 2 cores); after a commit about 1.5-2 min.
progress_run "image: static release build" 210 "$root/target/build-logs/image-build.log" \
  "$root/hack/build-static.sh" "$out/rootfs/statefulset-scaledown-controller"
echo "[timing] image: static binary $((SECONDS - tb)) s"
install -m 0644 "$root/hack/image/passwd" "$out/rootfs/etc/passwd"
install -m 0644 "$root/hack/image/group" "$out/rootfs/etc/group"
chmod 0755 "$out/rootfs" "$out/rootfs/etc"

# --- SBOM (not in the image, so the Dockerfile's image has the same layout) ---------------------
# Normalised so that it is reproducible too: the time is SOURCE_DATE_EPOCH, the serial number is
# derived from the commit, and the checkout's path is replaced by /src.
(cd "$root" && "$cyclonedx" cyclonedx --quiet --format json --spec-version 1.5 --no-build-deps \
  --target "$(rustc -vV | sed -n 's/^host: //p')" --override-filename statefulset-scaledown-controller.cdx)
serial=$(printf '%s' "$commit" | sha256sum | sed -E 's/^(.{8})(.{4})(.{4})(.{4})(.{12}).*/\1-\2-\3-\4-\5/')
jq --arg ts "$created" --arg serial "urn:uuid:$serial" --arg root "$root" '
  .serialNumber = $serial | .metadata.timestamp = $ts
  | walk(if type == "string" then gsub("file://" + $root; "file:///src") else . end)' \
  "$root/statefulset-scaledown-controller.cdx.json" >"$out/statefulset-scaledown-controller.cdx.json"
rm -f "$root/statefulset-scaledown-controller.cdx.json"

# --- the OCI image ------------------------------------------------------------------------------
oci="$out/oci:$tag"
labels=(
  "org.opencontainers.image.title=statefulset-scaledown-controller"
  "org.opencontainers.image.description=$description"
  "org.opencontainers.image.source=$source_url"
  "org.opencontainers.image.url=$source_url"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$commit"
  "org.opencontainers.image.licenses=$licenses"
  "org.opencontainers.image.created=$created"
)
config_args=()
for l in "${labels[@]}"; do config_args+=(--config.label "$l" --manifest.annotation "$l"); done
"$umoci" init --layout "$out/oci"
"$umoci" new --image "$oci"
# Files are inserted as owned by root whoever builds (the uid/gid maps), with their mtimes clamped
# to SOURCE_DATE_EPOCH by umoci.
"$umoci" insert --image "$oci" --uid-map "0:$(id -u):1" --gid-map "0:$(id -g):1" \
  --history.created_by "hack/image.sh: static binary, /etc/passwd, /etc/group" "$out/rootfs" /
"$umoci" config --image "$oci" --os linux --architecture "$arch" \
  --config.user 65532:65532 --config.entrypoint /statefulset-scaledown-controller \
  --config.exposedports 8080/tcp --config.exposedports 8081/tcp \
  --history.created_by "hack/image.sh: user, entrypoint, ports, labels" "${config_args[@]}"
"$umoci" gc --layout "$out/oci"

manifest=$(jq -r --arg tag "$tag" '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $tag) | .digest' "$out/oci/index.json")
echo "$manifest" >"$out/digest"
blob() { echo "$out/oci/blobs/${1%%:*}/${1#*:}"; }
size=$(jq '[.config.size] + [.layers[].size] | add' "$(blob "$manifest")")
log "built in $((SECONDS - t0)) s: $out/oci (tag $tag), SBOM $out/statefulset-scaledown-controller.cdx.json"
echo "image: $repository:$tag"
echo "digest: $manifest"
echo "size: $size bytes compressed ($(du -b "$out/rootfs/statefulset-scaledown-controller" | cut -f1) bytes binary)"
echo "revision: $commit, created: $created"
