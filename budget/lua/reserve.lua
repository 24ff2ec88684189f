-- slogate budget: reserve. Mirrors budget/ledger.py `reserve` (one test suite holds both).
-- KEYS[1] state hash (levels requests/tokens/hour + updated), KEYS[2] reservations hash
-- (id -> "weighted raw expires"), KEYS[3] reservation expiry zset. All three share the
-- key's hash tag, so this runs on one Redis Cluster slot.
-- ARGV: now_s (< 0: Redis server time), requests_per_minute, tokens_per_minute,
-- tokens_per_hour, concurrent_requests (each < 0: unlimited), weighted, raw, id, ttl_s,
-- key_ttl_s.
-- (common.lua comes first: clock, num, ORDER, WINDOWS, refilled, save_levels.)

local now = clock(ARGV[1])
local caps = {requests = tonumber(ARGV[2]), tokens = tonumber(ARGV[3]), hour = tonumber(ARGV[4])}
local concurrent = tonumber(ARGV[5])
local amount = {requests = 1, tokens = tonumber(ARGV[6]), hour = tonumber(ARGV[7])}
local id, ttl, key_ttl = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])

-- expire reservations whose settlement never came: the slot frees, the charge stays spent
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', num(now))
if #expired > 0 then
  redis.call('HDEL', KEYS[2], unpack(expired))
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', num(now))
end

local levels, now_updated = refilled(KEYS[1], caps, now)

local function save()
  save_levels(KEYS[1], levels, now_updated)
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], key_ttl) end
end

local function verdict(admitted, reason, retry)
  local rem_req, rem_tok, reset = '', '', 0
  if levels.requests then rem_req = tostring(math.floor(levels.requests)) end
  if levels.tokens then
    rem_tok = tostring(math.floor(levels.tokens))
    reset = (caps.tokens - levels.tokens) * 60 / caps.tokens
  end
  local retry_text = ''
  if retry then retry_text = num(retry) end
  save()
  return {admitted, reason, retry_text, rem_req, rem_tok, num(reset)}
end

if concurrent >= 0 and redis.call('HLEN', KEYS[2]) >= concurrent then
  return verdict(0, 'concurrency', 1)
end
for _, b in ipairs(ORDER) do
  if levels[b] then
    local need = amount[b]
    if need > caps[b] then return verdict(0, b, nil) end
    if need > levels[b] then
      local wait = (need - levels[b]) * WINDOWS[b] / caps[b]
      for _, o in ipairs(ORDER) do
        if levels[o] then
          local deficit = amount[o] - levels[o]
          if deficit > 0 then wait = math.max(wait, deficit * WINDOWS[o] / caps[o]) end
        end
      end
      return verdict(0, b, wait)
    end
  end
end
for _, b in ipairs(ORDER) do
  if levels[b] then levels[b] = levels[b] - amount[b] end
end
redis.call('HSET', KEYS[2], id, num(amount.tokens) .. ' ' .. num(amount.hour) .. ' ' .. num(now + ttl))
redis.call('ZADD', KEYS[3], num(now + ttl), id)
return verdict(1, 'ok', nil)
