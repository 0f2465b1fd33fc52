#!/usr/bin/env bash
# Builds (or reuses) the local control plane at another Kubernetes version than hack/versions.env
# pins, for the compatibility run of the oldest supported version (`make e2e-oldest`):
#
#   hack/build-control-plane-version.sh v1.34.4
#
# Runs hack/build-control-plane.sh from a temporary copy whose versions.env names that version, so
# the cache key (which includes the recipe) differs from the pinned build's. Prints the binary
# directory as the last line of stdout.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${1:?usage: build-control-plane-version.sh vX.Y.Z}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here/build-control-plane.sh" "$tmp/"
sed "s/^K8S_VERSION=.*/K8S_VERSION=$version/" "$here/versions.env" >"$tmp/versions.env"
"$tmp/build-control-plane.sh"
