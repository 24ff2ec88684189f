-- slogate budget: what reserve.lua and settle.lua share. The Redis store sends time.lua and
-- this prelude in front of each script (one script per operation, one EVALSHA per call).

local ORDER = {'requests', 'tokens', 'hour'}
local WINDOWS = {requests = 60, tokens = 60, hour = 3600}

-- Bucket levels refilled to `now` (capped at capacity; unlimited buckets absent), and the
-- `updated` time to store: like budget/ledger.py `_refill`.
local function refilled(state_key, caps, now)
  local st = redis.call('HMGET', state_key, 'requests', 'tokens', 'hour', 'updated')
  local updated = tonumber(st[4])
  local elapsed = 0
  if updated then elapsed = math.max(0, now - updated) end
  local levels = {}
  for i, b in ipairs(ORDER) do
    if caps[b] >= 0 then
      local level = tonumber(st[i]) or caps[b]
      levels[b] = math.min(caps[b], level + elapsed * caps[b] / WINDOWS[b])
    end
  end
  local now_updated = now
  if updated and updated > now then now_updated = updated end
  return levels, now_updated
end

-- One HSET for every level (each redis.call costs the script a few µs on the server, on
-- every request's reserve and settle); an HDEL only where a bucket is unlimited.
local function save_levels(state_key, levels, now_updated)
  local fields = {'updated', num(now_updated)}
  local unlimited = {}
  for _, b in ipairs(ORDER) do
    if levels[b] then
      fields[#fields + 1] = b
      fields[#fields + 1] = num(levels[b])
    else
      unlimited[#unlimited + 1] = b
    end
  end
  redis.call('HSET', state_key, unpack(fields))
  if #unlimited > 0 then redis.call('HDEL', state_key, unpack(unlimited)) end
end
