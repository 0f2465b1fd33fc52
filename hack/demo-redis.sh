#!/usr/bin/env bash
# `make demo APP=redis`: example/redis re-sharded on the real node. Starts the cluster (if it is not
# up), creates three PersistentVolumes on the real node, runs the controller, applies the example
# (`kubectl apply -k example/redis`, placed on the real node) in namespace `demo-redis`, writes
# DEMO_KEYS keys (3000) through the example's client, prints the keys per shard, scales 3 -> 2,
# follows the drain pod's log, and prints the keys per shard afterwards and whether every key reads
# back with its value. The cluster stays up afterwards (`make cluster-down` stops it).
#
#   hack/demo-redis.sh          as above
#   hack/demo-redis.sh --ci     for CI (`make demo-ci`): removes the namespace and its PVs at the end
#
# It needs the real node (Redis really runs): without one it fails, saying so. The walk-through must
# finish within DEMO_TIMEOUT seconds (default 180).
set -euo pipefail

keys=${DEMO_KEYS:-3000}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
ns=demo-redis
demo_set=redis
pv_prefix=demo-redis-pv
controller_log=target/demo/redis-controller.log
# shellcheck source=SCRIPTDIR/demo-lib.sh
source hack/demo-lib.sh
demo_args "$@"
client() { k exec -i redis-0 -c redis -- sh /scripts/client.sh "$@"; }
counts() { # counts N: the client's key count per shard, as a table
  echo "\$ kubectl exec -n $ns redis-0 -- sh /scripts/client.sh count $1"
  client count "$1" | awk '{ printf "redis-%s  %6d keys\n", $1, $2; t += $2 } END { printf "total    %6d keys\n", t }'
}

step "starting the local control plane"
hack/cluster.sh up
hack/real-node.sh status >/dev/null 2>&1 || fail "no real node (hack/real-node.sh status): Redis needs one"

step "building the controller"
cargo build --locked --bin statefulset-scaledown-controller
mkdir -p target/demo
demo_remove_previous

step "creating three hostPath PersistentVolumes on the real node (StorageClass real-hostpath)"
pvs=$(hack/create-pvs.sh 3 --prefix "$pv_prefix" --class real-hostpath --node real-0)
echo "$pvs"

demo_start_controller
demo_namespace

step "applying example/redis (kubectl apply -k), placed on the real node"
# The example unchanged, plus the real node's toleration and nodeSelector in the shards' pod
# template (the cleanup pods inherit them: scaledown-pod-inherit) and claims in real-hostpath.
k create --dry-run=client -o json -k example/redis | jq -s '
  {"key": "scaledown.test/node", "operator": "Equal", "value": "real", "effect": "NoSchedule"} as $tol
  | {"apiVersion": "v1", "kind": "List", "items": .}
  | .items |= map(if .kind == "StatefulSet" then
      .spec.template.spec.tolerations += [$tol]
      | .spec.template.spec.nodeSelector = {"scaledown.test/node": "real"}
      | .spec.volumeClaimTemplates |= map(.spec.storageClassName = "real-hostpath")
    else . end)' | k apply -f -
k rollout status statefulset/redis --timeout="$(left)s" || fail "redis did not get 3 ready shards"
k get pods -o wide | awk '{print $1, $2, $3, $6, $7}' | column -t

step "writing $keys keys through the example's client (each on its owner among 3 shards)"
seq 1 "$keys" | awk '{ printf "user:%05d score-%d\n", $1, ($1 * 7919) % 100003 }' >target/demo/redis-keys.txt
echo "\$ kubectl exec -i -n $ns redis-0 -- sh /scripts/client.sh put 3 <target/demo/redis-keys.txt"
client put 3 <target/demo/redis-keys.txt
counts 3

step "scaling redis from 3 to 2: the controller runs drain.sh on data-redis-2"
k scale statefulset redis --replicas 2
status='jsonpath={.metadata.annotations.statefulsets\.kubernetes\.io/scaledown-status}'
k wait statefulset/redis --for="$status"=CleaningUp --timeout=30s >/dev/null 2>&1 || true
while ((SECONDS < deadline)); do
  if [[ -z "$follower" ]] && k get pod redis-2 -o jsonpath='{.metadata.annotations}' 2>/dev/null | grep -q scaledown-pod-owner &&
    k get pod redis-2 -o jsonpath='{.status.containerStatuses[0].state}' 2>/dev/null | grep -qE 'running|terminated'; then
    echo "\$ kubectl logs -f -n $ns redis-2   # the drain pod, on the claim of the removed shard"
    k logs -f redis-2 -c drain </dev/null &
    follower=$!
  fi
  [[ "$(k get statefulset redis -o "$status" 2>/dev/null)" == Idle ]] && ! k get pvc data-redis-2 >/dev/null 2>&1 && break
  [[ "$(k get statefulset redis -o "$status" 2>/dev/null)" != Stalled ]] || fail "the drain stalled: $(k get statefulset redis -o json | jq -r '.metadata.annotations["statefulsets.kubernetes.io/scaledown-status-reason"]')"
  sleep 1
done
((SECONDS < deadline)) || fail "the drain did not finish within $limit s"
if [[ -n "$follower" ]]; then
  for _ in $(seq 50); do kill -0 "$follower" 2>/dev/null || break; sleep 0.1; done
fi
echo
k get events --field-selector involvedObject.name=redis -o custom-columns=REASON:.reason,MESSAGE:.message | grep -E 'REASON|Cleanup|cleanup'
k get pods,pvc | awk '{print $1, $2, $3}' | column -t

step "keys per shard after the drain"
counts 2
got=$(cut -d' ' -f1 target/demo/redis-keys.txt | client get 2 | sort)
[[ "$got" == "$(sort target/demo/redis-keys.txt)" ]] || fail "not every key reads back with its value from redis-0 and redis-1"
echo "every one of the $keys keys reads back with its value from redis-0 and redis-1"
step "done ($((SECONDS - started)) s)"
if [[ $ci == 1 ]]; then
  echo "[timing] demo redis walk-through: $((SECONDS - started)) s"
  exit 0
fi
echo "The cluster is still up: KUBECONFIG=$root/$state/kubeconfig $state/bin/kubectl get all -n $ns"
echo "Stop it with: make cluster-down"
