#!/usr/bin/env bash
# A real node beside the KWOK nodes of a running hack/cluster.sh cluster (opt-in; issue 16):
# containerd, runc and the CNI plugins from Debian, a kubelet built from the control plane's
# Kubernetes module version (hack/build-kubelet.sh), all inside a network and mount namespace of
# their own.
#
#   hack/real-node.sh up       start it and wait until the node is Ready (no-op if it already runs)
#   hack/real-node.sh down     stop everything it started; leaves no process, container, mount,
#                              cgroup or namespace behind; idempotent
#   hack/real-node.sh status   exit 0 if the node runs and is Ready
#   hack/real-node.sh push-image OCI_LAYOUT REF
#                              push the image of REF's tag in an OCI layout (`make image`:
#                              target/image/oci) to the node's registry under REF, so a pod naming
#                              REF (e.g. the chart's ghcr.io/... image) starts on the node
#   hack/real-node.sh exec CMD [ARG...]
#                              run CMD in the node's network namespace, where the node's registry
#                              is 127.0.0.1:5000 (plain HTTP) and the API server 127.0.0.1:<api
#                              port> as in the cluster's kubeconfig; nothing else is reachable
#                              there (tests/e2e_release.rs runs hack/release.sh this way)
#
# Only one real node can run per machine (the kubelet's cgroups are /sys/fs/cgroup/*/kubepods,
# machine-wide): `up` exits 3 with a message naming the other node's state dir if another checkout
# (or another port base) runs one, and `down` then touches nothing machine-wide.
#
# The node (default name real-0) is labelled scaledown.test/node=real and tainted
# scaledown.test/node=real:NoSchedule, so only pods that tolerate the taint land on it. Images:
# docker.io/library/busybox:latest (Debian's busybox-static, hack/busybox-image.sh) and
# docker.io/library/redis:7.0 (Debian's redis-tools, hack/redis-image.sh) are imported into
# containerd and served by a registry on the namespace's loopback, containerd's only host for
# docker.io, ghcr.io, localhost and 127.0.0.1:5000 (its own address, for `exec`), so `busybox` with
# any pull policy starts, and the controller's image (`push-image`) under its published name. No
# pull ever leaves the namespace.
#
# Network rule: every process of the node (kubelet, containerd, shims, pods) lives in a network
# namespace this script creates, reachable only through loopback relays:
#   kubelet -> API server  netns 127.0.0.1:<api port> -socat-> unix socket -socat-> host 127.0.0.1:<api port>
#   API server -> kubelet  host 127.0.0.1:<kubelet port> -socat-> unix socket -socat-> netns 127.0.0.1:<kubelet port>
#   pods -> API server     netns <kubernetes Service ClusterIP>:443 (on the namespace's lo) -socat-> the api socket
#                          (in-cluster clients dial KUBERNETES_SERVICE_HOST:PORT; there is no kube-proxy)
# The namespace has no route out: a bridge (cni0, 10.250.0.1/24, the node IP) for the pods and lo.
# cni0 has a fixed MAC address: a bridge without one takes the lowest MAC of its ports, so it
# changed whenever a pod came or went, and the other pods' cached gateway MAC went stale (their
# connections to the node and the API server, and the kubelet's probes, stalled for 30 s and more).
# Cluster DNS: CoreDNS (hack/build-tools.sh coredns) runs in the namespace, serving cluster.local
# from the API server with its kubernetes plugin on the kube-dns Service's ClusterIP (10.96.0.10, on
# the namespace's lo like the kubernetes Service), which the kubelet gives pods as clusterDNS. It
# reads the API server through the api relay as ServiceAccount kube-system/coredns, with the
# ClusterRole system:coredns a kubeadm install gives it. It forwards nothing: names outside the
# cluster domain get no answer (network rule).
# Nothing is added to the host's network configuration. For API server -> kubelet the node's
# addresses are set by this script (the kubelet runs with --cloud-provider=external, this script
# plays the cloud controller): InternalIP 10.250.0.1 and Hostname 127.0.0.1, so the API server (which
# prefers Hostname) dials the loopback relay and never looks the node name up in DNS.
#
# The mount namespace (private propagation, its own tmpfs on /run) holds every mount that the
# kubelet, containerd and the shims make; it disappears with the last of their processes.
#
# Environment:
#   SCALEDOWN_E2E_PORT_BASE      as hack/cluster.sh (default 23400); the kubelet relay uses base+10
#   SCALEDOWN_REAL_NODE_NAME     node name (default real-0)
#   SCALEDOWN_E2E_CACHE, SCALEDOWN_K8S_VERSION   passed on to hack/build-kubelet.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=SCRIPTDIR/progress.sh
source "$here/progress.sh"
state="$root/target/cluster"
pki="$state/pki"
rn="$state/real-node"
lock="$root/target/real-node.lock"
# One real node per machine: its kubelet owns /sys/fs/cgroup/*/kubepods. The namespace holder keeps
# this lock (flock) for the node's lifetime; the owner file names the state dir that holds it.
machine_lock=${SCALEDOWN_REAL_NODE_LOCK:-/run/scaledown-real-node.lock}
machine_owner="$machine_lock.owner"

