#!/usr/bin/env bash
# Local test control plane: etcd + kube-apiserver + kube-controller-manager + kube-scheduler + KWOK,
# all on 127.0.0.1, with three fake nodes and a default StorageClass. See docs/development/test-cluster.md.
#
#   hack/cluster.sh up       start it (returns at once if it already runs)
#   hack/cluster.sh down     stop every process it started and remove its state
#   hack/cluster.sh status   print whether it is up (exit 0 if up, 1 if not)
#   hack/cluster.sh restart-apiserver [S]   stop kube-apiserver (SIGKILL after 3 s), wait S seconds,
#                            start it, wait ready; then restart kube-scheduler (and kcm or kwok if
#                            they died) and wait until they are healthy
#
# State lives in target/cluster/ (PKI, kubeconfigs, etcd data, pids/, logs/). The admin kubeconfig is
# target/cluster/kubeconfig, kubectl is target/cluster/bin/kubectl and helm target/cluster/bin/helm.
#
# Environment:
#   SCALEDOWN_E2E_PORT_BASE   first of six consecutive ports (default 23400):
#                             +0 etcd client, +1 etcd peer, +2 kube-apiserver, +3 kube-controller-manager,
#                             +4 kube-scheduler, +5 kwok (healthz)
#   SCALEDOWN_E2E_CACHE       binary cache root, passed on to hack/build-control-plane.sh
#   SCALEDOWN_K8S_VERSION     run another Kubernetes version than hack/versions.env pins (built by
#                             hack/build-control-plane-version.sh; `make e2e-oldest`)
#   SCALEDOWN_REAL_NODE       1 (default): `up` also starts the real node real-0 (hack/real-node.sh:
#                             kubelet + containerd in a network namespace, kubelet relay on base+10)
#                             after the control plane, and `down` stops it first. 0: KWOK nodes only.
#                             Only one real node runs per machine: if another cluster's real node
#                             runs, `up` says so and goes on without one.
#   SCALEDOWN_HELM            1 (default): `up` builds the pinned Helm (hack/build-tools.sh) and links
#                             it as target/cluster/bin/helm for the chart tests. 0: not (`make demo`
#                             does not use it: 3.4 min saved on a first run).
#
# The control-plane build (first run only) logs to target/build-logs/control-plane.log and shows its
# progress on stderr (hack/progress.sh); if it fails, the end of that log is printed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=SCRIPTDIR/versions.env
source "$here/versions.env"
# shellcheck source=SCRIPTDIR/progress.sh
source "$here/progress.sh"

state="$root/target/cluster"
pki="$state/pki"
pids="$state/pids"
logs="$state/logs"
lock="$root/target/cluster.lock"

port_base=${SCALEDOWN_E2E_PORT_BASE:-23400}
etcd_port=$((port_base + 0))
etcd_peer_port=$((port_base + 1))
api_port=$((port_base + 2))
kcm_port=$((port_base + 3))
sched_port=$((port_base + 4))
kwok_port=$((port_base + 5))

real_node=${SCALEDOWN_REAL_NODE:-1}

# Start order; `down` stops them in reverse.
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
node_count=3

log() { printf '[cluster] %s\n' "$*" >&2; }

# --- process bookkeeping ---------------------------------------------------------------------------

pid_of() { # prints the recorded pid of a component, if any
  local f="$pids/$1.pid"
  [[ -s "$f" ]] && cat "$f"
}

# True if the recorded pid is alive and really is our process (its command line names the state dir),
# so a recycled pid never gets signalled.
is_ours() {
  local pid=$1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$state/"
}

component_alive() {
  local pid
  pid=$(pid_of "$1") || return 1
  is_ours "$pid"
}

# True while the process group has a member that is not a zombie. (The components are reparented
# to init once cluster.sh exits; init may reap them late, and kill -0 succeeds on zombies.)
group_alive() {
  local p st
  for p in $(pgrep -g "$1" 2>/dev/null); do
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
    [[ -n "$st" && "$st" != Z ]] && return 0
  done
  return 1
}

