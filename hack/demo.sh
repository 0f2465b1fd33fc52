#!/usr/bin/env bash
# `make demo`: the Go original's walk-through on the local control plane. Starts the cluster (if it
# is not up), creates three PersistentVolumes, runs the controller, applies example/statefulset.yaml
# in namespace `demo`, scales it from 3 to 2 and prints pods and claims until the cleanup pod
# `datastore-2` came and went and the claim `data-datastore-2` is gone (the table of pods and claims
# is printed when it changes, not every poll). The cluster stays up afterwards for a look around
# (`make cluster-down` stops it).
#
#   hack/demo.sh          as above
#   hack/demo.sh --ci     for CI (`make demo-ci`, part of `make test`; also DEMO_CI=1): removes the
#                         namespace and its PVs at the end, and leaves stopping the cluster to
#                         hack/with-cluster.sh
#
# It builds only what it uses: the control plane (and the real node's kubelet) on the first run,
# and the controller's debug build; not Helm (SCALEDOWN_HELM=0 when it starts the cluster). Builds
# and package installs log to target/build-logs/ and show their progress (hack/progress.sh).
#
# On the real node (hack/real-node.sh, started by hack/cluster.sh up unless SCALEDOWN_REAL_NODE=0) the
# example runs for real: it is applied with a toleration and nodeSelector for the node (in the set's
# pod template and in its cleanup template annotation) and claims in StorageClass real-hostpath
# (hostPath PVs on this host with node affinity to the node; example/statefulset.yaml is not
# changed), the datastore pods write /var/data/test.txt, the cleanup pod runs the example's script,
# and the demo prints the cleanup pod's log, the volume's directory before and after, and the claim
# and PV afterwards. Without a real node the pods run on KWOK's fake nodes, as before.
#
# Nothing is read from stdin. The walk-through, from applying the example to the end of the cleanup,
# must finish within DEMO_TIMEOUT seconds (default 180), or the demo fails with the end of the
# controller's log. It also fails unless exactly one cleanup pod was created (the controller's
# SuccessfulCreate Events) and exactly the claims of datastore-0 and datastore-1 are left.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=SCRIPTDIR/progress.sh
source hack/progress.sh
ns=demo
demo_set=datastore
pv_prefix=demo-pv
controller_log=target/demo/controller.log
# shellcheck source=SCRIPTDIR/demo-lib.sh
source hack/demo-lib.sh
demo_args "$@"
state_now() {
  k get pods,pvc -o wide 2>/dev/null | awk '{print $1, $2, $3, $4, $5}' | column -t
}
last_shown=
show() {
  local now key
  now=$(state_now)
  # Only what changed (names, readiness and status; not the ages): a minute of identical tables
  # says nothing.
  key=$(awk '{print $1, $2, $3}' <<<"$now")
  if [[ "$key" == "$last_shown" ]]; then return; fi
  last_shown=$key
  echo "\$ kubectl get pods,pvc -n $ns"
  echo "$now"
}

step "starting the local control plane (the first run builds it from Go modules, about 5 min)"
SCALEDOWN_HELM=0 hack/cluster.sh up

step "building the controller"
# Typical: a cold debug build of the crate on 2 cores; a few seconds once built.
progress_run "controller (debug build)" 150 target/build-logs/demo-build.log \
  cargo build --locked --bin statefulset-scaledown-controller
mkdir -p target/demo

demo_remove_previous

real_node=real-0
if hack/real-node.sh status >/dev/null 2>&1 &&
  "${kubectl[@]}" get node "$real_node" -o jsonpath='{.metadata.labels.scaledown\.test/node}' 2>/dev/null | grep -qx real; then
  real=1
  step "creating three hostPath PersistentVolumes on the real node $real_node (StorageClass real-hostpath)"
  pvs=$(hack/create-pvs.sh 3 --prefix "$pv_prefix" --class real-hostpath --node "$real_node")
else
  real=0
  step "no real node (hack/real-node.sh status: down): the pods run on KWOK's fake nodes"
  step "creating three PersistentVolumes in the default StorageClass"
  pvs=$(hack/create-pvs.sh 3 --prefix "$pv_prefix")
fi
echo "$pvs"

demo_start_controller
demo_namespace
if ((real)); then
  step "applying example/statefulset.yaml, placed on the real node $real_node"
  # The example unchanged, plus what the real node needs: the toleration of its taint and a
  # nodeSelector in the set's pod template and in the cleanup template, and claims in real-hostpath.
  k create --dry-run=client -o json -f example/statefulset.yaml | jq -s '
    {"key": "scaledown.test/node", "operator": "Equal", "value": "real", "effect": "NoSchedule"} as $tol
    | {"scaledown.test/node": "real"} as $sel
    | "statefulsets.kubernetes.io/scaledown-pod-template" as $tpl
    | {"apiVersion": "v1", "kind": "List", "items": .}
    | .items |= map(if .kind == "StatefulSet" then
        .spec.template.spec.tolerations += [$tol]
        | .spec.template.spec.nodeSelector = $sel
        | .spec.volumeClaimTemplates |= map(.spec.storageClassName = "real-hostpath")
        | .metadata.annotations[$tpl] |= (fromjson | .spec.tolerations += [$tol] | .spec.nodeSelector = $sel | tojson)
      else . end)' | k apply -f -