port_base=${SCALEDOWN_E2E_PORT_BASE:-23400}
api_port=$((port_base + 2))
kubelet_port=$((port_base + 10))
node=${SCALEDOWN_REAL_NODE_NAME:-real-0}
node_ip=10.250.0.1
bridge_mac=0a:58:0a:fa:00:01
pod_subnet=10.250.0.0/24
registry_port=5000 # on the namespace's own loopback
# Registries whose only host, for containerd, is that registry; the last is the registry's own
# address in the namespace (a release pushed there by `exec hack/release.sh` names it).
mirrored=(docker.io ghcr.io localhost "127.0.0.1:$registry_port")
sandbox_image=localhost/scaledown/sandbox:busybox
# Cluster DNS (see the header): the kube-dns Service's ClusterIP, inside the service CIDR of
# hack/cluster.sh, and the cluster domain.
dns_ip=10.96.0.10
cluster_domain=cluster.local
packages=(containerd runc containernetworking-plugins busybox-static iptables socat conntrack)
# Kernel settings the kubelet changes at start (pkg/kubelet/cm); restored by `down`.
sysctls=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)

log() { printf '[real-node] %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

kubectl() { "$state/bin/kubectl" --kubeconfig "$state/kubeconfig" "$@"; }

# --- processes -------------------------------------------------------------------------------------

pid_of() { [[ -s "$rn/pids/$1.pid" ]] && cat "$rn/pids/$1.pid"; }

proc_alive() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "$st" && "$st" != Z ]]
}

# The recorded pid is alive and its command line names our state dir (no recycled pid is signalled).
is_ours() {
  proc_alive "$1" && tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -qF -- "$rn"
}

alive() {
  local pid
  pid=$(pid_of "$1") || return 1
  is_ours "$pid"
}

# start NAME [nsenter args --] CMD...: in its own session, stdout and stderr to logs/NAME.log, pid
# recorded. Returns once the background subshell has exec'd CMD (or died): until then its command
# line is this script's, which does not name the state dir, so `alive` (is_ours) would call a
# healthy start dead. That was issue 27's "registry exited while waiting for: registry on the
# namespace's 127.0.0.1:5000" with an empty log: wait_for looked a few milliseconds after `start`,
# on a loaded machine before the exec (hack/cluster.sh's start_component had the same race, d0570e7).
start() {
  local name=$1
  shift
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec $fd>&-"; fi
    done
    exec setsid "$@" </dev/null >>"$rn/logs/$name.log" 2>&1
  ) &
  local pid=$! i
  echo "$pid" >"$rn/pids/$name.pid"
  for ((i = 0; i < 200; i++)); do
    is_ours "$pid" && return 0
    proc_alive "$pid" || return 0 # died before or at its exec: wait_for reports it with its status
    sleep 0.05
  done
  log "WARNING: $name (pid $pid) has not exec'd its command after 10 s"
}

# report NAME: why component NAME is not (or not yet) what was waited for: its pid, its exit status
# if it exited (every component is a child of this shell, started by this `up`), or what that pid
# is now, then the last lines of its log (stdout and stderr), or that the log is empty.
report() {
  local name=$1 pid rc f
  f="$rn/logs/$name.log"
  if ! pid=$(pid_of "$name"); then
    log "$name: no pid recorded"
  elif ! proc_alive "$pid"; then
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    if ((rc == 127)) && ! [[ -s "$f" ]]; then
      log "$name (pid $pid) exited (status unknown: not a child of this shell, or its command was not found)"
    elif ((rc > 128)); then
      log "$name (pid $pid) was killed by signal $((rc - 128)) ($(kill -l "$((rc - 128))" 2>/dev/null || echo '?'))"
    else
      log "$name (pid $pid) exited with status $rc"
    fi
  elif ! is_ours "$pid"; then
    log "$name pid $pid is not $name: stat '$(cut -d' ' -f1-8 "/proc/$pid/stat" 2>/dev/null)'," \
      "cmdline '$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)'"
  else
    log "$name (pid $pid) still runs"
  fi
  if [[ -s "$f" ]]; then
    log "last lines of $f:"
    tail -n 30 "$f" >&2 || true
  else
    log "$f is empty"
  fi
}

# in_ns CMD...: runs CMD in the node's network and mount namespaces.
in_ns() { nsenter -t "$(pid_of holder)" -n -m -- "$@"; }

