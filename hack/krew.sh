#!/usr/bin/env bash
# `make krew`: the kubectl plugin as a Krew release: its archive and the Krew plugin manifest that
# names the archive by URL and sha256.
#
#   hack/krew.sh [--bin PATH] [--out DIR]
#
# Output in DIR (default target/krew/):
#   kubectl-scaledown_vVERSION_OS_ARCH.tar.gz   kubectl-scaledown and LICENSE, reproducible (the
#                                               entries sorted, owner 0, every time SOURCE_DATE_EPOCH,
#                                               default the commit's time; gzip without a name or time)
#   scaledown.yaml                              the manifest (apiVersion krew.googlecontainertools.github.com/
#                                               v1alpha2), named as Krew's index names it: plugins/scaledown.yaml
#
# The binary is the static release build of hack/build-static.sh (no libc needed on the user's
# machine), for this host's OS and architecture; --bin packs another (tests/e2e_krew.rs packs the
# debug build the tests already have). VERSION is Cargo.toml's. The manifest's uri is
# KREW_URI_BASE/vVERSION/ARCHIVE (default: the repository's release downloads), where the release
# publishes the archive; until then install from the local file:
#
#   kubectl krew install --manifest=target/krew/scaledown.yaml --archive=target/krew/kubectl-scaledown_v0.1.0_linux_amd64.tar.gz
#
# Prints the archive's and the manifest's paths, one a line.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=
out="$root/target/krew"
while (($#)); do
  case "$1" in
  --bin) bin=${2:?--bin needs a path}; shift 2 ;;
  --out) out=${2:?--out needs a directory}; shift 2 ;;
  *)
    echo "usage: $0 [--bin PATH] [--out DIR]" >&2
    exit 2
    ;;
  esac
done
log() { printf '[krew] %s\n' "$*" >&2; }
# shellcheck source=SCRIPTDIR/progress.sh
source "$root/hack/progress.sh"

meta=$(cargo metadata --locked --no-deps --format-version 1 --manifest-path "$root/Cargo.toml" |
  jq -c '.packages[] | select(.name == "statefulset-scaledown-controller")')
version=v$(jq -r .version <<<"$meta")
homepage=$(jq -r .homepage <<<"$meta")
repository=$(jq -r .repository <<<"$meta")
uri_base=${KREW_URI_BASE:-$repository/releases/download}
os=$(uname -s | tr '[:upper:]' '[:lower:]')
case "$(uname -m)" in
x86_64) arch=amd64 ;;
aarch64) arch=arm64 ;;
*) arch=$(uname -m) ;;
esac
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct)}

mkdir -p "$out"
stage=$(mktemp -d "$out/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
if [[ -z "$bin" ]]; then
  # The release profile's fat LTO link of the plugin (the crates are shared with `make image`).
  progress_run "krew: static release build of kubectl-scaledown" 120 "$root/target/build-logs/krew-build.log" \
    "$root/hack/build-static.sh" "$stage/kubectl-scaledown" kubectl-scaledown
else
  install -m 0755 "$bin" "$stage/kubectl-scaledown"
fi
install -m 0644 "$root/LICENSE" "$stage/LICENSE"

archive="kubectl-scaledown_${version}_${os}_${arch}.tar.gz"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$stage" -cf - kubectl-scaledown LICENSE | gzip -n >"$stage/$archive"
sha=$(sha256sum "$stage/$archive" | cut -d' ' -f1)

# Krew's fields: https://krew.sigs.k8s.io/docs/developer-guide/plugin-manifest/ (validated by
# `kubectl krew install`, which tests/e2e_krew.rs runs).
cat >"$stage/scaledown.yaml" <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: scaledown
spec:
  version: $version
  homepage: $homepage
  shortDescription: Show what the StatefulSet scale-down controller sees and would do
  description: |
    Shows, for each StatefulSet that carries the scale-down cleanup template
    (statefulsets.kubernetes.io/scaledown-pod-template), the claims a scale-down
    left behind, the cleanup pods that run on them, the ordinals given up on and
    what the statefulset-scaledown-controller would do next, computed with the
    controller's own rules from a fresh read of the namespace:
      kubectl scaledown status [-n NS | -A] [SET] [-o wide|json|yaml] [--no-headers]
    After uninstalling the controller it removes the controller's finalizer from
    StatefulSets, which otherwise cannot be deleted:
      kubectl scaledown release-finalizers [-n NS | -A] [SET] [--dry-run]
  caveats: |
    status needs list on StatefulSets, pods, PersistentVolumeClaims and events;
    release-finalizers needs patch on StatefulSets.
  platforms:
  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $uri_base/$version/$archive
    sha256: $sha
    files:
    - from: kubectl-scaledown
      to: .
    - from: LICENSE
      to: .
    bin: kubectl-scaledown
EOF
mv -f "$stage/$archive" "$out/$archive"
mv -f "$stage/scaledown.yaml" "$out/scaledown.yaml"
log "$archive (sha256 $sha) and scaledown.yaml in $out"
echo "$out/$archive"
echo "$out/scaledown.yaml"
