# Sourced by hack/demo.sh and hack/demo-redis.sh: what both walk-throughs share. Set before sourcing:
#   ns               the demo's namespace
#   demo_set         its StatefulSet (its finalizer is taken off when the namespace goes)
#   pv_prefix        the name prefix of the PersistentVolumes it creates (hack/create-pvs.sh --prefix)
#   controller_log   where the controller's log goes
# Then `demo_args "$@"` reads --ci and DEMO_TIMEOUT; the functions below do the common steps.
# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034 # ns, demo_set, pv_prefix, controller_log come from the caller; started, deadline go back to it

demo_args() {
  ci=${DEMO_CI:-0}
  case "${1:-}" in
  --ci) ci=1 ;;
  "") ;;
  *)
    echo "usage: $0 [--ci]" >&2
    exit 2
    ;;
  esac
  limit=${DEMO_TIMEOUT:-180}
  [[ "$limit" =~ ^[0-9]+$ ]] || { echo "DEMO_TIMEOUT must be a number of seconds" >&2; exit 2; }
}

state=target/cluster
kubectl=("$state/bin/kubectl" --kubeconfig "$state/kubeconfig")
k() { "${kubectl[@]}" -n "$ns" "$@"; }
if [[ -t 1 ]]; then
  step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  step() { printf '\n== %s\n' "$*"; }
fi
fail() {
  echo "demo: $*; controller log: $controller_log" >&2
  tail -n 30 "$controller_log" >&2 || true
  exit 1
}

# The namespace and PVs of an earlier run, removed.
demo_remove_previous() {
  if "${kubectl[@]}" get namespace "$ns" >/dev/null 2>&1; then
    step "removing the previous demo"
    k patch statefulset "$demo_set" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    "${kubectl[@]}" delete namespace "$ns" --wait=true --timeout=120s
  fi
  local old_pvs
  old_pvs=$("${kubectl[@]}" get pv -o name | grep "^persistentvolume/$pv_prefix-" || true)
  # shellcheck disable=SC2086 # one name per word
  [[ -z "$old_pvs" ]] || "${kubectl[@]}" delete $old_pvs --wait=false >/dev/null
}

# The controller started in the background (`controller`), and stopped on exit with the log
# follower (`follower`, if one was started); under --ci the exit also removes the namespace and the
# PVs (`pvs`): the cluster may be shared, and the controller is gone, so no finalizer would be
# removed for us.
demo_start_controller() {
  step "starting the controller (log: $controller_log)"
  target/debug/statefulset-scaledown-controller --kubeconfig "$state/kubeconfig" </dev/null >"$controller_log" 2>&1 &
  controller=$!
  follower=
  trap demo_teardown EXIT
}

demo_teardown() {
  kill "$controller" 2>/dev/null || true
  [[ -z "$follower" ]] || kill "$follower" 2>/dev/null || true
  if [[ $ci == 1 ]]; then
    k patch statefulset "$demo_set" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    "${kubectl[@]}" delete namespace "$ns" --wait=false --ignore-not-found >/dev/null 2>&1 || true
    # shellcheck disable=SC2086 # one name per word
    [[ -z "${pvs:-}" ]] || "${kubectl[@]}" delete pv $pvs --wait=false --ignore-not-found >/dev/null 2>&1 || true
  fi
}

# The namespace created (and its default ServiceAccount there); the walk-through's clock starts:
# `started`, `deadline` (DEMO_TIMEOUT from now) and `left` (seconds to the deadline, at least 1).
demo_namespace() {
  "${kubectl[@]}" create namespace "$ns" >/dev/null
  until k get serviceaccount default >/dev/null 2>&1; do sleep 0.5; done
  started=$SECONDS
  deadline=$((SECONDS + limit))
}
left() { echo $((deadline > SECONDS ? deadline - SECONDS : 1)); }
