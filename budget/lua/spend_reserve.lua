-- slogate spend: reserve. Mirrors budget/spend.py `reserve`.
-- KEYS: per window, its hash then its expiry zset (2 keys a window).
-- ARGV: now_s (< 0: server time), amount, id, ttl_s, then per window: limit, expire_at
-- (unix seconds: the keys live a day past the window's end).
-- Returns {admitted 0/1, index of the refusing window (0: none), used per window...}
-- (not admitted, no window: the request was settled unverified before this landed).

local now = clock(ARGV[1])
local amount, id, ttl = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local n = #KEYS / 2
local refused = 0
local refused_ends = -1
local settled = false
for i = 1, n do
  local hash, zset = KEYS[2 * i - 1], KEYS[2 * i]
  expire(hash, zset, now)
  -- Settled while its check went unanswered: landing now, it must hold nothing.
  if redis.call('HEXISTS', hash, 's:' .. id) == 1 then settled = true end
  local limit, ends = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  if used(hash) >= limit and ends > refused_ends then
    refused, refused_ends = i, ends
  end
end
if refused == 0 and not settled then
  for i = 1, n do
    local hash, zset = KEYS[2 * i - 1], KEYS[2 * i]
    redis.call('HSET', hash, 'r:' .. id, num(amount))
    redis.call('HINCRBYFLOAT', hash, 'held', num(amount))
    redis.call('ZADD', zset, num(now + ttl), id)
  end
end
local reply = {(refused == 0 and not settled) and 1 or 0, refused}
for i = 1, n do
  local hash, zset = KEYS[2 * i - 1], KEYS[2 * i]
  reply[#reply + 1] = num(used(hash))
  redis.call('EXPIREAT', hash, math.ceil(tonumber(ARGV[4 + 2 * i])))
  redis.call('EXPIREAT', zset, math.ceil(tonumber(ARGV[4 + 2 * i])))
end
return reply
