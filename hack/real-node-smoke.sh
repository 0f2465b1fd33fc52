#!/usr/bin/env bash
# Smoke test of hack/real-node.sh: a busybox pod on the real node writes a file into a hostPath
# volume under the cluster's hostpath root; the pod must reach Succeeded, the file must be on the
# host with the pod's content, and `kubectl logs` (API server -> kubelet relay) must return it.
# Prints [timing] lines; exits non-zero on the first failed check. Cleans up its namespace.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
state="$root/target/cluster"
kubectl() { "$state/bin/kubectl" --kubeconfig "$state/kubeconfig" "$@"; }
log() { printf '[real-node-smoke] %s\n' "$*" >&2; }

ns=real-node-smoke-$$
dir="$(cat "$state/hostpath-root")/real-node-smoke-$$"
mkdir -p "$dir"
trap 'kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true; rm -rf -- "$dir"' EXIT

kubectl create namespace "$ns" >/dev/null
for ((i = 0; i < 120; i++)); do kubectl -n "$ns" get sa default >/dev/null 2>&1 && break; sleep 0.25; done
t0=$(date +%s%3N)
kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: hi}
spec:
  restartPolicy: Never
  nodeSelector: {scaledown.test/node: real}
  tolerations: [{key: scaledown.test/node, operator: Equal, value: real, effect: NoSchedule}]
  terminationGracePeriodSeconds: 5
  containers:
  - name: hi
    image: busybox
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'echo hi > /data/x && cat /data/x']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    hostPath: {path: "$dir", type: Directory}
EOF
phase=""
for ((i = 0; i < 240; i++)); do
  phase=$(kubectl -n "$ns" get pod hi -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
  sleep 0.25
done
t1=$(date +%s%3N)
kubectl -n "$ns" get pod hi -o wide >&2
if [[ "$phase" != Succeeded ]]; then
  kubectl -n "$ns" describe pod hi >&2 || true
  log "FAIL: pod phase '$phase'"
  exit 1
fi
echo "[timing] real-node pod created -> Succeeded: $((t1 - t0)) ms"
[[ "$(cat "$dir/x")" == hi ]] || { log "FAIL: $dir/x holds '$(cat "$dir/x" 2>&1)'"; exit 1; }
log "ok: $dir/x on the host holds 'hi' ($(stat -c '%s bytes, owner %U' "$dir/x"))"
out=$(kubectl -n "$ns" logs hi 2>&1) || { log "FAIL: kubectl logs: $out"; exit 1; }
[[ "$out" == hi ]] || { log "FAIL: kubectl logs printed '$out'"; exit 1; }
log "ok: kubectl logs hi -> '$out'"
# The default pull policy for `busybox` (:latest) is Always: the pull goes to the loopback mirror.
t0=$(date +%s%3N)
kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pull}
spec:
  restartPolicy: Never
  nodeSelector: {scaledown.test/node: real}
  tolerations: [{key: scaledown.test/node, operator: Exists, effect: NoSchedule}]
  containers:
  - {name: pull, image: busybox, command: [sh, -c, 'echo pulled']}
EOF
for ((i = 0; i < 240; i++)); do
  phase=$(kubectl -n "$ns" get pod pull -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
  sleep 0.25
done
t1=$(date +%s%3N)
if [[ "$phase" != Succeeded ]]; then
  kubectl -n "$ns" describe pod pull >&2 || true
  log "FAIL: pod with imagePullPolicy Always: phase '$phase'"
  exit 1
fi
echo "[timing] real-node pod (pull Always) created -> Succeeded: $((t1 - t0)) ms"
log "ok: $(kubectl -n "$ns" get events --field-selector involvedObject.name=pull,reason=Pulled -o jsonpath='{.items[0].message}')"
log "PASS"
