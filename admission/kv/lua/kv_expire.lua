-- slogate KV ledger: free every hold past its deadline. (kv_common.lua comes first.)
-- ARGV: now_s (< 0: Redis server time), limit. Reply: {n, tokens, fixed, sequences, ratio,
-- freed tokens, freed sequences, ends, id1, ..., idn}: the ids freed (any replica's).

local now = clock(ARGV[1])
local t = totals()
local late = expire_late(t, now, tonumber(ARGV[2]))
save(t)
local out = reply(t, #late)
for _, id in ipairs(late) do out[#out + 1] = id end
return out
