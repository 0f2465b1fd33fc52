#!/bin/sh
# The cleanup of a removed shard (the StatefulSet's cleanup pod template runs it on the claim the
# scale-down left behind): starts Redis on that volume, moves every key to its owner among the
# $SCALEDOWN_REPLICAS shards that remain (placement.lua), checks that the volume holds no key any
# more, and exits 0. If any key could not be moved it exits 1, and the controller keeps the claim
# and retries; the keys already moved stay moved (each MIGRATE deletes only what the target took).
#
# The controller sets SCALEDOWN_STATEFULSET, SCALEDOWN_NAMESPACE, SCALEDOWN_ORDINAL and
# SCALEDOWN_REPLICAS; REDIS_SERVICE names the headless Service (shard.sh). The last line it prints
# also goes to the termination log, where `kubectl describe pod` shows it.
set -eu
# shellcheck source=shard.sh
. "$(dirname "$0")/shard.sh"

o=$SCALEDOWN_ORDINAL n=$SCALEDOWN_REPLICAS
batch=${DRAIN_BATCH:-500}       # keys per MIGRATE
timeout_ms=${DRAIN_TIMEOUT_MS:-10000}
tmp=$(mktemp -d)
now_ms() { awk '{ printf "%d", $1 * 1000 }' /proc/uptime; }
t0=$(now_ms)
# finish CODE MESSAGE
finish() {
  echo "drain: $2"
  echo "$2" >/dev/termination-log 2>/dev/null || true
  redis-cli -p "$REDIS_PORT" SHUTDOWN >/dev/null 2>&1 || true
  rm -rf "$tmp"
  exit "$1"
}
[ "$o" -ge "$n" ] || finish 2 "shard $o is one of the $n shards that remain: nothing to drain"

# The shard's own persistence settings, so Redis loads what the shard wrote; only this pod may
# connect. Every change (the keys MIGRATE deletes) is on disk before it is acknowledged.
redis-server --dir /data --appendonly yes --appendfsync always --save "" \
  --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize no >"$tmp/redis.log" 2>&1 &
i=0
until [ "$(redis-cli -p "$REDIS_PORT" PING 2>/dev/null)" = PONG ]; do
  i=$((i + 1))
  [ "$i" -le 600 ] || { tail -n 5 "$tmp/redis.log"; finish 1 "Redis did not start on the volume of shard $o"; }
  sleep 0.2
done
total=$(redis-cli -p "$REDIS_PORT" DBSIZE)
echo "drain: shard $o holds $total keys; moving them to their owners among shards 0..$((n - 1))"

# Every key, grouped by owner; then each group to its owner, $batch keys per MIGRATE (REPLACE: a
# retry after a partial move overwrites the copy it left there).
redis-cli -p "$REDIS_PORT" --scan | split_by_owner "$n" 127.0.0.1 "$tmp" ||
  finish 1 "could not place the keys of shard $o (placement.lua on its own Redis)"
: >"$tmp/errors"
report=""
for f in "$tmp"/[0-9]*; do
  [ -e "$f" ] || continue
  target=${f##*/}
  host=$(host_of "$target")
  # One reply per MIGRATE: OK, NOKEY (none of its keys left here), or the error.
  xargs -n "$batch" redis-cli -p "$REDIS_PORT" MIGRATE "$host" "$REDIS_PORT" "" 0 "$timeout_ms" REPLACE KEYS \
    <"$f" >"$tmp/replies" 2>&1 || true
  grep -vxE 'OK|NOKEY' "$tmp/replies" | sed "s|^|shard $target ($host): |" >>"$tmp/errors" || true
  report="${report:+$report, }shard $target: $(wc -l <"$f")"
done

left=$(redis-cli -p "$REDIS_PORT" DBSIZE)
ms=$(($(now_ms) - t0))
if [ "$left" -eq 0 ]; then
  finish 0 "moved all $total keys of shard $o in $ms ms (to ${report:-nobody})"
fi
finish 1 "$left of $total keys are still on shard $o after $ms ms; first error: $(head -n 1 "$tmp/errors")"