else
  step "applying example/statefulset.yaml"
  k apply -f example/statefulset.yaml
fi
k wait --for=jsonpath='{.status.readyReplicas}'=3 statefulset/datastore --timeout="$(left)s" ||
  fail "datastore did not get 3 ready replicas within $limit s"
show
if ((real)); then
  k get pods -o wide | awk '{print $1, $3, $7}' | column -t
  pv2=$(k get pvc data-datastore-2 -o jsonpath='{.spec.volumeName}')
  dir2=$("${kubectl[@]}" get pv "$pv2" -o jsonpath='{.spec.hostPath.path}')
  # The pods write the file as they start; Ready may come a moment before the write.
  for _ in $(seq 50); do [[ -s "$dir2/test.txt" ]] && break; sleep 0.2; done
  echo "\$ ls -l $dir2   # the volume of datastore-2 ($pv2), on this host"
  ls -l "$dir2"
  [[ -s "$dir2/test.txt" ]] || fail "datastore-2 did not write $dir2/test.txt"
  echo "\$ cat $dir2/test.txt"
  cat "$dir2/test.txt"
fi

step "scaling datastore from 3 to 2"
k scale statefulset datastore --replicas 2
cleanup_log=target/demo/cleanup-pod.log
: >"$cleanup_log"
seen_cleanup=no
while ((SECONDS < deadline)); do
  sleep 1.5
  owner=$(k get pod datastore-2 -o jsonpath='{.metadata.annotations.statefulsets\.kubernetes\.io/scaledown-pod-owner}' 2>/dev/null || true)
  # The table the note below points at is printed even if it looks like the one before.
  [[ -z "$owner" || $seen_cleanup == yes ]] || last_shown=
  show
  if [[ -n "$owner" && $seen_cleanup == no ]]; then
    seen_cleanup=yes
    echo "^ datastore-2 is now the cleanup pod (owner annotation: $owner)"
  fi
  # On the real node: follow the cleanup pod's own log from the moment its container runs (the
  # controller deletes the pod soon after it succeeded).
  if ((real)) && [[ -n "$owner" && -z "$follower" ]] &&
    k get pod datastore-2 -o jsonpath='{.status.containerStatuses[0].state}' 2>/dev/null | grep -qE 'running|terminated'; then
    k logs -f datastore-2 -c main >"$cleanup_log" 2>&1 </dev/null &
    follower=$!
  fi
  succeeded=$(k get events --field-selector involvedObject.name=datastore,reason=CleanupSuccess -o name 2>/dev/null || true)
  if [[ -n "$succeeded" ]] && ! k get pod datastore-2 >/dev/null 2>&1 && ! k get pvc data-datastore-2 >/dev/null 2>&1; then
    step "done: the cleanup pod ran, then it and data-datastore-2 were deleted ($((SECONDS - started)) s)"
    k get events --field-selector involvedObject.name=datastore -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message |
      grep -E 'TYPE|Cleanup|cleanup|claim data-datastore-2'
    # One cleanup pod, created once: each pod the controller creates and runs is one Event.
    creates=$(k get events -o json | jq '[.items[] | select(.reportingComponent == "statefulset-scaledown-controller"
      and .reason == "SuccessfulCreate")] | length')
    ((creates == 1)) || fail "$creates cleanup pods were created for datastore-2, not 1"
    claims=$(k get pvc -o name | sort | tr '\n' ' ')
    [[ "$claims" == "persistentvolumeclaim/data-datastore-0 persistentvolumeclaim/data-datastore-1 " ]] ||
      fail "claims left: $claims"
    if ((real)); then
      if [[ -n "$follower" ]]; then
        for _ in $(seq 50); do kill -0 "$follower" 2>/dev/null || break; sleep 0.1; done
      fi
      step "the cleanup pod's own log (kubectl logs -n $ns datastore-2, while it ran on $real_node)"
      cat "$cleanup_log"
      grep -q 'Data deleted!' "$cleanup_log" || fail "the cleanup pod's log does not say 'Data deleted!'"
      step "the volume of datastore-2 on this host, after the cleanup"
      echo "\$ ls -l $dir2"
      ls -l "$dir2"
      [[ ! -e "$dir2/test.txt" ]] || fail "$dir2/test.txt is still there"
      echo "(test.txt is gone)"
      step "claims and PVs afterwards"
      echo "\$ kubectl get pvc -n $ns; kubectl get pv $(echo $pvs)"
      k get pvc
      # shellcheck disable=SC2086 # one name per word
      "${kubectl[@]}" get pv $pvs
    fi
    if [[ $ci == 1 ]]; then
      echo "[timing] demo walk-through: $((SECONDS - started)) s"
      exit 0
    fi
    echo
    echo "The cluster is still up: KUBECONFIG=$root/$state/kubeconfig $state/bin/kubectl get all -n $ns"
    echo "Stop it with: make cluster-down"
    exit 0
  fi
done
fail "the cleanup did not finish within $limit s of applying the example"
