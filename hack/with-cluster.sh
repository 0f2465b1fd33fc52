#!/usr/bin/env bash
# Runs a command against the local test control plane (hack/cluster.sh).
#
#   hack/with-cluster.sh <cmd...>
#
# If the cluster already runs, the command just runs with KUBECONFIG=target/cluster/kubeconfig.
# Otherwise the cluster is started first and stopped afterwards, whatever the command's outcome (also
# on Ctrl-C). The exit code is the command's (or cluster.sh's, if the cluster could not start).
#
# Overlapping runs share one cluster: every run registers itself in target/cluster-users/, and the
# run that started the cluster waits (at most 30 min) for the others to finish before it stops it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

if (($# == 0)); then
  echo "usage: $0 <cmd...>" >&2
  exit 2
fi

export KUBECONFIG="$root/target/cluster/kubeconfig"
users="$root/target/cluster-users"
users_lock="$root/target/cluster-users.lock"
mkdir -p "$users"

log() { printf '[with-cluster] %s\n' "$*" >&2; }

run_cmd() {
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  echo "[timing] e2e tests: $((SECONDS - t0)) s" >&2
  return "$rc"
}

# Live registered users other than this run.
# shellcheck disable=SC2317 # only reached through the EXIT trap
other_users() {
  local f pid
  for f in "$users"/*; do
    [[ -e "$f" ]] || continue
    pid=${f##*/}
    [[ "$pid" == "$$" ]] && continue
    if kill -0 "$pid" 2>/dev/null; then echo "$pid"; else rm -f "$f"; fi
  done
}

# Under the users lock: if the cluster is up, register and succeed; else fail.
join_running_cluster() {
  (
    flock 7
    "$here/cluster.sh" status >/dev/null 2>&1 || exit 1
    touch "$users/$$"
  ) 7>"$users_lock"
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
stop_cluster() {
  rm -f "$users/$$"
  local rc announced=0 deadline=$((SECONDS + 1800))
  while :; do
    rc=0
    if ((SECONDS >= deadline)); then
      log "other runs still use the cluster after 30 min; stopping it anyway"
      "$here/cluster.sh" down || log "WARNING: hack/cluster.sh down failed"
      return 0
    fi
    # Stop only if no one else uses it; runs register under the same lock.
    (
      flock 7
      others=$(other_users)
      if [[ -n "$others" ]]; then
        ((announced)) || log "waiting for other runs using the cluster (pids $(echo "$others" | tr '\n' ' ')) before stopping it"
        exit 3
      fi
      "$here/cluster.sh" down 7>&-
    ) 7>"$users_lock" || rc=$?
    case "$rc" in
    0) return 0 ;;
    3)
      announced=1
      sleep 2
      ;;
    *)
      log "WARNING: hack/cluster.sh down failed (exit $rc)"
      return 0
      ;;
    esac
  done
}

rc=0
if join_running_cluster; then
  trap 'rm -f "$users/$$"' EXIT
  log "using the running cluster ($KUBECONFIG)"
  run_cmd "$@" || rc=$?
else
  # Whatever happens from here on (a failed `up`, the command failing, a signal), stop the cluster.
  trap stop_cluster EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  "$here/cluster.sh" up
  touch "$users/$$"
  run_cmd "$@" || rc=$?
fi
exit "$rc"
