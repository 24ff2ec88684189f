-- slogate spend: settle a request whose reservation is unknown (its check went unanswered).
-- Mirrors budget/spend.py `settle_unverified`.
-- KEYS: per window, its hash then its expiry zset. ARGV: now_s (< 0: server time), id,
-- spent (< 0: nothing), ttl_s (how long the marker stays), then per window its expire_at
-- (unix seconds: the keys live a day past the window's end, as spend_reserve.lua sets).
-- Returns {changed 0/1 (0: settled already), used per window...}.

local now = clock(ARGV[1])
local id, actual, ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local n = #KEYS / 2
local settled = false
for i = 1, n do
  local hash, zset = KEYS[2 * i - 1], KEYS[2 * i]
  expire(hash, zset, now)
  if redis.call('HEXISTS', hash, 's:' .. id) == 1 then settled = true end
end
local reply = {settled and 0 or 1}
for i = 1, n do
  local hash, zset = KEYS[2 * i - 1], KEYS[2 * i]
  if not settled then
    local amount = tonumber(redis.call('HGET', hash, 'r:' .. id))
    if amount then
      redis.call('HDEL', hash, 'r:' .. id)
      redis.call('HINCRBYFLOAT', hash, 'held', num(-amount))
    end
    if actual > 0 then redis.call('HINCRBYFLOAT', hash, 'spent', num(actual)) end
    redis.call('HSET', hash, 's:' .. id, '1')
    redis.call('ZADD', zset, num(now + ttl), id)
    redis.call('EXPIREAT', hash, math.ceil(tonumber(ARGV[4 + i])))
    redis.call('EXPIREAT', zset, math.ceil(tonumber(ARGV[4 + i])))
  end
  reply[#reply + 1] = num(used(hash))
end
return reply
