#!/bin/sh
# The example's client: keys on the shards of the Redis StatefulSet, each key on the shard that owns
# it among N shards (placement.lua, rendezvous hashing). Run it where the shards resolve by name
# (any pod of the namespace, e.g. `kubectl exec -i redis-0 -- sh /scripts/client.sh ...`).
#
#   client.sh put N   < "KEY VALUE" lines   writes every key to its owner; fails unless each write is OK
#   client.sh get N   < "KEY" lines         prints "KEY VALUE" for every key, read from its owner
#                                           (VALUE empty if the owner does not have it)
#   client.sh count N                       prints "SHARD KEYS" for each of the N shards
#
# Keys and values are words (no blanks): a limit of this shell client, not of Redis.
set -eu
# shellcheck source=shard.sh
. "$(dirname "$0")/shard.sh"

cmd=${1:-} n=${2:-}
case "$n" in '' | *[!0-9]*) echo "usage: $0 put|get|count N" >&2; exit 2 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case "$cmd" in
put)
  split_by_owner "$n" "$(host_of 0)" "$tmp"
  for f in "$tmp"/[0-9]*; do
    [ -e "$f" ] || continue
    o=${f##*/}
    # --pipe: all the writes at once, then the count of replies and errors.
    sed 's/^/SET /' "$f" | redis-cli -h "$(host_of "$o")" -p "$REDIS_PORT" --pipe >"$tmp/replies" 2>&1 || true
    grep -qx "errors: 0, replies: $(wc -l <"$f")" "$tmp/replies" ||
      { echo "shard $o, $(wc -l <"$f") writes: $(tr '\n' ' ' <"$tmp/replies")" >&2; exit 1; }
  done
  ;;
get)
  split_by_owner "$n" "$(host_of 0)" "$tmp"
  for f in "$tmp"/[0-9]*; do
    [ -e "$f" ] || continue
    o=${f##*/}
    sed 's/^/GET /' "$f" | redis-cli -h "$(host_of "$o")" -p "$REDIS_PORT" >"$tmp/values"
    [ "$(wc -l <"$tmp/values")" -eq "$(wc -l <"$f")" ] || { echo "shard $o: $(wc -l <"$tmp/values") replies to $(wc -l <"$f") reads" >&2; exit 1; }
    paste -d' ' "$f" "$tmp/values"
  done
  ;;
count)
  i=0
  while [ "$i" -lt "$n" ]; do
    echo "$i $(redis-cli -h "$(host_of "$i")" -p "$REDIS_PORT" DBSIZE)"
    i=$((i + 1))
  done
  ;;
*) echo "usage: $0 put|get|count N" >&2; exit 2 ;;
esac
