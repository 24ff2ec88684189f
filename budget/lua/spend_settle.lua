-- slogate spend: settle. Mirrors budget/spend.py `settle`.
-- KEYS: per window, its hash then its expiry zset. ARGV: id, spent (< 0: refund it all).
-- Returns {found 0/1, used per window...}.

local id, actual = ARGV[1], tonumber(ARGV[2])
local n = #KEYS / 2
local found = 0
local reply = {0}
for i = 1, n do
  local hash, zset = KEYS[2 * i - 1], KEYS[2 * i]
  local amount = tonumber(redis.call('HGET', hash, 'r:' .. id))
  if amount then
    found = 1
    redis.call('HDEL', hash, 'r:' .. id)
    redis.call('ZREM', zset, id)
    redis.call('HINCRBYFLOAT', hash, 'held', num(-amount))
    if actual > 0 then redis.call('HINCRBYFLOAT', hash, 'spent', num(actual)) end
  end
  reply[#reply + 1] = num(used(hash))
end
reply[1] = found
return reply