stop_pid() { # stop_pid PID GRACE: SIGTERM, SIGKILL after GRACE seconds
  local pid=$1 grace=$2 i
  proc_alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    proc_alive "$pid" || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    proc_alive "$pid" || return 0
    sleep 0.1
  done
}

stop() { # stop NAME [GRACE]
  local pid
  if pid=$(pid_of "$1") && is_ours "$pid"; then stop_pid "$pid" "${2:-10}"; fi
  rm -f "$rn/pids/$1.pid"
}

# Every process that belongs to the node: in its network or mount namespace (kubelet, containerd,
# shims, relays), in a kubepods cgroup (containers, which have namespaces of their own), or naming
# the state dir on its command line.
node_processes() {
  local net="" mnt="" p
  [[ -s "$rn/ns" ]] && read -r net mnt <"$rn/ns"
  {
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
      if [[ -n "$net" ]]; then
        [[ "$(stat -L -c %i "/proc/$p/ns/net" 2>/dev/null)" == "$net" ]] && { echo "$p"; continue; }
        [[ "$(stat -L -c %i "/proc/$p/ns/mnt" 2>/dev/null)" == "$mnt" ]] && { echo "$p"; continue; }
      fi
      tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF -- "$rn/" && echo "$p"
    done
    cat /sys/fs/cgroup/pids/kubepods/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/cgroup.procs \
      /sys/fs/cgroup/pids/kubepods/*/*/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/*/*/cgroup.procs 2>/dev/null
  } | sort -un | while read -r p; do proc_alive "$p" && echo "$p"; done
}

# --- prerequisites ---------------------------------------------------------------------------------

ensure_packages() {
  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  local t0=$SECONDS apt_log="$root/target/build-logs/real-node-apt.log"
  log "installing ${missing[*]} with apt-get (log: $apt_log)"
  # apt's and dpkg's 150 lines go to the log; on a failure its end is printed.
  if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
    progress_run_quiet "apt-get update" 10 "$root/target/build-logs/real-node-apt-update.log" apt-get update -q
  fi
  # policy-rc.d: the package's own containerd service must not start (no systemd here, but be sure).
  progress_run_quiet "apt-get install" 12 "$apt_log" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  echo "[timing] real-node packages: $((SECONDS - t0)) s"
}

client_cert() {
  local d="$rn/pki"
  mkdir -p "$d"
  (
    cd "$d"
    umask 077
    openssl ecparam -name prime256v1 -genkey -noout -out kubelet.key 2>/dev/null
    openssl req -new -key kubelet.key -subj "/O=system:nodes/CN=system:node:$node" -out kubelet.csr 2>/dev/null
    printf '%s\n' 'basicConstraints=critical,CA:FALSE' 'keyUsage=critical,digitalSignature' \
      'extendedKeyUsage=clientAuth' 'authorityKeyIdentifier=keyid' >kubelet.ext
    openssl x509 -req -in kubelet.csr -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAserial "$d/ca.srl" -CAcreateserial \
      -sha256 -days 3650 -extfile kubelet.ext -out kubelet.crt 2>/dev/null
    rm -f kubelet.csr kubelet.ext
  )
  cat >"$rn/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: scaledown-e2e
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: kubelet
  user:
    client-certificate: $d/kubelet.crt
    client-key: $d/kubelet.key
contexts:
- name: scaledown-e2e
  context: {cluster: scaledown-e2e, user: kubelet}
current-context: scaledown-e2e
EOF
}

write_configs() {
  mkdir -p "$rn/cni/net.d" "$rn/cni/ipam" "$rn/pod-logs" "$rn/kubelet" "$rn/containerd/root" "$rn/containerd/state"
  cat >"$rn/cni/net.d/10-scaledown-real.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "scaledown-real",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$pod_subnet", "gateway": "$node_ip"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$rn/cni/ipam"
      }
    }
  ]
}
EOF
  cat >"$rn/containerd.toml" <<EOF
version = 2
root = "$rn/containerd/root"
state = "$rn/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$rn/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$sandbox_image"
  # containerd asks oom_score_adj -998 for sandboxes; without CAP_SYS_RESOURCE runc fails with
  # "can't get final child's PID from pipe: EOF" unless the value is clamped to our own.
  restrict_oom_score_adj = true
  disable_apparmor = true
  disable_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$rn/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$rn/certs.d"
EOF
  mkdir -p "$rn/certs.d"
  echo "nameserver 127.0.0.1" >"$rn/resolv.conf"
  cat >"$rn/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$rn/containerd.sock
imageServiceEndpoint: unix://$rn/containerd.sock
address: 0.0.0.0
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# The API server presents no client certificate to kubelets (no --kubelet-client-certificate);
# the kubelet is reachable only through the loopback relay.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
registerNode: true
registerWithTaints:
- {key: scaledown.test/node, value: real, effect: NoSchedule}
podLogsDir: $rn/pod-logs
resolvConf: $rn/resolv.conf
clusterDNS: [$dns_ip]
clusterDomain: $cluster_domain
staticPodPath: ""
maxPods: 30
serializeImagePulls: false
protectKernelDefaults: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 50Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
nodeStatusUpdateFrequency: 10s
EOF
}

