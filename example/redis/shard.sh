# Shared by client.sh and drain.sh (sourced): where the shards are and which one owns a key.
#
# Shard i of StatefulSet $REDIS_SET is the pod $REDIS_SET-i, found by its stable DNS name under the
# headless Service $REDIS_SERVICE: $REDIS_SET-i.$REDIS_SERVICE.<namespace>.svc.<cluster domain>.
# Adapt the names here, and the placement in placement.lua.
REDIS_SET=${REDIS_SET:-${SCALEDOWN_STATEFULSET:-redis}}
REDIS_SERVICE=${REDIS_SERVICE:-redis}
REDIS_NAMESPACE=${REDIS_NAMESPACE:-${SCALEDOWN_NAMESPACE:-${POD_NAMESPACE:-default}}}
CLUSTER_DOMAIN=${CLUSTER_DOMAIN:-cluster.local}
REDIS_PORT=${REDIS_PORT:-6379}
scripts=$(dirname "$0")

# host_of I: the DNS name of shard I.
host_of() { echo "$REDIS_SET-$1.$REDIS_SERVICE.$REDIS_NAMESPACE.svc.$CLUSTER_DOMAIN"; }

# owners N HOST < KEYS: the owner (0 .. N-1) of each key read from stdin, one per line, in order;
# placement.lua runs on the Redis at HOST (any one: it touches no data), 1,000 keys per call.
owners() {
  xargs -n 1000 redis-cli -h "$2" -p "$REDIS_PORT" EVAL "$(cat "$scripts/placement.lua")" 0 "$1"
}

# split_by_owner N HOST DIR < LINES: LINES ("KEY [REST]") into DIR/<owner>, one file per owner.
split_by_owner() {
  cat >"$3/all"
  cut -d' ' -f1 <"$3/all" | owners "$1" "$2" >"$3/owners"
  [ "$(wc -l <"$3/owners")" -eq "$(wc -l <"$3/all")" ] || { echo "placement failed on $2" >&2; return 1; }
  paste -d' ' "$3/owners" "$3/all" | awk -v dir="$3" '{ o = $1; sub(/^[^ ]+ /, ""); print > (dir "/" o) }'
  rm -f "$3/all" "$3/owners"
}
