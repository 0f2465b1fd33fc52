#!/usr/bin/env bash
# `make deny` / `make audit`: cargo-deny (pinned), installed from crates.io into the tool cache on
# first use.
#
#   hack/deny.sh licenses bans sources     offline checks (make deny)
#   hack/deny.sh advisories                RustSec advisories (make audit; fetches the database)
set -euo pipefail

version=0.20.2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${SCALEDOWN_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/statefulset-scaledown-e2e}
dir="$cache/tools/cargo-deny-${version}_$(rustc -V | awk '{print $2}')"
if [[ ! -x "$dir/bin/cargo-deny" ]]; then
  echo "[deny] installing cargo-deny $version into $dir" >&2
  cargo install --quiet --locked --root "$dir" cargo-deny --version "$version"
fi
cd "$root"
exec "$dir/bin/cargo-deny" --locked check "$@"
