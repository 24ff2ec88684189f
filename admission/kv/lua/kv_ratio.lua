-- slogate KV ledger: the pool's footprint ratio, learned by every replica from the same
-- engines. Up at once (the safe side); down at most once per `min_gap_s`, so N replicas
-- that each learn a step down do not step it down N times. (kv_common.lua comes first.)
-- ARGV: now_s (< 0: Redis server time), ratio, min_gap_s. Reply: the ratio now stored.

local now = clock(ARGV[1])
local ratio, gap = tonumber(ARGV[2]), tonumber(ARGV[3])
local stored = redis.call('HMGET', KEYS[1], 'ratio', 'ratio_at')
local current, at = tonumber(stored[1]) or 1.0, tonumber(stored[2]) or -math.huge
if ratio > current or at + gap <= now then
  redis.call('HSET', KEYS[1], 'ratio', num(ratio), 'ratio_at', num(now))
  return num(ratio)
end
return num(current)