proc_alive() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "$st" && "$st" != Z ]]
}

# Stops one component: SIGTERM to its process group, SIGKILL after $2 seconds (default 10). A pid is
# only signalled while it still is our process; its group id cannot be reused while the group has
# members.
stop_component() {
  local name=$1 grace=${2:-10} pid
  pid=$(pid_of "$name") || return 0
  if is_ours "$pid"; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < grace * 10; i++)); do
      group_alive "$pid" || proc_alive "$pid" || break
      sleep 0.1
    done
    if group_alive "$pid" || proc_alive "$pid"; then
      log "$name (pid $pid) ignored SIGTERM for $grace s; sending SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do
        group_alive "$pid" || proc_alive "$pid" || break
        sleep 0.1
      done
    fi
  fi
  rm -f "$pids/$name.pid"
}

# Stops the real node (hack/real-node.sh down) if this state dir has one; idempotent, works with the
# control plane already gone.
stop_real_node() {
  [[ -e "$state/real-node" ]] || return 0
  "$here/real-node.sh" down 8>&- || log "WARNING: hack/real-node.sh down failed"
}

stop_all() {
  local i
  stop_real_node
  for ((i = ${#components[@]} - 1; i >= 0; i--)); do
    stop_component "${components[i]}"
  done
}

# Component processes of this state dir that are still running (should be none after stop_all):
# one of our binaries, with the state dir in its arguments. (Other programs, such as tests or a
# controller under test, also name the state dir through the kubeconfig; they are not ours to stop.)
leftovers() {
  local bins
  bins=$(sed -n 's/^binaries=//p' "$state/endpoints" 2>/dev/null) || true
  [[ -n "$bins" ]] || return 0
  pgrep -f -- "^$bins/(etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok) .*$state/" || true
}

# Removes the state dir; keeps the logs of the last run in target/cluster-logs-last/.
remove_state() {
  if [[ -d "$logs" ]]; then
    rm -rf "$root/target/cluster-logs-last"
    mv "$logs" "$root/target/cluster-logs-last"
  fi
  if [[ -s "$state/hostpath-root" ]]; then
    local hp
    hp=$(cat "$state/hostpath-root")
    [[ "$hp" == /tmp/scaledown-e2e/* ]] && rm -rf -- "$hp"
  fi
  rm -rf -- "$state"
}

# Starts a component in its own session and process group, with its output in logs/<name>.log.
start_component() {
  local name=$1
  shift
  # The subshell closes every inherited descriptor above 2 (the cluster lock on fd 8, pipes of
  # make, CI or a terminal multiplexer), so the daemons hold nothing open for their caller. It then
  # execs setsid, which execs in place (the background child is not a group leader): $! is the
  # component's pid and its process group id.
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec $fd>&-"; fi
    done
    exec setsid "$@" </dev/null >>"$logs/$name.log" 2>&1
  ) &
  local pid=$!
  echo "$pid" >"$pids/$name.pid"
  # Until the subshell has exec'd, its command line is this script's, so is_ours (and with it
  # component_alive) would call a healthy start dead. Wait for the exec (or an early death, which
  # the caller's wait_until reports with the log).
  local i
  for ((i = 0; i < 200; i++)); do
    is_ours "$pid" && return 0
    proc_alive "$pid" || return 0
    sleep 0.05
  done
}

# --- health checks ---------------------------------------------------------------------------------

curl_admin() {
  curl -fsS --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$@"
}

etcd_healthy() { curl -fsS --max-time 3 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"'; }
apiserver_ready() { [[ "$(curl_admin "https://127.0.0.1:$api_port/readyz" 2>/dev/null)" == ok ]]; }
kcm_healthy() { [[ "$(curl -ksS --max-time 3 "https://127.0.0.1:$kcm_port/healthz" 2>/dev/null)" == ok ]]; }
sched_healthy() { [[ "$(curl -ksS --max-time 3 "https://127.0.0.1:$sched_port/healthz" 2>/dev/null)" == ok ]]; }
kwok_healthy() { curl -fsS --max-time 3 "http://127.0.0.1:$kwok_port/healthz" >/dev/null 2>&1; }

is_up() {
  local c
  [[ -f "$state/kubeconfig" ]] || return 1
  for c in "${components[@]}"; do
    component_alive "$c" || return 1
  done
  apiserver_ready
}

# Aborts the start: prints the tail of the component's log, stops what was started, exits 1.
fail() {
  local component=$1
  shift
  log "ERROR: $*"
  local f
  if [[ -n "$component" ]]; then
    f="$logs/$component.log"
    [[ -f "$f" ]] && { log "last lines of $f:"; tail -n 40 "$f" >&2; }
  fi
  exit 1 # the EXIT trap of `up` stops everything
}

# wait_until <seconds> <component> <description> <command...>: polls every 0.25 s; fails fast if the
# component died.
wait_until() {
  local timeout=$1 component=$2 what=$3
  shift 3
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    if [[ -n "$component" ]] && ! component_alive "$component"; then
      # Look twice before calling it dead, and say what the pid was (a start once failed here in
      # CI within 0.7 s with an empty log, and was not seen again).
      sleep 0.25
      if ! component_alive "$component"; then
        local pid
        pid=$(pid_of "$component") || pid=none
        log "$component pid $pid: stat '$(cat "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1-8)'," \
          "cmdline '$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)'"
        fail "$component" "$component exited while waiting for: $what"
      fi
    fi
    if ((SECONDS >= deadline)); then
      fail "$component" "timed out after ${timeout}s waiting for: $what"
    fi
    sleep 0.25
  done
}

# --- setup steps -----------------------------------------------------------------------------------

check_ports_free() {
  local p busy=()
  for p in "$etcd_port" "$etcd_peer_port" "$api_port" "$kcm_port" "$sched_port" "$kwok_port"; do
    if [[ -n "$(ss -Hltn "sport = :$p")" ]]; then busy+=("$p"); fi
  done
  if ((${#busy[@]})); then
    log "ERROR: port(s) ${busy[*]} are in use; set SCALEDOWN_E2E_PORT_BASE to the first of six free ports"
    for p in "${busy[@]}"; do ss -Hltnp "sport = :$p" >&2 || true; done
    exit 1
  fi
}

gen_pki() {
  mkdir -p "$pki"
  (
    cd "$pki"
    umask 077
    local days=3650
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -sha256 -days "$days" -subj "/CN=scaledown-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -addext "subjectKeyIdentifier=hash" -out ca.crt 2>/dev/null

    # leaf <name> <subject> <extensions>
    leaf() {
      openssl ecparam -name prime256v1 -genkey -noout -out "$1.key" 2>/dev/null
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days "$days" \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    local client
    client=$'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\nauthorityKeyIdentifier=keyid'
    leaf apiserver "/CN=kube-apiserver" $'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\nsubjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local'
    leaf admin "/O=system:masters/CN=scaledown-e2e-admin" "$client"
    leaf kube-controller-manager "/CN=system:kube-controller-manager" "$client"
    leaf kube-scheduler "/CN=system:kube-scheduler" "$client"
    # Front-proxy (request header) CA and the apiserver's aggregator client cert. Nothing proxies
    # through the aggregator here, but with it configured kcm and the scheduler find the
    # requestheader CA they look for in kube-system/extension-apiserver-authentication.
    openssl ecparam -name prime256v1 -genkey -noout -out front-proxy-ca.key 2>/dev/null
    openssl req -x509 -new -key front-proxy-ca.key -sha256 -days "$days" -subj "/CN=scaledown-e2e-front-proxy-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -out front-proxy-ca.crt 2>/dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out front-proxy-client.key 2>/dev/null
    openssl req -new -key front-proxy-client.key -subj "/CN=front-proxy-client" -out front-proxy-client.csr 2>/dev/null
    printf '%s\n' "$client" >front-proxy-client.ext
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial \
      -sha256 -days "$days" -extfile front-proxy-client.ext -out front-proxy-client.crt 2>/dev/null
    rm -f front-proxy-client.csr front-proxy-client.ext
    # Service-account token signing key pair.
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

# write_kubeconfig <file> <cert/key basename>
write_kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: scaledown-e2e
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: scaledown-e2e
  context:
    cluster: scaledown-e2e
    user: $2
current-context: scaledown-e2e
EOF
}

# KWOK config: its options, then the stock stages from the kwok module (the same version as the
# binary) plus ours.
# podPlayStageParallelism=32 (default 4): KWOK plays the kubelet of every fake node with one pool
# of workers, each waiting for its status patch. At 5,000 sets (make bench SCENARIO=sets5000, stopped
# at 23:27 on 2026-11-27) 4 workers left 4,239 scheduled pods Pending 12 minutes after the
# scale-down while the scheduler's queue was empty: the fake kubelets, not the controller or
# kube-controller-manager, set the pace. Real kubelets run one per node, in parallel.
write_kwok_config() {
  local dir
  dir=$(cd / && GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | jq -r '.Dir // empty') ||
    fail "" "cannot locate the sigs.k8s.io/kwok@$KWOK_VERSION module (go mod download failed)"
  [[ -n "$dir" && -d "$dir/kustomize/stage" ]] || fail "" "sigs.k8s.io/kwok@$KWOK_VERSION has no kustomize/stage dir"
  local f first=1
  {
    cat <<'YAML'
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  # The rest are KWOK's defaults, spelled out: a configuration file is not defaulted.
  podPlayStageParallelism: 32
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
  enableDebuggingHandlers: true
  enableContentionProfiling: false
  enableProfilingHandler: false
YAML
    first=0
    for f in "$dir/kustomize/stage/node/fast/node-initialize.yaml" \
      "$dir/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
      "$dir/kustomize/stage/pod/fast/pod-ready.yaml" \
      "$dir/kustomize/stage/pod/fast/pod-delete.yaml" \
      "$here"/kwok/*.yaml; do
      [[ -f "$f" ]] || fail "" "missing stage file $f"
      ((first)) || echo "---"
      first=0
      echo "# from $f"
      cat "$f"
    done
  } >"$state/kwok.yaml"
}

apply_cluster_objects() {
  local i
  {
    for ((i = 0; i < node_count; i++)); do
      cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node.kubernetes.io/instance-type: kwok
    type: kwok
EOF
    done
    cat <<'EOF'
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
reclaimPolicy: Delete
EOF
  } | "$state/bin/kubectl" --kubeconfig "$state/kubeconfig" apply -f - >/dev/null
}

nodes_ready() {
  "$state/bin/kubectl" --kubeconfig "$state/kubeconfig" get nodes -o json 2>/dev/null | jq -e --argjson n "$node_count" '
    [.items[]
     | select(.metadata.annotations["kwok.x-k8s.io/node"] == "fake")
     | select(any(.status.conditions[]?; .type == "Ready" and .status == "True"))
     | select(all(.spec.taints[]?; .key != "node.kubernetes.io/not-ready"))]
    | length == $n' >/dev/null
}

default_sa_exists() {
  "$state/bin/kubectl" --kubeconfig "$state/kubeconfig" -n default get serviceaccount default >/dev/null 2>&1
}

# --- commands --------------------------------------------------------------------------------------

# Starts kube-apiserver from the binaries in $1 and waits for /readyz (also used by restart-apiserver).
start_apiserver() {
  local bins=$1
  start_component kube-apiserver "$bins/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --cert-dir="$state/apiserver" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --requestheader-client-ca-file="$pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
    --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    --endpoint-reconciler-type=none \
    --allow-privileged=true \
    --profiling=false \
    --audit-policy-file="$here/audit-policy.yaml" --audit-log-path="$logs/audit.log" \
    --audit-log-maxsize=200 --audit-log-maxbackup=1 \
    --v=1
  wait_until 120 kube-apiserver "kube-apiserver /readyz" apiserver_ready
}

# Starts kube-controller-manager from the binaries in $1 (no wait).
start_kcm() {
  local bins=$1
  # --pvclaimbinder-sync-period=3s (default 15s): a claim that the PV controller handles before its
  # informer has seen a just-created static PV stays Pending until the next periodic sync; a short
  # period keeps tests that create PVs and claims back to back from waiting 15 s.
  # --node-monitor-grace-period=5m (default 40s): on a loaded machine an API server restart took
  # 64 s (make chaos, seed 20261129, round 29); the node lifecycle controller then marked every
  # node not-Ready and every pod NotReady, KWOK never reports those pods Ready again, and
  # OrderedReady sets stopped scaling down for good. No test needs a node declared lost.
  start_component kube-controller-manager "$bins/kube-controller-manager" \
    --kubeconfig="$state/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$state/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$state/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$kcm_port" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
    --leader-elect=false \
    --controllers='*' \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" \
    --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --cluster-name=scaledown-e2e \
    --pvclaimbinder-sync-period=3s \
    --node-monitor-grace-period=5m \
    --kube-api-qps=100 --kube-api-burst=200 \
    --profiling=false \
    --v=1
}

# Starts kube-scheduler from the binaries in $1 (no wait).
start_scheduler() {
  local bins=$1
  # --kube-api-qps/--kube-api-burst as for kube-controller-manager (defaults 50/100): in the 500-set
  # bench its client waited 1,660 s in all in its rate limiter over 3,300 requests, and cleanup pods
  # stayed unbound for seconds; the same QPS as kcm keeps the test cluster out of the measurement.
  start_component kube-scheduler "$bins/kube-scheduler" \
    --kubeconfig="$state/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$state/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$state/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$sched_port" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
    --leader-elect=false \
    --kube-api-qps=100 --kube-api-burst=200 \
    --profiling=false \
    --v=1
}

# Starts kwok from the binaries in $1 (no wait).
start_kwok() {
  local bins=$1
  # HOME points into the state dir so that no ~/.kwok/kwok.yaml of the user is loaded.
  start_component kwok env HOME="$state/kwok-home" "$bins/kwok" \
    --kubeconfig="$state/kubeconfig" \
    --config="$state/kwok.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --cidr=10.244.0.0/16 \
    --node-ip=10.240.0.1 \
    --node-lease-duration-seconds=40 \
    --server-address="127.0.0.1:$kwok_port"
}

cmd_up() {
  local t0=$SECONDS
  mkdir -p "$root/target"
  exec 8>"$lock"
  flock 8

  if is_up; then
    log "already up (kubeconfig: $state/kubeconfig)"
    echo "[timing] cluster-up: 0 s (already running)"
    return 0
  fi
  if [[ -e "$state" ]]; then
    log "removing stale state in $state"
    stop_all
    remove_state
  fi

  local tb=$SECONDS bins
  if [[ -n "${SCALEDOWN_K8S_VERSION:-}" ]]; then
    # Another Kubernetes version than hack/versions.env pins (the oldest supported one).
    bins=$(progress_run "control plane $SCALEDOWN_K8S_VERSION" 306 "$root/target/build-logs/control-plane.log" \
      "$here/build-control-plane-version.sh" "$SCALEDOWN_K8S_VERSION" | tail -n 1)
  else
    # Typical: the cold build of docs/development/test-cluster.md (303 s, 2 cores, nothing else running).
    bins=$(progress_run "control plane $K8S_VERSION" 303 "$root/target/build-logs/control-plane.log" \
      "$here/build-control-plane.sh" | tail -n 1)
  fi
  [[ -x "$bins/kube-apiserver" ]] || fail "" "hack/build-control-plane.sh did not produce binaries (got '$bins')"
  local build_s=$((SECONDS - tb))
  if ((build_s <= 1)); then
    echo "[timing] control-plane binaries: $build_s s (cached)"
  else
    echo "[timing] control-plane binaries: $build_s s"
  fi

  check_ports_free

  # From here on, any failure (or a signal) stops what was started.
  trap 'rc=$?; if ((rc != 0)); then log "start failed; stopping what was started"; stop_all; fi' EXIT
  trap 'exit 130' INT TERM

  mkdir -p "$pids" "$logs" "$state/bin" "$state/etcd" "$state/apiserver" "$state/kwok-home"
  chmod 700 "$state/etcd"
  ln -sf "$bins/kubectl" "$state/bin/kubectl"
  # Helm (pinned in hack/tools.env, built once into the same cache) for the chart tests.
  if [[ "${SCALEDOWN_HELM:-1}" != 0 ]]; then
    local helm
    helm=$("$here/build-tools.sh" helm | tail -n 1) || fail "" "hack/build-tools.sh helm failed"
    ln -sf "$helm" "$state/bin/helm"
  fi
  local cluster_id
  cluster_id="$(date +%Y%m%d-%H%M%S)-$$"
  echo "$cluster_id" >"$state/cluster-id"
  echo "/tmp/scaledown-e2e/$cluster_id" >"$state/hostpath-root"
  mkdir -p "/tmp/scaledown-e2e/$cluster_id"
  {
    echo "binaries=$bins"
    echo "etcd=http://127.0.0.1:$etcd_port"
    echo "apiserver=https://127.0.0.1:$api_port"
    echo "kube-controller-manager=https://127.0.0.1:$kcm_port"
    echo "kube-scheduler=https://127.0.0.1:$sched_port"
    echo "kwok=http://127.0.0.1:$kwok_port"
  } >"$state/endpoints"

  gen_pki
  write_kubeconfig "$state/kubeconfig" admin
  write_kubeconfig "$state/kube-controller-manager.kubeconfig" kube-controller-manager
  write_kubeconfig "$state/kube-scheduler.kubeconfig" kube-scheduler
  write_kwok_config

  start_component etcd "$bins/etcd" \
    --name=scaledown-e2e --data-dir="$state/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="scaledown-e2e=http://127.0.0.1:$etcd_peer_port" --initial-cluster-state=new \
    --unsafe-no-fsync --log-level=warn
  wait_until 30 etcd "etcd /health" etcd_healthy

  start_apiserver "$bins"

  start_kcm "$bins"
  start_scheduler "$bins"
  start_kwok "$bins"
  wait_until 60 kube-controller-manager "kube-controller-manager /healthz" kcm_healthy
  wait_until 60 kube-scheduler "kube-scheduler /healthz" sched_healthy
  wait_until 60 kwok "kwok /healthz" kwok_healthy

  apply_cluster_objects || fail kube-apiserver "could not create the fake nodes and the StorageClass"
  wait_until 90 kwok "nodes kwok-node-0..$((node_count - 1)) Ready and without the not-ready taint" nodes_ready
  wait_until 60 kube-controller-manager "ServiceAccount default/default" default_sa_exists

  if [[ "$real_node" != 0 ]]; then
    local tr=$SECONDS rc=0
    rm -f "$state/real-node-skipped"
    "$here/real-node.sh" up 8>&- || rc=$?
    case $rc in
    0) echo "[timing] cluster-up real node: $((SECONDS - tr)) s" ;;
    3)
      log "no real node for this cluster: another cluster on this machine runs one (only one per machine)"
      echo "another cluster on this machine runs the real node" >"$state/real-node-skipped"
      ;;
    *) fail "" "hack/real-node.sh up failed (exit $rc; its cause is reported above, its logs kept in target/real-node-logs-failed/); SCALEDOWN_REAL_NODE=0 starts the cluster without it" ;;
    esac
  else
    echo "SCALEDOWN_REAL_NODE=0" >"$state/real-node-skipped"
  fi

  trap - EXIT INT TERM
  log "up: kubeconfig $state/kubeconfig, apiserver https://127.0.0.1:$api_port, logs $logs"
  echo "[timing] cluster-up: $((SECONDS - t0)) s"
}

cmd_down() {
  local t0=$SECONDS
  mkdir -p "$root/target"
  exec 8>"$lock"
  flock 8
  if [[ ! -e "$state" ]]; then
    log "not running (no $state)"
    return 0
  fi
  stop_all # the real node first
  local left
  left=$(leftovers)
  if [[ -n "$left" ]]; then
    log "ERROR: processes still running after stop: $(echo "$left" | tr '\n' ' ')"
    # shellcheck disable=SC2086 # one pid per word
    ps -o pid,pgid,cmd -p $left >&2 || true
    exit 1
  fi
  remove_state
  log "down (logs of this run: target/cluster-logs-last/)"
  echo "[timing] cluster-down: $((SECONDS - t0)) s" >&2
}

# Stops kube-apiserver (SIGTERM), keeps it down for $1 seconds (default 0), starts it again and
# waits for /readyz. Prints "[timing] restart-apiserver ready-at <unix ms>" when it is ready again.
#
# kube-apiserver may ignore SIGTERM for about 10 s (it drains its watches), so it is SIGKILLed after
# 3 s. kube-scheduler does not survive an API server restart reliably ("Scheduler cache is
# corrupted" a little later), so it is restarted once the API server is ready; kcm and kwok are
# started again if they died. The command returns when all of them are healthy.
cmd_restart_apiserver() {
  local down=${1:-0} bins
  is_up || fail "" "no cluster is up"
  bins=$(sed -n 's/^binaries=//p' "$state/endpoints")
  stop_component kube-apiserver 3
  sleep "$down"
  start_apiserver "$bins"
  echo "[timing] restart-apiserver ready-at $(date +%s%3N)"
  stop_component kube-scheduler 3
  start_scheduler "$bins"
  if ! component_alive kube-controller-manager; then
    log "kube-controller-manager died during the restart; starting it again"
    start_kcm "$bins"
  fi
  if ! component_alive kwok; then
    log "kwok died during the restart; starting it again"
    start_kwok "$bins"
  fi
  wait_until 60 kube-scheduler "kube-scheduler /healthz" sched_healthy
  wait_until 60 kube-controller-manager "kube-controller-manager /healthz" kcm_healthy
  wait_until 60 kwok "kwok /healthz" kwok_healthy
}

cmd_status() {
  if is_up; then
    echo "up: apiserver https://127.0.0.1:$api_port, KUBECONFIG=$state/kubeconfig"
    local c
    for c in "${components[@]}"; do
      echo "  $c pid $(pid_of "$c")"
    done
    if [[ -s "$state/real-node-skipped" ]]; then
      echo "  real node: none ($(cat "$state/real-node-skipped"))"
    elif [[ -e "$state/real-node" ]]; then
      echo "  real node: $("$here/real-node.sh" status 2>&1 || true)"
    else
      echo "  real node: none"
    fi
    return 0
  fi
  if [[ -e "$state" ]]; then
    echo "down (stale state in $state; 'hack/cluster.sh down' cleans it)"
  else
    echo "down"
  fi
  return 1
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
restart-apiserver) cmd_restart_apiserver "${2:-0}" ;;
*)
  echo "usage: $0 up|down|status|restart-apiserver [down-seconds]" >&2
  exit 2
  ;;
esac
