#!/usr/bin/env bash
# Builds the controller of PREVIOUS_COMMIT (hack/previous.env) for the upgrade test and prints the
# binary's path: target/previous/<commit>/statefulset-scaledown-controller. Built once per commit
# (a separate target dir, so the current build is not touched; about 3 minutes on 2 cores).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=hack/previous.env
source "$root/hack/previous.env"
commit=$(git -C "$root" rev-parse --verify --quiet "${PREVIOUS_COMMIT}^{commit}" || true)
if [[ -z "$commit" ]]; then
  # A shallow clone may lack it; ask the clone's origin for that one commit.
  git -C "$root" fetch --quiet --depth=1 origin "$PREVIOUS_COMMIT" >&2 || true
  commit=$(git -C "$root" rev-parse --verify --quiet "${PREVIOUS_COMMIT}^{commit}" || true)
fi
[[ -n "$commit" ]] || {
  echo "build-previous: commit $PREVIOUS_COMMIT is not in this clone (git fetch --unshallow)" >&2
  exit 1
}
out="$root/target/previous/$commit"
bin="$out/statefulset-scaledown-controller"
if [[ ! -x "$bin" ]]; then
  t0=$SECONDS
  rm -rf "$out/src"
  mkdir -p "$out/src"
  git -C "$root" archive "$commit" | tar -x -C "$out/src"
  CARGO_TARGET_DIR="$out/target" cargo build --locked --quiet \
    --manifest-path "$out/src/Cargo.toml" --bin statefulset-scaledown-controller >&2
  cp "$out/target/debug/statefulset-scaledown-controller" "$bin"
  rm -rf "$out/src" "$out/target"
  echo "[timing] previous controller ${commit:0:12}: $((SECONDS - t0)) s" >&2
fi
echo "$bin"