# --- up --------------------------------------------------------------------------------------------

node_json() { kubectl get node "$node" -o json 2>/dev/null; }
node_registered() { node_json >/dev/null; }
node_ready() {
  node_json | jq -e '
    any(.status.conditions[]?; .type == "Ready" and .status == "True")
    and all(.spec.taints[]?; .key != "node.kubernetes.io/not-ready" and .key != "node.cloudprovider.kubernetes.io/uninitialized")' >/dev/null
}

wait_for() { # wait_for SECONDS COMPONENT WHAT CMD...: fails (with the cause) if any component dies
  local timeout=$1 component=$2 what=$3
  shift 3
  local deadline=$((SECONDS + timeout)) f c
  until "$@"; do
    for f in "$rn"/pids/*.pid; do
      [[ -e "$f" ]] || continue
      c=${f##*/}
      c=${c%.pid}
      alive "$c" && continue
      sleep 0.25 # look twice before calling it dead
      alive "$c" && continue
      log "ERROR: $c exited while waiting for: $what"
      report "$c"
      exit 1
    done
    if ((SECONDS >= deadline)); then
      log "ERROR: timed out after ${timeout}s waiting for: $what"
      report "$component"
      exit 1
    fi
    sleep 0.25
  done
}

# The cloud-controller part: addresses the API server can reach (see the header), then the
# uninitialized taint goes.
initialize_node() {
  kubectl patch node "$node" --subresource=status --type=merge -p "{\"status\":{\"addresses\":[
    {\"type\":\"InternalIP\",\"address\":\"$node_ip\"},{\"type\":\"Hostname\",\"address\":\"127.0.0.1\"}]}}" >/dev/null
  kubectl taint node "$node" node.cloudprovider.kubernetes.io/uninitialized- >/dev/null 2>&1 || true
}

# What pods need of the node's network besides the bridge. Its fixed MAC (see the header; 0a:58
# and the node IP, as the CNI plugins derive theirs). And the kube-proxy part, for the one Service
# pods need: in-cluster clients (the controller's image) dial the `kubernetes` Service's ClusterIP
# and port, which the kubelet puts in every container's KUBERNETES_SERVICE_HOST/PORT. The address
# goes on the namespace's lo and a relay forwards it to the API server through the api socket; the
# API server's certificate names that address. Idempotent: also run by `up` on a node that runs.
ensure_pod_network() {
  nsenter -t "$(pid_of holder)" -n -- ip link set cni0 address "$bridge_mac"
  local ip port
  ip=$(kubectl get service kubernetes -n default -o 'jsonpath={.spec.clusterIP}') || die "no Service default/kubernetes"
  port=$(kubectl get service kubernetes -n default -o 'jsonpath={.spec.ports[0].port}')
  [[ -n "$ip" && -n "$port" ]] || die "Service default/kubernetes has no ClusterIP or port"
  nsenter -t "$(pid_of holder)" -n -- ip addr replace "$ip/32" dev lo
  alive relay-api-service && return 0
  start relay-api-service nsenter -t "$(pid_of holder)" -n -- socat "TCP-LISTEN:$port,bind=$ip,fork,reuseaddr" "UNIX-CONNECT:$rn/api.sock"
}

# Cluster DNS (see the header): the objects a kubeadm install makes for CoreDNS (ServiceAccount,
# ClusterRole system:coredns and its binding, Service kube-dns with the fixed ClusterIP), a
# kubeconfig with a token of that ServiceAccount (through the api relay), the Corefile, and
# CoreDNS itself in the namespace, listening on the ClusterIP (on the namespace's lo).
start_dns() {
  local coredns token
  coredns=$("$here/build-tools.sh" coredns | tail -n 1) || die "hack/build-tools.sh coredns failed"
  [[ -x "$coredns" ]] || die "hack/build-tools.sh coredns printed '$coredns', not an executable"
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system, labels: {scaledown.test/node: real}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns", labels: {scaledown.test/node: real}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns", labels: {scaledown.test/node: real}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS, scaledown.test/node: real}
spec:
  clusterIP: $dns_ip
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
EOF
  token=$(kubectl create token coredns -n kube-system --duration=8760h) || die "no token for kube-system/coredns"
  (
    umask 077
    cat >"$rn/coredns.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: scaledown-e2e
  cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt"}
users:
- name: coredns
  user: {token: "$token"}
contexts:
- name: coredns
  context: {cluster: scaledown-e2e, user: coredns}
current-context: coredns
EOF
  )
  # kubeadm's Corefile without forward, loop and reload (nothing outside the cluster domain is
  # asked; the file does not change); health, ready and metrics on the namespace's loopback.
  cat >"$rn/Corefile" <<EOF
.:53 {
    bind $dns_ip
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes $cluster_domain in-addr.arpa ip6.arpa {
        kubeconfig $rn/coredns.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    prometheus 127.0.0.1:9153
    cache 30 {
        disable success $cluster_domain
        disable denial $cluster_domain
    }
    loadbalance
}
EOF
  nsenter -t "$(pid_of holder)" -n -- ip addr replace "$dns_ip/32" dev lo
  start coredns nsenter -t "$(pid_of holder)" -n -- "$coredns" -conf "$rn/Corefile"
  wait_for 30 coredns "CoreDNS ready (kubernetes plugin synced) on the namespace's 127.0.0.1:8181" dns_ready
}

dns_ready() { alive coredns && in_ns curl -fsS --max-time 2 "http://127.0.0.1:8181/ready" >/dev/null 2>&1; }

# The EXIT trap of a failed `up`: keeps this start's logs (only this start's: an older copy goes)
# in target/real-node-logs-failed, says which they are, and stops what was started.
up_failed() {
  local kept="$root/target/real-node-logs-failed" f sizes=()
  rm -rf "$kept"
  if cp -r "$rn/logs" "$kept" 2>/dev/null; then
    for f in "$kept"/*; do [[ -e "$f" ]] && sizes+=("${f##*/} $(stat -c %s "$f") B"); done
    f=$(printf '%s, ' "${sizes[@]}")
    log "start failed; its logs are kept in $kept (${f%, }); stopping what was started"
  else
    log "start failed (no logs in $rn/logs); stopping what was started"
  fi
  teardown
}

