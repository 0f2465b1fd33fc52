#!/usr/bin/env bash
# Runs a command against the local test control plane (hack/cluster.sh).
#
#   hack/with-cluster.sh <cmd...>
#
# If the cluster already runs, the command just runs with KUBECONFIG=target/cluster/kubeconfig.
# Otherwise the cluster is started first and stopped afterwards, whatever the command's outcome (also
# on Ctrl-C). The exit code is the command's (or cluster.sh's, if the cluster could not start).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

if (($# == 0)); then
  echo "usage: $0 <cmd...>" >&2
  exit 2
fi

export KUBECONFIG="$root/target/cluster/kubeconfig"

run_cmd() {
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  echo "[timing] e2e tests: $((SECONDS - t0)) s"
  return "$rc"
}

if "$here/cluster.sh" status >/dev/null 2>&1; then
  echo "[with-cluster] using the running cluster ($KUBECONFIG)" >&2
  run_cmd "$@"
  exit $?
fi

# Whatever happens from here on (including a failed `up` or a signal), stop the cluster.
trap '"$here/cluster.sh" down || echo "[with-cluster] WARNING: hack/cluster.sh down failed" >&2' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$here/cluster.sh" up
rc=0
run_cmd "$@" || rc=$?
exit "$rc"
