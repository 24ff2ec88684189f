-- slogate KV ledger: what the kv_*.lua scripts share. The fleet's ledger of one pool is
-- four keys with the pool's hash tag (one Redis Cluster slot): KEYS[1] totals (tokens,
-- fixed, sequences, ratio, ratio_at, and what releases gave back: freed_tokens,
-- freed_sequences, ends), KEYS[2] holds (id -> "tokens sequences fixed"), KEYS[3] each
-- hold's deadline (zset), KEYS[4] the replicas' blocked heads of line (kv_head.lua). The
-- arithmetic mirrors admission/kv/capacity.py (PoolView.expected and _over); one test suite
-- holds both. (time.lua, from budget/lua/, comes first.)

local function totals()
  local t = redis.call('HMGET', KEYS[1], 'tokens', 'fixed', 'sequences', 'ratio',
    'freed_tokens', 'freed_sequences', 'ends')
  return {
    tokens = tonumber(t[1]) or 0,
    fixed = tonumber(t[2]) or 0,
    sequences = tonumber(t[3]) or 0,
    ratio = tonumber(t[4]) or 1.0,
    freed_tokens = tonumber(t[5]) or 0,
    freed_sequences = tonumber(t[6]) or 0,
    ends = tonumber(t[7]) or 0,
  }
end

local function save(t)
  redis.call('HSET', KEYS[1], 'tokens', t.tokens, 'fixed', t.fixed, 'sequences', t.sequences,
    'freed_tokens', t.freed_tokens, 'freed_sequences', t.freed_sequences, 'ends', t.ends)
end

-- Take one hold out of the totals (never below zero: a count must not go negative even if
-- the totals were lost, say by a Redis restart without persistence).
local function drop(t, id)
  local held = redis.call('HGET', KEYS[2], id)
  if not held then return false end
  local tokens, sequences, fixed = string.match(held, '(%S+) (%S+) (%S+)')
  tokens, sequences = tonumber(tokens), tonumber(sequences)
  t.tokens = math.max(0, t.tokens - tokens)
  t.sequences = math.max(0, t.sequences - sequences)
  if fixed == '1' then t.fixed = math.max(0, t.fixed - tokens) end
  -- what the fleet's ends give back, counted for every replica's drain estimate
  t.freed_tokens = t.freed_tokens + tokens
  t.freed_sequences = t.freed_sequences + sequences
  t.ends = t.ends + 1
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  return true
end

local function add(t, id, tokens, sequences, fixed, deadline)
  t.tokens = t.tokens + tokens
  t.sequences = t.sequences + sequences
  if fixed == 1 then t.fixed = t.fixed + tokens end
  redis.call('HSET', KEYS[2], id, tokens .. ' ' .. sequences .. ' ' .. fixed)
  redis.call('ZADD', KEYS[3], num(deadline), id)
end

-- Free the holds past their deadline (a replica that died holding them), at most `limit`.
local function expire_late(t, now, limit)
  local late = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', num(now), 'LIMIT', 0, limit)
  for _, id in ipairs(late) do
    if not drop(t, id) then redis.call('ZREM', KEYS[3], id) end
  end
  return late
end

local function reply(t, first)
  return {first, t.tokens, t.fixed, t.sequences, num(t.ratio), t.freed_tokens,
    t.freed_sequences, t.ends}
end