cmd_up() {
  local t0=$SECONDS
  [[ $EUID -eq 0 ]] || die "must run as root (namespaces, mounts, cgroups)"
  "$here/cluster.sh" status >/dev/null || die "no hack/cluster.sh cluster is up"
  mkdir -p "$root/target"
  exec 8>"$lock"
  flock 8
  if alive kubelet && alive containerd && alive coredns && node_ready; then
    ensure_pod_network
    log "already up (node $node)"
    return 0
  fi
  if machine_lock_held_elsewhere; then
    log "SKIPPED: another real node runs on this machine (state: $(cat "$machine_owner" 2>/dev/null || echo unknown));" \
      "only one per machine (cgroups /sys/fs/cgroup/*/kubepods); lock $machine_lock"
    exit 3
  fi
  if [[ -e "$rn" ]]; then
    log "removing stale state in $rn"
    teardown
  fi
  if [[ -n "$(ss -Hltn "sport = :$kubelet_port")" ]]; then
    die "port $kubelet_port (kubelet relay, SCALEDOWN_E2E_PORT_BASE+10) is in use"
  fi

  ensure_packages
  local tb=$SECONDS kubelet_dir
  # Typical: 36 s with a warm Go build cache (after the control plane); longer cold.
  kubelet_dir=$(progress_run kubelet 36 "$root/target/build-logs/kubelet.log" "$here/build-kubelet.sh" | tail -n 1)
  [[ -x "$kubelet_dir/kubelet" ]] || die "hack/build-kubelet.sh produced no kubelet"
  echo "[timing] real-node kubelet binary: $((SECONDS - tb)) s"

  trap 'rc=$?; if ((rc != 0)); then up_failed; fi' EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$rn/pids" "$rn/logs"
  local s
  for s in "${sysctls[@]}"; do echo "$s=$(sysctl -n "$s")"; done >"$rn/sysctls"

  # The namespace holder: a network namespace with lo and the pod bridge carrying the node IP, and
  # a private mount namespace with its own /run (containerd's /run/containerd, runc's state, the
  # pods' network namespace files). Its argv[0] names the state dir, so is_ours recognises it.
  start holder unshare --net --mount --propagation private -- bash -c "
    set -e
    exec 9>'$machine_lock'
    flock -n 9 || { echo 'machine lock $machine_lock is held by another real node'; exit 75; }
    echo '$rn' >'$machine_owner'
    mount -t tmpfs -o mode=755,size=64m scaledown-real-node-run /run
    mkdir -p /run/lock /run/shm /run/netns
    ip link set lo up
    ip link add cni0 type bridge
    ip addr add $node_ip/24 dev cni0
    ip link set cni0 up
    exec -a 'scaledown-real-node-holder $rn/' sleep infinity"
  wait_for 10 holder "namespace holder" holder_ready
  echo "$(stat -L -c %i "/proc/$(pid_of holder)/ns/net") $(stat -L -c %i "/proc/$(pid_of holder)/ns/mnt")" >"$rn/ns"

  # Loopback relays (unix sockets join the two network namespaces).
  start relay-api-host socat "UNIX-LISTEN:$rn/api.sock,fork,unlink-early" "TCP:127.0.0.1:$api_port"
  start relay-api-ns nsenter -t "$(pid_of holder)" -n -- socat "TCP-LISTEN:$api_port,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$rn/api.sock"
  start relay-kubelet-ns nsenter -t "$(pid_of holder)" -n -- socat "UNIX-LISTEN:$rn/kubelet.sock,fork,unlink-early" "TCP:127.0.0.1:$kubelet_port"
  start relay-kubelet-host socat "TCP-LISTEN:$kubelet_port,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$rn/kubelet.sock"
  ensure_pod_network

  client_cert
  write_configs
  start containerd nsenter -t "$(pid_of holder)" -n -m -- containerd --config "$rn/containerd.toml"
  wait_for 30 containerd "containerd socket" ctr_ok
  local ti=$SECONDS
  "$here/busybox-image.sh" "$rn/busybox-oci.tar"
  ctr -a "$rn/containerd.sock" -n k8s.io images import "$rn/busybox-oci.tar" >"$rn/logs/import.log" 2>&1 ||
    { cat "$rn/logs/import.log" >&2; die "image import failed"; }
  ctr -a "$rn/containerd.sock" -n k8s.io images ls -q >>"$rn/logs/import.log"
  # The mirror: a registry on the namespace's loopback (crane, hack/build-tools.sh) serving the same
  # images, so pulls (imagePullPolicy Always, the default for :latest) are answered locally.
  # containerd's hosts.toml names it as the only host for docker.io: no fallback to the internet.
  local crane
  crane=$("$here/build-tools.sh" crane | tail -n 1) || die "hack/build-tools.sh crane failed"
  [[ -x "$crane" ]] || die "hack/build-tools.sh crane printed '$crane', not an executable"
  mkdir -p "$rn/registry"
  for h in "${mirrored[@]}"; do mkdir -p "$rn/certs.d/$h"; done
  start registry nsenter -t "$(pid_of holder)" -n -- "$crane" registry serve --address "127.0.0.1:$registry_port" --disk "$rn/registry"
  wait_for 20 registry "registry on the namespace's 127.0.0.1:$registry_port" registry_ok
  local h
  for h in "${mirrored[@]}"; do
    printf 'server = "http://127.0.0.1:%s"\n\n[host."http://127.0.0.1:%s"]\n  capabilities = ["pull", "resolve"]\n' \
      "$registry_port" "$registry_port" >"$rn/certs.d/$h/hosts.toml"
  done
  in_ns ctr -a "$rn/containerd.sock" -n k8s.io images push --plain-http \
    "127.0.0.1:$registry_port/library/busybox:latest" docker.io/library/busybox:latest >>"$rn/logs/import.log" 2>&1 ||
    { tail -n 20 "$rn/logs/import.log" >&2; die "pushing busybox to the mirror failed"; }
  in_ns ctr -a "$rn/containerd.sock" -n k8s.io images push --plain-http \
    "127.0.0.1:$registry_port/scaledown/sandbox:busybox" "$sandbox_image" >>"$rn/logs/import.log" 2>&1 ||
    { tail -n 20 "$rn/logs/import.log" >&2; die "pushing the sandbox image to the mirror failed"; }
  # Redis 7.0 from Debian's packages (hack/redis-image.sh, cached), for example/redis: redis:7.0.
  "$here/redis-image.sh" "$rn/redis-oci.tar" || die "hack/redis-image.sh failed"
  ctr -a "$rn/containerd.sock" -n k8s.io images import "$rn/redis-oci.tar" >>"$rn/logs/import.log" 2>&1 ||
    { tail -n 20 "$rn/logs/import.log" >&2; die "importing the redis image failed"; }
  in_ns ctr -a "$rn/containerd.sock" -n k8s.io images push --plain-http \
    "127.0.0.1:$registry_port/library/redis:7.0" docker.io/library/redis:7.0 >>"$rn/logs/import.log" 2>&1 ||
    { tail -n 20 "$rn/logs/import.log" >&2; die "pushing the redis image to the mirror failed"; }
  rm -f "$rn/redis-oci.tar"
  echo "[timing] real-node image import and mirror: $((SECONDS - ti)) s"

  # The kubelet's identity (system:node:$node in system:nodes) gets the system:node role; the API
  # server runs with RBAC only, so no Node authorizer.
  kubectl apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: scaledown-real-node-$node
  labels: {scaledown.test/node: real}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:node:$node"}
---
# Volumes on the real node: static hostPath PVs with node affinity to it (hack/create-pvs.sh
# --node $node --class real-hostpath; tests: support::create_real_pvs). WaitForFirstConsumer, so a
# claim binds once its pod is scheduled (to the real node).
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: real-hostpath
  labels: {scaledown.test/node: real}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF

  local td=$SECONDS
  start_dns
  echo "[timing] real-node CoreDNS ready: $((SECONDS - td)) s"

  local tk=$SECONDS
  start kubelet nsenter -t "$(pid_of holder)" -n -m -- "$kubelet_dir/kubelet" \
    --config="$rn/kubelet.yaml" --kubeconfig="$rn/kubelet.kubeconfig" --root-dir="$rn/kubelet" \
    --hostname-override="$node" --node-ip="$node_ip" --cloud-provider=external \
    --node-labels="scaledown.test/node=real" --v=2
  wait_for 60 kubelet "node $node registered" node_registered
  initialize_node
  wait_for 90 kubelet "node $node Ready" node_ready
  trap - EXIT INT TERM
  echo "[timing] real-node kubelet start -> Ready: $((SECONDS - tk)) s"
  echo "[timing] real-node up: $((SECONDS - t0)) s"
  log "up: node $node ($node_ip in its own netns), kubelet relay 127.0.0.1:$kubelet_port, logs $rn/logs"
}

