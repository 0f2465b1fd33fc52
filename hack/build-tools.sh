#!/usr/bin/env bash
# Builds one pinned tool (hack/tools.env) from its Go module (or, for cargo-cyclonedx, its crate)
# into the cache beside the control plane, keyed by its version, the toolchain and its recipe (its
# own branch of build() below).
# Prints the path of the binary as the last line of stdout.
#
#   hack/build-tools.sh umoci|crane|helm|runc|coredns|krew|cosign|actionlint|cargo-cyclonedx
#
# The build is atomic (temp dir + rename) and serialised with flock, as hack/build-control-plane.sh.
#
# Environment:
#   SCALEDOWN_E2E_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-scaledown-e2e)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools.env
source "$here/tools.env"
# shellcheck source=SCRIPTDIR/progress.sh
source "$here/progress.sh"

tool=${1:-}
log() { printf '[build-tools] %s\n' "$*" >&2; }

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off
cache=${SCALEDOWN_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-scaledown-e2e}

case "$tool" in
umoci) version=$UMOCI_VERSION ;;
crane) version=$CRANE_VERSION ;;
helm) version=$HELM_VERSION ;;
runc) version=$RUNC_VERSION ;;
coredns) version=$COREDNS_VERSION ;;
krew) version=$KREW_VERSION ;;
cosign) version=$COSIGN_VERSION ;;
actionlint) version=$ACTIONLINT_VERSION ;;
cargo-cyclonedx) version=$CARGO_CYCLONEDX_VERSION ;;
*)
  echo "usage: $0 umoci|crane|helm|runc|coredns|krew|cosign|actionlint|cargo-cyclonedx" >&2
  exit 2
  ;;
esac
if [[ "$tool" == cargo-* ]]; then
  toolchain=$(rustc -V | awk '{print $2}')
else
  toolchain=$(go env GOVERSION)
fi
# The recipe is this tool's own branch of build() and the Go settings, so a change to another
# tool (or to tools.env's other pins) does not rebuild this one.
recipe=$({
  grep '^export GOTOOLCHAIN' "$here/build-tools.sh"
  awk -v t="  $tool)" '$0 == t { on = 1 } on { print } on && /^    ;;$/ { exit }' "$here/build-tools.sh"
} | sha256sum | cut -c1-12)
key="${tool}-${version}_${toolchain}_$(uname -s)-$(uname -m)_${recipe}"
out="$cache/tools/$key"

if [[ -f "$out/.complete" ]]; then
  echo "$out/$tool"
  exit 0
fi
mkdir -p "$cache/tools"
exec 9>"$cache/tools/$key.lock"
flock 9
if [[ -f "$out/.complete" ]]; then
  echo "$out/$tool"
  exit 0
fi

started=$(date +%s)
tmp="$cache/tools/$key.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp/src"
trap 'rm -rf "$tmp"' EXIT
log "building $tool $version"

build() {
  case "$tool" in
  umoci)
    # umoci's go.mod replaces go-mtree by a fork, which `go install pkg@version` refuses; a wrapper
    # module repeats that replace.
    gomod=$(go mod download -json "github.com/opencontainers/umoci@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
    {
      printf 'module local.test/umocibin\n\ngo 1.26.0\n\nrequire github.com/opencontainers/umoci %s\n\n' "$version"
      grep '^replace ' "$gomod"
    } >"$tmp/src/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/opencontainers/umoci/cmd/umoci"\n' >"$tmp/src/tools.go"
    (cd "$tmp/src" && go mod tidy -e >&2 && go build -trimpath -ldflags "-s -w" -o "$tmp/umoci" github.com/opencontainers/umoci/cmd/umoci)
    "$tmp/umoci" --version | grep -q "umoci version ${version#v}"
    ;;
  crane)
    GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "github.com/google/go-containerregistry/cmd/crane@$version"
    "$tmp/crane" version >/dev/null
    ;;
  helm)
    GOBIN="$tmp" go install -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" "helm.sh/helm/v4/cmd/helm@$version"
    "$tmp/helm" version --short >/dev/null
    ;;
  runc)
    # runc needs cgo (its nsenter); seccomp is left out (no libseccomp headers needed).
    CGO_ENABLED=1 GOBIN="$tmp" go install -trimpath -tags "" -ldflags "-s -w" "github.com/opencontainers/runc@$version"
    "$tmp/runc" --version | grep -q "runc version ${version#v}"
    ;;
  coredns)
    # CoreDNS's own compile-time plugin selection: its plugin.cfg cut down to the plugins the real
    # node's Corefile uses (hack/real-node.sh), then its generator (stdlib only, so run outside module
    # mode: in module mode `go generate` downloads every cloud SDK of the full module graph first) and
    # a build with the module's own go.mod and go.sum. The cloud backends are never compiled: 21 s
    # with a warm Go cache, 256 s with empty Go build and module caches, instead of several minutes.
    src=$(go mod download -json "github.com/coredns/coredns@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
    [[ -d "$src" ]] || { log "could not download github.com/coredns/coredns@$version"; exit 1; }
    cp -r "$src/." "$tmp/src/"
    chmod -R u+w "$tmp/src"
    grep -E '^(bind|ready|health|prometheus|errors|log|loadbalance|cache|kubernetes):' "$src/plugin.cfg" >"$tmp/src/plugin.cfg"
    (cd "$tmp/src" && GO111MODULE=off go run directives_generate.go &&
      go build -trimpath -ldflags "-s -w" -o "$tmp/coredns" .)
    "$tmp/coredns" -version | grep -q "CoreDNS-${version#v}"
    "$tmp/coredns" -plugins | grep -qx kubernetes
    ;;
  krew)
    # Left unstamped on purpose: krew skips its upgrade check (a call to GitHub) in a development
    # build, and the tests set KREW_NO_UPGRADE_CHECK as well.
    GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/krew/cmd/krew@$version"
    KREW_ROOT="$tmp/root" KREW_NO_UPGRADE_CHECK=1 "$tmp/krew" version >/dev/null
    ;;
  cosign)
    # The version is stamped as cosign's own release build does (sigs.k8s.io/release-utils).
    GOBIN="$tmp" go install -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$version" "github.com/sigstore/cosign/v3/cmd/cosign@$version"
    "$tmp/cosign" version 2>&1 | grep -q "GitVersion: *$version"
    ;;
  actionlint)
    GOBIN="$tmp" go install -trimpath \
      -ldflags "-s -w -X github.com/rhysd/actionlint.version=$version" "github.com/rhysd/actionlint/cmd/actionlint@$version"
    "$tmp/actionlint" -version | grep -q "^$version"
    ;;
  cargo-cyclonedx)
    cargo install --quiet --locked --root "$tmp/src" "cargo-cyclonedx" --version "$version" >&2
    mv "$tmp/src/bin/cargo-cyclonedx" "$tmp/cargo-cyclonedx"
    ;;
  esac
}
# Typical first builds on 2 cores (docs/development/test-cluster.md); the log stays beside the cache.
declare -A typical=([umoci]=30 [crane]=10 [helm]=204 [runc]=10 [coredns]=256 [krew]=26 [cosign]=300 [actionlint]=30 [cargo-cyclonedx]=90)
progress_run "build $tool $version" "${typical[$tool]}" "$cache/tools/$key.log" build

rm -rf "$tmp/src"
echo "$tool $version built in $(($(date +%s) - started)) s with $toolchain" >"$tmp/VERSION"
touch "$tmp/.complete"
mv -T "$tmp" "$out"
trap - EXIT
log "built $tool $version in $(($(date +%s) - started)) s into $out"
echo "$out/$tool"
