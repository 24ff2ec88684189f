-- slogate KV ledger: take in holds a replica made on its local share while Redis was away,
-- without a capacity check (they run already): the fleet's count is whole again.
-- (kv_common.lua comes first.)
-- ARGV: now_s (< 0: Redis server time), then per hold: id, tokens, sequences, fixed, ttl_s.
-- Reply: {n adopted, tokens, fixed, sequences, ratio, freed tokens, freed sequences, ends}.

local now = clock(ARGV[1])
local t = totals()
local adopted = 0
for i = 2, #ARGV, 5 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[2], id) == 0 then
    add(t, id, tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]),
      now + tonumber(ARGV[i + 4]))
    adopted = adopted + 1
  end
end
save(t)
return reply(t, adopted)
