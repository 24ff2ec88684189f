-- slogate spend: what spend_reserve.lua and spend_settle.lua share (after time.lua).
-- Mirrors budget/spend.py. A window is a hash (`spent`, `held`: the sum of its
-- reservations, `r:<id>` = one reservation's amount, and `s:<id>` = a request settled
-- unverified, whose reservation must hold nothing if it lands later) and a zset of the
-- expiries of both; all of one tenant's windows share a hash tag, one cluster slot.

local function used(hash)
  local v = redis.call('HMGET', hash, 'spent', 'held')
  return (tonumber(v[1]) or 0) + math.max(0, tonumber(v[2]) or 0)
end

-- Reservations past their expiry: their charge stays spent (like WindowState.expire).
local function expire(hash, zset, now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', zset, '-inf', num(now))) do
    local amount = tonumber(redis.call('HGET', hash, 'r:' .. id))
    if amount then
      redis.call('HINCRBYFLOAT', hash, 'spent', num(amount))
      redis.call('HINCRBYFLOAT', hash, 'held', num(-amount))
      redis.call('HDEL', hash, 'r:' .. id)
    end
    redis.call('HDEL', hash, 's:' .. id)
    redis.call('ZREM', zset, id)
  end
end
