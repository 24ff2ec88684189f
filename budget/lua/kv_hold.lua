-- slogate KV ledger: hold a request's footprint in its pool if the tier's share leaves room.
-- Mirrors breaker/kv_admission.py KvLedger.admit. (kv_common.lua comes first.)
-- ARGV: now_s (< 0: Redis server time), id, tokens, sequences, fixed (0/1), ttl_s,
-- capacity_tokens (< 0: none), capacity_sequences (< 0: none), share.
-- Reply: {limit ("" when held), tokens, fixed, sequences, ratio} after the decision.

local now = clock(ARGV[1])
local id = ARGV[2]
local tokens, sequences, fixed = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl, cap_kv, cap_seqs = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local share = tonumber(ARGV[9])

local t = totals()
expire_late(t, now, 100)
-- A retried hold (its first reply was lost) is the same hold, not a second one.
if redis.call('HEXISTS', KEYS[2], id) == 1 then
  save(t)
  return reply(t, '')
end
local total = t.tokens + tokens
local fixed_total = t.fixed + (fixed == 1 and tokens or 0)
local expected = (total - fixed_total) * t.ratio + fixed_total * math.max(1.0, t.ratio)
local limit = ''
if cap_kv >= 0 and expected > cap_kv * share then
  limit = 'kv_cache'
elseif cap_seqs >= 0 and t.sequences + sequences > cap_seqs * share then
  limit = 'sequences'
end
if limit == '' then add(t, id, tokens, sequences, fixed, now + ttl) end
save(t)
return reply(t, limit)
