#!/usr/bin/env bash
# Builds the kubelet of the real test node (hack/real-node.sh) from the same k8s.io/kubernetes
# module version as the control plane (hack/versions.env), with the same wrapper-module recipe,
# build tags and version stamp as hack/build-control-plane.sh, into the same cache root, keyed by
# that version, the Go toolchain, the platform and this recipe. A sibling script rather than an edit
# of hack/build-control-plane.sh, whose recipe hash is part of the control plane's cache key.
#
# The build is atomic (temp dir + rename) and serialised with flock. Prints the binary directory as
# the last line of stdout (the kubelet is <dir>/kubelet).
#
# Environment:
#   SCALEDOWN_E2E_CACHE    cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-scaledown-e2e)
#   SCALEDOWN_K8S_VERSION  another Kubernetes version than hack/versions.env pins
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
K8S_VERSION=${SCALEDOWN_K8S_VERSION:-$K8S_VERSION}

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off
cache=${SCALEDOWN_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-scaledown-e2e}
go_version=$(go env GOVERSION)
platform="$(go env GOOS)-$(go env GOARCH)"
recipe=$(sha256sum <"$here/build-kubelet.sh" | cut -c1-12)
key="kubelet-${K8S_VERSION}_${go_version}_${platform}_${recipe}"
out="$cache/bin/$key"

log() { printf '[build-kubelet] %s\n' "$*" >&2; }

if [[ -f "$out/.complete" ]]; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache/bin"
exec 9>"$cache/bin/$key.lock"
log "waiting for the build lock $cache/bin/$key.lock"
flock 9
if [[ -f "$out/.complete" ]]; then
  echo "$out"
  exit 0
fi

started=$(date +%s)
tmp="$cache/bin/$key.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp/src"
trap 'rm -rf "$tmp"' EXIT

# Wrapper module: every staging module replaced by its published v0.<minor>.<patch> tag, the list
# read from the release's own go.mod (as in hack/build-control-plane.sh).
log "resolving k8s.io/kubernetes@$K8S_VERSION"
k8s_gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -f "$k8s_gomod" ]] || { log "could not download the go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
staging_version="v0.${K8S_VERSION#v1.}"
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
godebug=$(sed -n 's/^godebug default=\(go1\.[0-9]*\)$/\1/p' "$k8s_gomod" | head -n 1)
{
  echo "module local.test/kubeletbin"
  echo
  echo "go 1.26.0"
  echo
  echo "godebug default=${godebug:-go1.26}"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  awk '/=> \.\/staging\/src\// { printf "\t%s => %s %s\n", $1, $1, V }' V="$staging_version" "$k8s_gomod" | sort -u
  echo ")"
} >"$tmp/src/go.mod"
printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' >"$tmp/src/tools.go"
(cd "$tmp/src" && go mod tidy -e >&2)

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
log "building kubelet $K8S_VERSION"
(cd "$tmp/src" && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$ldflags" -o "$tmp/kubelet" \
  k8s.io/kubernetes/cmd/kubelet)

"$tmp/kubelet" --version | grep -qx "Kubernetes $K8S_VERSION" || { log "kubelet reports the wrong version"; exit 1; }
{
  echo "K8S_VERSION=$K8S_VERSION"
  echo "GO=$go_version"
  echo "BUILD_SECONDS=$(($(date +%s) - started))"
} >"$tmp/VERSIONS"
rm -rf "$tmp/src"
touch "$tmp/.complete"
mv -T "$tmp" "$out"
trap - EXIT
log "built in $(($(date +%s) - started)) s into $out ($(du -sh "$out" | cut -f1))"
echo "$out"
