#!/usr/bin/env bash
# Builds the binaries of the local test control plane from Go modules (the Go module proxy only):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (k8s.io/kubernetes)
#   kwok                                                               (sigs.k8s.io/kwok)
#   etcd                                                               (go.etcd.io/etcd/server/v3)
# into a cache directory outside the repository, keyed by every version and by this recipe.
#
# The build is atomic (temp dir + rename) and serialised with flock, so concurrent callers wait for
# one builder and then reuse its result. Prints the binary directory as the last line of stdout.
#
# Environment:
#   SCALEDOWN_E2E_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-scaledown-e2e)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off
cache=${SCALEDOWN_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-scaledown-e2e}
go_version=$(go env GOVERSION)
platform="$(go env GOOS)-$(go env GOARCH)"
recipe=$(cat "$here/build-control-plane.sh" "$here/versions.env" | sha256sum | cut -c1-12)
key="k8s-${K8S_VERSION}_kwok-${KWOK_VERSION}_etcd-${ETCD_VERSION}_${go_version}_${platform}_${recipe}"
out="$cache/bin/$key"

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

if [[ -f "$out/.complete" ]]; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache/bin"
exec 9>"$cache/bin/$key.lock"
log "waiting for the build lock $cache/bin/$key.lock"
flock 9
if [[ -f "$out/.complete" ]]; then # another builder finished while we waited
  echo "$out"
  exit 0
fi

started=$(date +%s)
tmp="$cache/bin/$key.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp/src/k8s" "$tmp/src/etcd"
trap 'rm -rf "$tmp"' EXIT

# --- Kubernetes -----------------------------------------------------------------------------------
# k8s.io/kubernetes maps its staging modules to ./staging/src with `replace`, which a dependent module
# cannot see. The wrapper module replaces each of them by its published v0.<minor>.<patch> tag. The
# list of staging modules is read from the release's own go.mod, so it never goes stale.
log "resolving k8s.io/kubernetes@$K8S_VERSION"
k8s_gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -f "$k8s_gomod" ]] || { log "could not download the go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
staging_version="v0.${K8S_VERSION#v1.}"
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
{
  echo "module local.test/k8sbins"
  echo
  echo "go 1.26.0"
  echo
  echo "godebug default=go1.26"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  awk '/=> \.\/staging\/src\// { printf "\t%s => %s %s\n", $1, $1, V }' V="$staging_version" "$k8s_gomod" | sort -u
  echo ")"
} >"$tmp/src/k8s/go.mod"
cat >"$tmp/src/k8s/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
log "staging modules replaced: $(grep -c '=>' "$tmp/src/k8s/go.mod")"
(cd "$tmp/src/k8s" && go mod tidy -e >&2)

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl"
(cd "$tmp/src/k8s" && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)

# --- etcd -----------------------------------------------------------------------------------------
log "building etcd $ETCD_VERSION"
cat >"$tmp/src/etcd/go.mod" <<GOMOD
module local.test/etcdbin

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
cat >"$tmp/src/etcd/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
(cd "$tmp/src/etcd" && go mod tidy -e >&2 && go build -trimpath \
  -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)

# --- kwok -----------------------------------------------------------------------------------------
# A kubelet deletes a finished pod with a UID precondition (pkg/kubelet/status), so a late delete
# never hits a newer pod of the same name. KWOK deletes by name only: a delete it had queued for the
# old pod of an ordinal removed the cleanup pod that took the name after it (over 1,000 times in a
# 500-set bench run). The copy of KWOK built here sends the pod's UID as a kubelet does, and takes
# 404 and a failed precondition (409) as done. Nothing else of KWOK changes.
log "building kwok $KWOK_VERSION (pod deletes with a UID precondition, as a kubelet's)"
kwok_dir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
[[ -d "$kwok_dir" ]] || { log "could not download sigs.k8s.io/kwok@$KWOK_VERSION"; exit 1; }
cp -r "$kwok_dir" "$tmp/src/kwok"
chmod -R u+w "$tmp/src/kwok"
pod_controller="$tmp/src/kwok/pkg/kwok/controllers/pod_controller.go"
perl -0pi -e 's{(\t"k8s.io/apimachinery/pkg/api/meta"\n)}{\tapierrors "k8s.io/apimachinery/pkg/api/errors"\n$1}; s{\terr := c\.typedClient\.CoreV1\(\)\.Pods\(pod\.Namespace\)\.Delete\(ctx, pod\.Name, deleteOpt\)\n\tif err != nil \{}{\topt := deleteOpt\n\topt.Preconditions = metav1.NewUIDPreconditions(string(pod.UID))\n\terr := c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opt)\n\tif apierrors.IsNotFound(err) || apierrors.IsConflict(err) {\n\t\treturn nil\n\t}\n\tif err != nil \{}' "$pod_controller"
grep -q 'NewUIDPreconditions(string(pod.UID))' "$pod_controller" || { log "the KWOK patch did not apply"; exit 1; }
(cd "$tmp/src/kwok" && go build -trimpath -ldflags "-s -w" -o "$tmp/kwok" ./cmd/kwok)

# --- smoke check and publish ----------------------------------------------------------------------
"$tmp/kube-apiserver" --version | grep -qx "Kubernetes $K8S_VERSION" || { log "kube-apiserver reports the wrong version"; exit 1; }
"$tmp/kubectl" version --client >/dev/null
"$tmp/etcd" --version | grep -q "etcd Version: ${ETCD_VERSION#v}"
"$tmp/kwok" --version >/dev/null
{
  echo "K8S_VERSION=$K8S_VERSION"
  echo "KWOK_VERSION=$KWOK_VERSION"
  echo "ETCD_VERSION=$ETCD_VERSION"
  echo "GO=$go_version"
  echo "BUILD_SECONDS=$(($(date +%s) - started))"
} >"$tmp/VERSIONS"
rm -rf "$tmp/src"
touch "$tmp/.complete"
mv -T "$tmp" "$out"
trap - EXIT
log "built in $(($(date +%s) - started)) s into $out ($(du -sh "$out" | cut -f1))"
echo "$out"
