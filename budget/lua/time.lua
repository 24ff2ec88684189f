-- slogate: the time every script runs at, and how numbers are written back. The first
-- prelude of every script (budget/lua/common.lua and spend_common.lua come after it, and
-- admission/kv/lua/kv_common.lua: one copy of this file for both packages).

-- ARGV[1] is the time: < 0 means the Redis server's TIME (production), else a test clock.
local function clock(arg)
  local now = tonumber(arg)
  if now < 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  end
  return now
end

local function num(x) return string.format('%.17g', x) end
