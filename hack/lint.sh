#!/usr/bin/env bash
# `make lint`: the CI host's workflows (.github/workflows/*.yml, the release workflow that cannot
# run here) checked by actionlint (built from its Go module: hack/build-tools.sh actionlint),
# with shellcheck on their `run:` scripts and on hack/release.sh, which the release workflow runs.
# Shellcheck is Debian's package, installed when missing (seconds), so the check is the same on
# every machine.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=SCRIPTDIR/progress.sh
source "$root/hack/progress.sh"
t0=$SECONDS
if ! command -v shellcheck >/dev/null; then
  if ! apt-cache show shellcheck >/dev/null 2>&1; then
    progress_run_quiet "apt-get update" 10 "$root/target/build-logs/lint-apt-update.log" apt-get update -q
  fi
  progress_run_quiet "apt-get install shellcheck" 8 "$root/target/build-logs/lint-apt.log" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends shellcheck
fi
actionlint=$("$root/hack/build-tools.sh" actionlint | tail -n 1)
cd "$root"
"$actionlint" -no-color -oneline -pyflakes= -shellcheck="$(command -v shellcheck)"
shellcheck -x hack/release.sh hack/lint.sh
workflows=(.github/workflows/*.yml)
echo "[timing] lint (actionlint: ${#workflows[@]} workflows; shellcheck): $((SECONDS - t0)) s"
