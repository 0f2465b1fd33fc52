-- Which shard owns a key: rendezvous (highest random weight) hashing over shards 0 .. N-1.
--
-- Every shard gets a weight for the key, the SHA-1 of "<shard>/<key>" (hex, so comparing strings
-- compares the hashes); the heaviest shard owns the key. Taking shards away only moves the keys
-- the removed shards owned: a key whose owner stays keeps winning among fewer shards. That is what
-- lets a scale-down drain only the removed shards, and lets each drain run on its own.
--
-- Runs inside Redis (EVAL), so the client, the drain and any application share this one
-- definition and need nothing but redis-cli. It reads and writes no data.
--
--   EVAL <this script> 0 N KEY [KEY ...]   ->  the owner ordinal of each KEY, in order
local n = tonumber(ARGV[1])
if n == nil or n < 1 then
  return redis.error_reply("placement: the first argument must be the number of shards (>= 1)")
end
local owners = {}
for i = 2, #ARGV do
  local key, best, owner = ARGV[i], nil, nil
  for shard = 0, n - 1 do
    local weight = redis.sha1hex(shard .. "/" .. key)
    if best == nil or weight > best then
      best, owner = weight, shard
    end
  end
  owners[#owners + 1] = owner
end
return owners
