-- slogate KV ledger: free what a request held (nothing if it holds nothing: released
-- already, expired, or never held). (kv_common.lua comes first.)
-- ARGV: id. Reply: {1 when it held something else 0, tokens, fixed, sequences, ratio,
-- freed tokens, freed sequences, ends}.

local t = totals()
local found = drop(t, ARGV[1])
if found then save(t) end
return reply(t, found and 1 or 0)
