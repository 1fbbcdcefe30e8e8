-- ratewatch: sliding window counter (src/algorithm/sliding_window.rs, same
-- operations in the same order).
--
-- KEYS[i]   a string: current window start (µs), units in it, units in the
--           previous window, when the latest unit was admitted (µs); 18
--           bytes (struct '>I7I2I2I7') while both counts are below 65536,
--           else 24 bytes ('>I7I5I5I7'); see common.lua
-- ARGV      p1 = limit (units per window, integer)
--           p2 = window length (µs, integer)
--           p3 = unused
-- now       µs since epoch; cost = units requested (0 peeks); decide gets
--           p1..p3 as ARGV strings, refund as numbers
-- decide    returns (common.lua): allowed, remaining (units, float), reset_us,
--           retry_us, ttl_us = until the next window ends
--           (each stored count moves to the window of the current length
--           that holds the latest time its units can have been admitted)
-- refund    decrements count by `cost` if the window is still the same

if ALG.sliding_window then -- defined only for calls that name it (common.lua)
-- The stored window start, count, previous count and latest admission, or
-- nil; the layouts before `last` read as last = start.
local function sw_read(key)
  local stored = redis.pcall('GET', key)
  if stored then
    local n = #stored
    if n == 18 then return struct.unpack('>I7I2I2I7', stored) end
    if n == 24 then return struct.unpack('>I7I5I5I7', stored) end
    local s, c, p
    if n == 11 then
      s, c, p = struct.unpack('>I7I2I2', stored)
    elseif n == 17 then
      s, c, p = struct.unpack('>I7I5I5', stored)
    end
    if s then return s, c, p, s end
  end
end

local function sw_pack(start, count, prev, last)
  if count < 65536 and prev < 65536 then
    return struct.pack('>I7I2I2I7', start, count, prev, last)
  end
  return struct.pack('>I7I5I5I7', start, count, prev, last)
end

local function sw_estimate(prev, curr, window, elapsed)
  return prev * ((window - elapsed) / window) + curr
end

-- The earliest wait after which `estimate + cost <= limit`: a closed form,
-- then nudged past any floating-point rounding.
local function sw_retry_after(limit, window, start, prev, curr, now, cost)
  local function fits(p, c, e)
    return sw_estimate(p, c, window, e) + cost <= limit
  end
  local function first_fit(p, c, not_before)
    if c + cost > limit then return nil end
    local slack = limit - cost - c
    local e
    if p == 0 then
      e = 0
    else
      e = window - slack * window / p
    end
    e = math.max(math.ceil(math.max(e, 0)), not_before)
    for _ = 1, 8 do
      if e >= window then return nil end
      if fits(p, c, e) then return e end
      e = e + 1
    end
    return nil
  end
  local at
  local e = first_fit(prev, curr, sat_sub(now, start))
  if e then
    at = start + e
  else
    -- In the next window this window's count is the weighted one; at the
    -- start of the window after that, nothing is counted at all.
    e = first_fit(curr, 0, 0)
    if e then
      at = start + window + e
    else
      at = start + 2 * window
    end
  end
  return math.max(at - now, 1)
end

local function sw_decide(key, limit, window, _, now, cost)
  limit, window = tonumber(limit), tonumber(window)
  local start = now - fmod(now, window)
  local curr, prev, last = 0, 0, now
  local s, c, p, l = sw_read(key)
  if s then
    -- Where each count lands in windows of the current length.
    local at_count = l - fmod(l, window)
    local before = sat_sub(s, 1)
    local at_prev = before - fmod(before, window)
    -- A stored window later than `now` (the clock stepped back) stays
    -- current: time never runs a window backwards.
    start = math.max(start, at_count)
    local earlier = start - window
    if at_count == start then curr = c elseif at_count == earlier then prev = c end
    if at_prev == start then curr = curr + p elseif at_prev == earlier then prev = prev + p end
    last = math.max(l, now)
  end
  -- Before a later stored window starts, its previous one weighs fully.
  local elapsed = sat_sub(now, start)
  local est = sw_estimate(prev, curr, window, elapsed)
  local limit_f = limit
  if est + cost <= limit_f then
    curr = curr + cost
    local reset
    if curr > 0 then
      reset = start + 2 * window - now
    elseif prev > 0 then
      reset = start + window - now
    else
      reset = 0
    end
    return true, limit_f - (est + cost), reset, 0, start + 2 * window - now,
           sw_pack(start, curr, prev, last), 2, start
  end
  local reset
  if curr > 0 then
    reset = start + 2 * window - now
  else
    reset = start + window - now
  end
  return false, math.max(limit_f - est, 0), reset,
         sw_retry_after(limit, window, start, prev, curr, now, cost), start + 2 * window - now
end

ALG.sliding_window = sw_decide

if ENTRY == 'refund' then
function REFUND.sliding_window(key, _, _, _, cost, start)
  local s, c, p, l = sw_read(key)
  if s and s == start then
    redis.call('SET', key, sw_pack(s, sat_sub(c, cost), p, l), 'KEEPTTL')
  end
end
end -- if ENTRY == 'refund'
end -- if ALG.sliding_window
