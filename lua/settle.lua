-- ratewatch: settle a request after its response, atomically: charge the
-- units it used beyond what its decision charged (forced, as bounded debt)
-- or give back what it did not use (only within the window charged).
-- src/algorithm/settle.rs performs the same operations in the same order;
-- tests/settle_parity.rs holds them together. Loaded after common.lua
-- only: the state layouts are read and written here as the algorithm
-- files do (see common.lua).
--
-- KEYS[i]         the key of limit i (one hash tag: one slot)
-- ARGV[1]         now in µs since epoch, or '' to use the server's TIME
-- ARGV[2]         charged_at: the time the decision was made (µs)
-- ARGV[3]         'c' to charge, 'r' to refund
-- ARGV[4]         units (integer)
-- ARGV[5+4(i-1)]  limit i: algorithm name, then p1, p2, p3 as for decide
--
-- Debt is bounded: a bucket no lower than -capacity, a window count at
-- most 2 × limit (and below 2^40, the record's field), a TAT at most
-- 2 × burst intervals ahead, a log at most 2 × limit entries. Returns
-- the number of limits written.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local charged_at = tonumber(ARGV[2])
local charge = ARGV[3] == 'c'
local units = tonumber(ARGV[4])
local MAX_COUNT = 1099511627775 -- 2^40 - 1: a count's field in a record

local function ceil_us(x)
  if x <= 0 then return 0 end
  return math.ceil(x)
end

local function set(key, value, ttl)
  local ms = math.ceil(ttl / 1000)
  if ms < 1 then ms = 1 end
  redis.call('SET', key, value, 'PX', string.format('%d', ms))
end

-- A count moved by the settle: a charge up to 2 × limit, a refund to 0.
local function counted(count, limit)
  if charge then
    return math.max(count, math.min(count + units, 2 * limit, MAX_COUNT))
  end
  return sat_sub(count, units)
end

local S = {}

function S.token_bucket(key, capacity, rate)
  local cap = capacity
  local per_us = rate / 1000000
  local stored, last
  local v = redis.pcall('GET', key)
  if type(v) == 'string' and #v == 20 then
    local t, l, was = struct.unpack('>dI7I5', v)
    stored, last = t, l
    if was ~= capacity then stored = math.max(t + (cap - was), 0) end
  elseif type(v) == 'string' and #v == 15 then
    stored, last = struct.unpack('>dI7', v)
  elseif not charge then
    return 0 -- a full bucket has nothing to take back
  else
    stored, last = cap, now
  end
  local held
  if now <= last then
    held = stored
  elseif now - last >= ceil_us((cap - stored) / per_us) then
    held = cap
  else
    held = math.min(cap, stored + (now - last) * per_us)
  end
  last = math.max(last, now)
  local left
  if charge then left = math.max(held - units, -cap) else left = math.min(held + units, cap) end
  set(key, struct.pack('>dI7I5', left, last, capacity), (last - now) + ceil_us((cap - left) / per_us))
  return 1
end

function S.fixed_window(key, limit, window)
  local start = now - fmod(now, window)
  local count, last = 0, now
  local v = redis.pcall('GET', key)
  if type(v) == 'string' and #v == 12 then
    local l, c = struct.unpack('>I7I5', v)
    local held = l - fmod(l, window)
    if held >= start then
      start, count, last = held, c, math.max(l, now)
    end
  end
  if not charge and (count == 0 or start ~= charged_at - fmod(charged_at, window)) then
    return 0
  end
  set(key, struct.pack('>I7I5', last, counted(count, limit)), start + window - now)
  return 1
end

function S.sliding_window(key, limit, window)
  local start = now - fmod(now, window)
  local curr, prev, last = 0, 0, now
  local v = redis.pcall('GET', key)
  local s, c, p, l
  if type(v) == 'string' then
    local n = #v
    if n == 18 then
      s, c, p, l = struct.unpack('>I7I2I2I7', v)
    elseif n == 24 then
      s, c, p, l = struct.unpack('>I7I5I5I7', v)
    elseif n == 11 then
      s, c, p = struct.unpack('>I7I2I2', v)
      l = s
    elseif n == 17 then
      s, c, p = struct.unpack('>I7I5I5', v)
      l = s
    end
  end
  if s then
    local at_count = l - fmod(l, window)
    local before = sat_sub(s, 1)
    local at_prev = before - fmod(before, window)
    start = math.max(start, at_count)
    local earlier = start - window
    if at_count == start then curr = c elseif at_count == earlier then prev = c end
    if at_prev == start then curr = curr + p elseif at_prev == earlier then prev = prev + p end
    last = math.max(l, now)
  end
  if not charge and (curr == 0 or start ~= charged_at - fmod(charged_at, window)) then
    return 0
  end
  curr = counted(curr, limit)
  local value
  if curr < 65536 and prev < 65536 then
    value = struct.pack('>I7I2I2I7', start, curr, prev, last)
  else
    value = struct.pack('>I7I5I5I7', start, curr, prev, last)
  end
  set(key, value, start + 2 * window - now)
  return 1
end

function S.sliding_log(key, limit, window)
  local horizon = sat_sub(now, window)
  local fmt = function(x) return format('%d', x) end
  if charge then
    local n = redis.pcall('ZCARD', key)
    if type(n) ~= 'number' then
      redis.call('DEL', key) -- another algorithm's string: a fresh log
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(horizon))
    n = redis.call('ZCARD', key)
    local add = math.min(units, sat_sub(2 * limit, n))
    local stamp = fmt(now)
    local i = n
    for _ = 1, add do
      local member = stamp .. ':' .. i
      while redis.call('ZSCORE', key, member) do
        i = i + 1
        member = stamp .. ':' .. i
      end
      redis.call('ZADD', key, stamp, member)
      i = i + 1
    end
    local newest = now
    local top = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
    if top[2] then newest = math.max(now, tonumber(top[2])) end
    local ms = math.ceil((newest + window - now) / 1000)
    if ms < 1 then ms = 1 end
    redis.call('PEXPIRE', key, fmt(ms))
    return 1
  end
  -- The entries the decision added carry its time; as many go as units.
  local at = fmt(charged_at)
  local members = redis.pcall('ZRANGEBYSCORE', key, at, at, 'LIMIT', 0, fmt(math.min(units, 2 * limit)))
  if type(members) ~= 'table' or #members == 0 then return 0 end
  redis.call('ZREM', key, unpack(members))
  return 1
end

function S.gcra(key, interval, burst)
  local v = redis.pcall('GET', key)
  local tat, was
  if type(v) == 'string' and #v == 12 then
    tat, was = struct.unpack('>I7I5', v)
  else
    tat = tonumber(v)
    was = interval
  end
  if tat then
    if was ~= interval and tat > now then
      tat = now + math.ceil((tat - now) * interval / was)
    end
    tat = math.max(tat, now)
  elseif charge then
    tat = now
  else
    return 0 -- nothing queued: nothing to take back
  end
  local new
  if charge then
    new = math.max(tat, math.min(tat + units * interval, now + 2 * burst * interval))
  else
    new = math.max(sat_sub(tat, units * interval), now)
  end
  set(key, struct.pack('>I7I5', new, interval), new - now)
  return 1
end
S.leaky_bucket = S.gcra

local written = 0
for i = 1, #KEYS do
  local base = 5 + 4 * (i - 1)
  local f = S[ARGV[base]]
  if not f then
    return redis.error_reply('ratewatch: unknown algorithm ' .. tostring(ARGV[base]))
  end
  written = written + f(KEYS[i], tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]))
end
return written
