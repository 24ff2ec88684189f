-- slogate KV ledger: hold a request's footprint in its pool if the tier's share leaves room.
-- Mirrors admission/kv/capacity.py KvLedger.admit. (kv_common.lua comes first.)
-- ARGV: now_s (< 0: Redis server time), id, tokens, sequences, fixed (0/1), ttl_s,
-- capacity_tokens (< 0: none), capacity_sequences (< 0: none), share, owner ("" : no
-- heads of line are left room for), rank (the tier's place: 0 critical).
-- KEYS[4]: the replicas' blocked heads of line (owner -> "id rank expected sequences since
-- until"), mirroring admission/kv/capacity.py HeadBoard.
-- Reply: {limit ("" when held), tokens, fixed, sequences, ratio, freed tokens, freed
-- sequences, ends} after the decision.

local now = clock(ARGV[1])
local id = ARGV[2]
local tokens, sequences, fixed = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl, cap_kv, cap_seqs = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local share = tonumber(ARGV[9])
local owner, rank = ARGV[10], tonumber(ARGV[11])

local t = totals()
expire_late(t, now, 100)
-- A retried hold (its first reply was lost) is the same hold, not a second one.
if redis.call('HEXISTS', KEYS[2], id) == 1 then
  save(t)
  return reply(t, '')
end
-- What the other replicas' heads of line ahead of this request need stays free.
local back_tokens, back_sequences = 0, 0
if owner ~= '' then
  local raw = redis.call('HGETALL', KEYS[4])
  local heads = {}
  for i = 1, #raw, 2 do
    local hid, hrank, expected, hseqs, since, untils =
      string.match(raw[i + 1], '(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)')
    if tonumber(untils) <= now then
      redis.call('HDEL', KEYS[4], raw[i])
    else
      heads[raw[i]] = {id = hid, rank = tonumber(hrank), expected = tonumber(expected),
        sequences = tonumber(hseqs), since = tonumber(since)}
    end
  end
  local mine = heads[owner]
  if mine and mine.id ~= id then mine = nil end
  for name, head in pairs(heads) do
    if name ~= owner then
      if head.rank < rank or (head.rank == rank and (mine == nil or head.since < mine.since)) then
        back_tokens = back_tokens + head.expected
        back_sequences = back_sequences + head.sequences
      end
    end
  end
end
local total = t.tokens + tokens
local fixed_total = t.fixed + (fixed == 1 and tokens or 0)
local expected = (total - fixed_total) * t.ratio + fixed_total * math.max(1.0, t.ratio)
local limit = ''
if cap_kv >= 0 and expected + back_tokens > cap_kv * share then
  limit = 'kv_cache'
elseif cap_seqs >= 0 and t.sequences + sequences + back_sequences > cap_seqs * share then
  limit = 'sequences'
end
if limit == '' then
  add(t, id, tokens, sequences, fixed, now + ttl)
  if owner ~= '' then
    local head = redis.call('HGET', KEYS[4], owner)
    if head and string.match(head, '^(%S+)') == id then redis.call('HDEL', KEYS[4], owner) end
  end
end
save(t)
return reply(t, limit)
