#!/usr/bin/env bash
# `make demo`: the Go original's walk-through on the local control plane. Starts the cluster (if it
# is not up), creates three PersistentVolumes, runs the controller, applies example/statefulset.yaml
# in namespace `demo`, scales it from 3 to 2 and prints pods and claims until the cleanup pod
# `datastore-2` came and went and the claim `data-datastore-2` is gone. The cluster stays up
# afterwards for a look around (`make cluster-down` stops it).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
ns=demo
state=target/cluster
kubectl=("$state/bin/kubectl" --kubeconfig "$state/kubeconfig")
k() { "${kubectl[@]}" -n "$ns" "$@"; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() {
  echo "\$ kubectl get pods,pvc -n $ns"
  k get pods,pvc -o wide 2>/dev/null | awk '{print $1, $2, $3, $4, $5}' | column -t
}

step "starting the local control plane (the first run builds it from Go modules)"
hack/cluster.sh up

step "building the controller"
cargo build --locked --bin statefulset-scaledown-controller
mkdir -p target/demo

if "${kubectl[@]}" get namespace "$ns" >/dev/null 2>&1; then
  step "removing the previous demo"
  k patch statefulset datastore --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  "${kubectl[@]}" delete namespace "$ns" --wait=true --timeout=120s
fi
old_pvs=$("${kubectl[@]}" get pv -o name | grep '^persistentvolume/demo-pv-' || true)
[[ -z "$old_pvs" ]] || "${kubectl[@]}" delete $old_pvs --wait=false >/dev/null

step "creating three PersistentVolumes in the default StorageClass"
hack/create-pvs.sh 3 --prefix demo-pv

step "starting the controller (log: target/demo/controller.log)"
target/debug/statefulset-scaledown-controller --kubeconfig "$state/kubeconfig" >target/demo/controller.log 2>&1 &
controller=$!
trap 'kill $controller 2>/dev/null || true' EXIT

"${kubectl[@]}" create namespace "$ns" >/dev/null
until "${kubectl[@]}" -n "$ns" get serviceaccount default >/dev/null 2>&1; do sleep 0.5; done
step "applying example/statefulset.yaml"
k apply -f example/statefulset.yaml
k wait --for=jsonpath='{.status.readyReplicas}'=3 statefulset/datastore --timeout=120s
show

step "scaling datastore from 3 to 2"
k scale statefulset datastore --replicas 2
seen_cleanup=no
for _ in $(seq 1 120); do
  sleep 1.5
  show
  owner=$(k get pod datastore-2 -o jsonpath='{.metadata.annotations.statefulsets\.kubernetes\.io/scaledown-pod-owner}' 2>/dev/null || true)
  if [[ -n "$owner" && $seen_cleanup == no ]]; then
    seen_cleanup=yes
    echo "^ datastore-2 is now the cleanup pod (owner annotation: $owner)"
  fi
  succeeded=$(k get events --field-selector involvedObject.name=datastore,reason=CleanupSuccess -o name 2>/dev/null || true)
  if [[ -n "$succeeded" ]] && ! k get pod datastore-2 >/dev/null 2>&1 && ! k get pvc data-datastore-2 >/dev/null 2>&1; then
    step "done: the cleanup pod ran, then it and data-datastore-2 were deleted"
    k get events --field-selector involvedObject.name=datastore -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message |
      grep -E 'TYPE|Cleanup|cleanup|claim data-datastore-2'
    echo
    echo "The cluster is still up: KUBECONFIG=$root/$state/kubeconfig $state/bin/kubectl get all -n $ns"
    echo "Stop it with: make cluster-down"
    exit 0
  fi
done
echo "the cleanup did not finish in 180 s; controller log: target/demo/controller.log" >&2
tail -n 30 target/demo/controller.log >&2
exit 1
