-- slogate budget: settle. Mirrors budget/ledger.py `settle`.
-- KEYS[1] state hash, KEYS[2] reservations hash, KEYS[3] expiry zset, KEYS[4] usage hash
-- (10-second slot start -> raw tokens); one hash tag, one cluster slot.
-- ARGV: now_s (< 0: server time), requests_per_minute, tokens_per_minute, tokens_per_hour
-- (< 0: unlimited), id, used weighted (< 0: refund everything), used raw, key_ttl_s.
-- (common.lua comes first: clock, num, ORDER, WINDOWS, refilled, save_levels.)

local now = clock(ARGV[1])
local caps = {requests = tonumber(ARGV[2]), tokens = tonumber(ARGV[3]), hour = tonumber(ARGV[4])}
local id = ARGV[5]
local used_weighted, used_raw = tonumber(ARGV[6]), tonumber(ARGV[7])
local key_ttl = tonumber(ARGV[8])

local held = redis.call('HGET', KEYS[2], id)
if not held then return 0 end
redis.call('HDEL', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
local reserved_weighted, reserved_raw = string.match(held, '^(%S+) (%S+)')
local reserved = {tokens = tonumber(reserved_weighted), hour = tonumber(reserved_raw)}
local refund = used_weighted < 0
local used = {tokens = math.max(used_weighted, 0), hour = math.max(used_raw, 0)}
if refund then used = {tokens = 0, hour = 0} end

local levels, now_updated = refilled(KEYS[1], caps, now)

for _, b in ipairs({'tokens', 'hour'}) do
  if levels[b] then
    local delta = reserved[b] - used[b]
    levels[b] = math.min(caps[b], math.max(0, levels[b] + delta))
  end
end
if refund then
  if levels.requests then levels.requests = math.min(caps.requests, levels.requests + 1) end
elseif used.hour > 0 then
  local slot = math.floor(now / 10) * 10
  -- Slots older than the hour go when a new slot opens (once per 10 s per key), not at
  -- every settle: a busy key's hash holds up to 360 slots to scan.
  local opens = redis.call('HEXISTS', KEYS[4], tostring(slot)) == 0
  redis.call('HINCRBYFLOAT', KEYS[4], tostring(slot), num(used.hour))
  if opens then
    local oldest = slot - 3600
    for _, s in ipairs(redis.call('HKEYS', KEYS[4])) do
      if tonumber(s) <= oldest then redis.call('HDEL', KEYS[4], s) end
    end
  end
end
save_levels(KEYS[1], levels, now_updated)
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], key_ttl) end
return 1
