-- slogate global ledger: one region's report in, its lease out, atomically. The same rule as
-- budget/leases.py `apply_report` (read that first: the reasons are there); time.lua comes
-- before this file.
--
-- KEYS[1]: the regions hash (region -> {seq, pools, expires_s});
-- KEYS[1 + i]: the hash of the report's i-th tenant (region -> its RegionTenant).
-- ARGV: now (time.lua), lease_s, fallback_for_s, min_share, fallback_share (< 0: none),
--       demand_decay, ttl_s, the report, report_interval_s, idle_demand. Returns the lease. Every value is MessagePack
--       (cmsgpack): doubles cross exactly (budget/global_ledger.py says why).

local now = clock(ARGV[1])
local lease_s = tonumber(ARGV[2])
local fallback_for_s = tonumber(ARGV[3])
local min_share = tonumber(ARGV[4])
local fallback_share = tonumber(ARGV[5])
local decay = tonumber(ARGV[6])
local ttl_s = tonumber(ARGV[7])
local report = cmsgpack.unpack(ARGV[8])
local interval_s = tonumber(ARGV[9])
local idle_demand = tonumber(ARGV[10])
local region = report.region
local EPSILON = 1e-9

local function hold(rec)
  if now < rec.expires_s then return rec.held end
  if now < rec.fallback_until_s then return rec.fallback end
  return 0
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

local function load(key)
  local records = {}
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do records[flat[i]] = cmsgpack.unpack(flat[i + 1]) end
  return records
end

local function peers(entries)
  local out = {}
  for _, name in ipairs(sorted_keys(entries)) do
    if name ~= region and entries[name].expires_s > now then out[name] = entries[name].pools end
  end
  return out
end

local function tenant_lease(records, share, ceilings)
  local usage, spend = 0, {}
  for _, name in ipairs(sorted_keys(records)) do
    local rec = records[name]
    usage = usage + rec.usage
    for _, w in ipairs(sorted_keys(rec.spend)) do spend[w] = (spend[w] or 0) + rec.spend[w] end
  end
  return {share = share, global_usage = usage, global_spend = spend, spend_ceiling = ceilings}
end

-- The region's smoothed demand as of now, decaying once grace_s has passed since its report
-- (records written before demand_at existed: as they are).
local function decayed(rec, grace_s)
  return rec.demand * decay ^ (math.max(0, now - (rec.demand_at or now) - grace_s) / interval_s)
end

local function target_share(records)
  local live, total = 0, 0
  for _, name in ipairs(sorted_keys(records)) do
    local rec = records[name]
    if rec.expires_s > now then live = live + 1; total = total + decayed(rec, interval_s) end
  end
  if total < idle_demand or live * min_share >= 1 then return 1 / live end
  return min_share + (1 - live * min_share) * decayed(records[region], interval_s) / total
end

-- Returns the regions whose records it changed (they are written back with the reporter's).
local function drop_ended_windows(records)
  local changed = {}
  local current = {}
  for _, rec in pairs(records) do
    if rec.expires_s > now then
      for _, w in ipairs(rec.windows) do current[w] = true end
    end
  end
  for name, rec in pairs(records) do
    for w in pairs(rec.spend) do
      if not current[w] then rec.spend[w] = nil; changed[name] = true end
    end
    for w in pairs(rec.ceiling) do
      if not current[w] then rec.ceiling[w] = nil; changed[name] = true end
    end
  end
  return changed
end

local function grant_ceilings(records, line, grant)
  local own = records[region]
  local granted, held = {}, {}
  local limits = line.spend_limit or {}
  local applied_ceilings = line.spend_applied or {}
  for _, w in ipairs(sorted_keys(limits)) do
    local limit = limits[w]
    local own_spent = own.spend[w] or 0
    local global_spent, others = 0, 0
    for _, name in ipairs(sorted_keys(records)) do
      local rec = records[name]
      global_spent = global_spent + (rec.spend[w] or 0)
      if name ~= region then
        others = others + math.max(rec.spend[w] or 0, rec.ceiling[w] or 0)
      end
    end
    local target = own_spent + grant * math.max(0, limit - global_spent)
    local ceiling = math.max(own_spent, math.min(target, limit - others))
    granted[w] = ceiling
    local applied = math.min(applied_ceilings[w] or 0, own.ceiling[w] or 0)
    held[w] = math.max(applied, ceiling)
  end
  own.ceiling = held
  return granted
end

local entries = load(KEYS[1])
local entry = entries[region]
local tenants = {}

if entry and report.seq <= entry.seq then
  -- Not newer than the stored report: what is stored, granting nothing (lease_s 0).
  for i, line in ipairs(report.tenants) do
    local records = load(KEYS[1 + i])
    if records[region] then
      tenants[line.tenant] = tenant_lease(records, records[region].granted, {})
    end
  end
  return cmsgpack.pack({region = region, seq = entry.seq, lease_s = 0, tenants = tenants,
    peers = peers(entries), rebalanced = 0})
end

entries[region] = {seq = report.seq, pools = report.pools or {}, expires_s = now + lease_s}
redis.call('HSET', KEYS[1], region, cmsgpack.pack(entries[region]))
redis.call('EXPIRE', KEYS[1], ttl_s)

local rebalanced = 0
for i, line in ipairs(report.tenants) do
  local key = KEYS[1 + i]
  local records = load(key)
  local own = records[region]
  if not own then
    own = {demand = 0, demand_at = now, usage = 0, spend = {}, windows = {}, ceiling = {}, held = 0, granted = 0,
      fallback = 0, expires_s = 0, fallback_until_s = 0}
    records[region] = own
  end
  local before = hold(own)
  own.demand = math.max(math.max(0, line.demand), decayed(own, 0))
  own.demand_at = now
  own.usage = line.usage
  local windows = {}
  for _, w in ipairs(sorted_keys(line.spend)) do own.spend[w] = line.spend[w]; windows[w] = true end
  for w in pairs(line.spend_limit or {}) do windows[w] = true end
  own.windows = sorted_keys(windows)
  own.expires_s = now + lease_s
  own.fallback_until_s = own.expires_s + fallback_for_s
  local others = 0
  for _, name in ipairs(sorted_keys(records)) do
    if name ~= region then others = others + hold(records[name]) end
  end
  local grant = math.max(0, math.min(target_share(records), 1 - others))
  if math.abs(grant - own.granted) > EPSILON then rebalanced = rebalanced + 1 end
  own.granted = grant
  own.held = math.max(math.min(math.max(0, line.applied), before), grant)
  if fallback_share < 0 then own.fallback = own.held
  else own.fallback = math.min(fallback_share, own.held) end
  local changed = drop_ended_windows(records)
  changed[region] = true
  local ceilings = grant_ceilings(records, line, grant)
  tenants[line.tenant] = tenant_lease(records, grant, ceilings)
  local flat = {}
  for _, name in ipairs(sorted_keys(changed)) do
    flat[#flat + 1] = name
    flat[#flat + 1] = cmsgpack.pack(records[name])
  end
  redis.call('HSET', key, unpack(flat))
  redis.call('EXPIRE', key, ttl_s)
end

return cmsgpack.pack({region = region, seq = report.seq, lease_s = lease_s, tenants = tenants,
  peers = peers(entries), rebalanced = rebalanced})
