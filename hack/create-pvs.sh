#!/usr/bin/env bash
# Creates static PersistentVolumes on the local test control plane (hack/cluster.sh), for claims that
# the real PV controller then binds (StorageClass volumeBindingMode: Immediate).
#
#   hack/create-pvs.sh N [--reclaim Retain|Delete] [--class NAME] [--prefix NAME] [--node NODE]
#
# Each PV: 1Gi, ReadWriteOnce, storageClassName NAME (default: standard), reclaim policy Retain by
# default, hostPath /tmp/scaledown-e2e/<cluster-id>/<pv-name>. With --reclaim Delete the controller
# manager's hostPath deleter removes that directory and the PV once its claim is deleted, like a real
# provisioner would. Names are <prefix>-<i> (default prefix: pv-<class>), skipping names already in use.
# With --node NODE the PVs get a required node affinity to that node (kubernetes.io/hostname): for the
# real node, `--node real-0 --class real-hostpath` gives volumes that its pods really mount, and the
# files they write are in the PV's directory on this host.
# Prints the names of the PVs it created.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
state="$(cd "$here/.." && pwd)/target/cluster"
kubectl=("$state/bin/kubectl" --kubeconfig "$state/kubeconfig")

usage() {
  echo "usage: $0 N [--reclaim Retain|Delete] [--class NAME] [--prefix NAME] [--node NODE]" >&2
  exit 2
}

(($# >= 1)) || usage
count=$1
shift
[[ "$count" =~ ^[0-9]+$ ]] || usage
reclaim=Retain
class=standard
prefix=
node=
while (($#)); do
  case "$1" in
  --reclaim) reclaim=${2:-}; shift 2 || usage ;;
  --class) class=${2:-}; shift 2 || usage ;;
  --prefix) prefix=${2:-}; shift 2 || usage ;;
  --node) node=${2:-}; shift 2 || usage ;;
  *) usage ;;
  esac
done
[[ "$reclaim" == Retain || "$reclaim" == Delete ]] || { echo "--reclaim must be Retain or Delete" >&2; exit 2; }
[[ -n "$class" ]] || usage
prefix=${prefix:-pv-$class}

[[ -f "$state/kubeconfig" && -s "$state/hostpath-root" ]] ||
  { echo "no local cluster in $state; run 'make cluster-up' (hack/cluster.sh up) first" >&2; exit 1; }
hostpath_root=$(cat "$state/hostpath-root")

existing=$("${kubectl[@]}" get pv -o name)
created=()
i=0
while ((${#created[@]} < count)); do
  name="$prefix-$i"
  i=$((i + 1))
  grep -qx "persistentvolume/$name" <<<"$existing" && continue
  mkdir -p "$hostpath_root/$name"
  affinity=
  [[ -z "$node" ]] || affinity="  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [\"$node\"]}"
  "${kubectl[@]}" create -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $name
  labels:
    scaledown.e2e/static-pv: "true"
    scaledown.e2e/storage-class: $class
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  storageClassName: $class
  persistentVolumeReclaimPolicy: $reclaim
  volumeMode: Filesystem
  hostPath:
    path: $hostpath_root/$name
    type: ""
$affinity
YAML
  created+=("$name")
done
((count == 0)) || printf '%s\n' "${created[@]}"
