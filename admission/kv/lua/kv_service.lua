-- slogate waiting room: every tenant's attained service, the fleet's, decaying with a
-- half-life (admission.waiting_room.AttainedService). (kv_common.lua comes first.)
-- KEYS[1]: the fleet's hash, tenant -> "value at". ARGV: now_s (< 0: Redis server time),
-- half_life_s, then per addition: tenant, amount, age_s (how long ago it was attained).
-- Reply: {tenant, value now, ...} for every tenant whose value is 1 or more; the others are
-- dropped (decayed to nothing).

local now = clock(ARGV[1])
local half_life = tonumber(ARGV[2])
local function decayed(value, since, at)
  return value * 0.5 ^ (math.max(0, at - since) / half_life)
end
for i = 3, #ARGV, 3 do
  local tenant, amount, at = ARGV[i], tonumber(ARGV[i + 1]), now - tonumber(ARGV[i + 2])
  local held = redis.call('HGET', KEYS[1], tenant)
  local value, since = 0, at
  if held then
    local v, s = string.match(held, '(%S+) (%S+)')
    value, since = tonumber(v), tonumber(s)
  end
  local grown = math.max(0, decayed(value, since, at) + amount)
  redis.call('HSET', KEYS[1], tenant, num(grown) .. ' ' .. num(math.max(at, since)))
end
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local v, s = string.match(all[i + 1], '(%S+) (%S+)')
  local value = decayed(tonumber(v), tonumber(s), now)
  if value < 1 then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = num(value)
  end
end
return out