holder_ready() { alive holder && nsenter -t "$(pid_of holder)" -n ip -br addr show cni0 2>/dev/null | grep -qF "$node_ip"; }
ctr_ok() { ctr -a "$rn/containerd.sock" version >/dev/null 2>&1; }
registry_ok() { alive registry && in_ns curl -fsS --max-time 2 "http://127.0.0.1:$registry_port/v2/" >/dev/null 2>&1; }

# --- down ------------------------------------------------------------------------------------------

# True if another real node (not ours) holds the machine lock: then nothing machine-wide (kubepods
# cgroups and their processes) is ours to touch.
machine_lock_held_elsewhere() {
  alive holder && return 1
  [[ -e "$machine_lock" ]] || return 1
  ! flock -n "$machine_lock" true
}

# Stops everything of the node, in order, then sweeps what is left; safe to run on a partial start
# or when nothing runs.
teardown() {
  local others=0
  if machine_lock_held_elsewhere; then
    others=1
    [[ ! -e "$rn" ]] || log "another real node holds $machine_lock ($(cat "$machine_owner" 2>/dev/null)); sweeping only $rn"
  fi
  stop kubelet 15
  if alive containerd && ctr_ok; then
    local t
    for t in $(ctr -a "$rn/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -a "$rn/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
    for t in $(ctr -a "$rn/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
      local i
      for ((i = 0; i < 50; i++)); do
        ctr -a "$rn/containerd.sock" -n k8s.io tasks delete "$t" >/dev/null 2>&1 && break
        sleep 0.1
      done
    done
    for t in $(ctr -a "$rn/containerd.sock" -n k8s.io containers ls -q 2>/dev/null); do
      ctr -a "$rn/containerd.sock" -n k8s.io containers delete "$t" >/dev/null 2>&1 || true
    done
  fi
  stop containerd 15
  stop registry 3
  stop coredns 3
  local n
  for n in relay-api-service relay-kubelet-host relay-kubelet-ns relay-api-ns relay-api-host; do stop "$n" 3; done
  # Shims, containers and anything else still in the namespaces or the kubepods cgroups.
  local left _
  for _ in 1 2 3; do
    ((others == 0)) || break
    left=$(node_processes | grep -vx "$(pid_of holder 2>/dev/null || echo none)" || true)
    [[ -n "$left" ]] || break
    log "killing leftover processes: $(echo "$left" | tr '\n' ' ')"
    # shellcheck disable=SC2086 # one pid per word
    kill -KILL $left 2>/dev/null || true
    sleep 0.5
  done
  stop holder 3
  # Mounts on the host under the state dir (none are expected: the node's mounts live in its own
  # mount namespace), innermost first.
  local m
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" || true
  done < <(awk -v p="$rn/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  # The kubelet's cgroups in every v1 hierarchy, deepest first.
  local c
  for c in /sys/fs/cgroup/*/kubepods; do
    ((others == 0)) || break
    [[ -d "$c" ]] || continue
    find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  if ((others == 0)) && [[ "$(cat "$machine_owner" 2>/dev/null)" == "$rn" ]]; then rm -f "$machine_owner"; fi
  if [[ -s "$rn/sysctls" ]]; then
    local kv
    while read -r kv; do sysctl -q -w "$kv" >/dev/null 2>&1 || log "could not restore $kv"; done <"$rn/sysctls"
  fi
  if "$here/cluster.sh" status >/dev/null 2>&1; then
    kubectl delete node "$node" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    kubectl delete clusterrolebinding "scaledown-real-node-$node" --ignore-not-found >/dev/null 2>&1 || true
    kubectl delete storageclass real-hostpath --ignore-not-found >/dev/null 2>&1 || true
    kubectl delete -n kube-system service/kube-dns serviceaccount/coredns --ignore-not-found >/dev/null 2>&1 || true
    kubectl delete clusterrolebinding/system:coredns clusterrole/system:coredns --ignore-not-found >/dev/null 2>&1 || true
  fi
  if [[ -d "$rn/logs" ]]; then
    rm -rf "$root/target/real-node-logs-last"
    cp -r "$rn/logs" "$root/target/real-node-logs-last"
  fi
  rm -rf -- "$rn"
}

leftovers_report() {
  local bad=0 p c
  machine_lock_held_elsewhere && return 0 # the kubepods cgroups and their processes are the other node's
  p=$(node_processes)
  [[ -z "$p" ]] || { log "processes left: $(echo "$p" | tr '\n' ' ')"; bad=1; }
  if awk -v p="$rn/" 'index($5, p) == 1' /proc/self/mountinfo | grep -q .; then log "mounts left under $rn"; bad=1; fi
  for c in /sys/fs/cgroup/*/kubepods; do [[ -d "$c" ]] && { log "cgroup left: $c"; bad=1; }; done
  return $bad
}

cmd_down() {
  local t0=$SECONDS
  mkdir -p "$root/target"
  exec 8>"$lock"
  flock 8
  teardown
  leftovers_report || die "teardown left something behind"
  echo "[timing] real-node down: $((SECONDS - t0)) s"
}

cmd_status() {
  if alive kubelet && alive containerd && alive coredns && node_ready; then
    echo "up: node $node Ready; kubelet pid $(pid_of kubelet), containerd pid $(pid_of containerd), CoreDNS pid $(pid_of coredns)"
    return 0
  fi
  if [[ -e "$rn" ]]; then echo "down (stale state in $rn; 'hack/real-node.sh down' cleans it)"; else echo "down"; fi
  return 1
}

# push-image OCI_LAYOUT REF: the layout's image tagged with REF's tag, pushed as REF's repository
# path to the node's registry (the mirror of REF's host).
cmd_push_image() {
  local layout=${1:?usage: $0 push-image OCI_LAYOUT REF} ref=${2:?usage: $0 push-image OCI_LAYOUT REF}
  local tag=${ref##*:} path=${ref#*/} crane
  path=${path%:*}
  [[ "$tag" != "$ref" ]] || die "REF must end in :TAG (got $ref)"
  [[ -s "$layout/index.json" ]] || die "no OCI layout at $layout (make image builds target/image/oci)"
  if ! { alive holder && registry_ok; }; then die "the real node is not up (hack/real-node.sh up)"; fi
  crane=$("$here/build-tools.sh" crane | tail -n 1) || die "hack/build-tools.sh crane failed"
  # crane push takes a layout of one image: pick REF's tag out of the index.
  local one
  one=$(mktemp -d)
  trap 'rm -rf "$one"' RETURN
  cp -r "$layout/." "$one/"
  jq --arg tag "$tag" '.manifests |= map(select(.annotations["org.opencontainers.image.ref.name"] == $tag))' \
    "$layout/index.json" >"$one/index.json"
  [[ "$(jq '.manifests | length' "$one/index.json")" == 1 ]] || die "no image tagged $tag in $layout/index.json"
  in_ns "$crane" push --insecure "$one" "127.0.0.1:$registry_port/$path:$tag" >&2 ||
    die "pushing $ref to the node's registry failed"
  # containerd keeps the image it pulled under REF, and pods (imagePullPolicy IfNotPresent) would
  # start that one: forget it if it is another image, so the next pod pulls the pushed one.
  local pushed cached
  pushed=$(jq -r '.manifests[0].digest' "$one/index.json")
  cached=$(ctr -a "$rn/containerd.sock" -n k8s.io images ls "name==$ref" | awk 'NR == 2 {print $3}')
  if [[ -n "$cached" && "$cached" != "$pushed" ]]; then
    ctr -a "$rn/containerd.sock" -n k8s.io images rm "$ref" >/dev/null ||
      die "cannot drop the node's cached copy of $ref (another image)"
    log "dropped the node's cached copy of $ref (another image than $pushed)"
  fi
  log "pushed $ref (127.0.0.1:$registry_port/$path:$tag in the node's namespace)"
}

# exec CMD...: CMD in the node's network namespace (only its network: files and mounts are the host's).
cmd_exec() {
  [[ $# -gt 0 ]] || die "usage: $0 exec CMD [ARG...]"
  if ! { alive holder && registry_ok; }; then die "the real node is not up (hack/real-node.sh up)"; fi
  exec nsenter -t "$(pid_of holder)" -n -- "$@"
}

case "${1:-}" in
up) cmd_up ;;
exec)
  shift
  cmd_exec "$@"
  ;;
push-image)
  shift
  cmd_push_image "$@"
  ;;
down) cmd_down ;;
status) cmd_status ;;
*)
  echo "usage: $0 up|down|status|push-image OCI_LAYOUT REF|exec CMD..." >&2
  exit 2
  ;;
esac
