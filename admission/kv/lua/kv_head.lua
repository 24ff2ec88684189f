-- slogate KV ledger: a replica's blocked head of line in the pool, for the others to leave
-- room for (kv_hold.lua), or none. (kv_common.lua comes first.)
-- ARGV: now_s (< 0: Redis server time), owner, id ("": no head any more), rank, expected
-- tokens, sequences, ttl_s. A head that stays the same keeps the time it became one.

local now = clock(ARGV[1])
local owner, id = ARGV[2], ARGV[3]
if id == '' then
  redis.call('HDEL', KEYS[4], owner)
  return 0
end
local since = now
local known = redis.call('HGET', KEYS[4], owner)
if known then
  local kid, _, _, _, ksince = string.match(known, '(%S+) (%S+) (%S+) (%S+) (%S+)')
  if kid == id then since = tonumber(ksince) end
end
redis.call('HSET', KEYS[4], owner, table.concat(
  {id, ARGV[4], ARGV[5], ARGV[6], num(since), num(now + tonumber(ARGV[7]))}, ' '))
return 1
