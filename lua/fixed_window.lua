-- ratewatch: fixed window (src/algorithm/fixed_window.rs, same operations
-- in the same order).
--
-- KEYS[i]   a string of 12 bytes, struct '>I7I5': when the latest unit was
--           admitted (µs), units admitted in its window; the window is the
--           one of the current length that holds that time (see common.lua)
-- ARGV      p1 = limit (units per window, integer)
--           p2 = window length (µs, integer)
--           p3 = unused
-- now       µs since epoch; cost = units requested (0 peeks); decide gets
--           p1..p3 as ARGV strings, refund as numbers
-- decide    returns (common.lua): allowed, remaining (units), reset_us,
--           retry_us, ttl_us = until the window ends
--           (a stored window later than `now` stays current; the count
--           belongs to the window of the current length that holds `last`)
-- refund    decrements count by `cost` if the window is still the same

if ALG.fixed_window then -- defined only for calls that name it (common.lua)
local FW_LAYOUT, FW_BYTES = '>I7I5', 12

-- The latest admission and the count, or nil. (The layout before stored
-- the window start there, which reads the same under an unchanged window.)
local function fw_read(key)
  local stored = redis.pcall('GET', key)
  if stored and #stored == FW_BYTES then
    return struct.unpack(FW_LAYOUT, stored)
  end
end

-- The count belongs to the window of the current length that holds the
-- latest admission. A stored window that starts after `now` (the clock
-- stepped back) is still the current one, with its count: time never runs
-- a window backwards.
local function fw_decide(key, limit, window, _, now, cost)
  limit, window = tonumber(limit), tonumber(window)
  local start = now - fmod(now, window)
  local count, last = 0, now
  local l, c = fw_read(key)
  if l then
    local held = l - fmod(l, window)
    if held >= start then
      start, count, last = held, c, math.max(l, now)
    end
  end
  local reset = start + window - now
  if count + cost <= limit then
    return true, limit - count - cost, reset, 0, reset,
           struct.pack(FW_LAYOUT, last, count + cost), 2, start
  end
  return false, sat_sub(limit, count), reset, reset, reset
end

ALG.fixed_window = fw_decide

if ENTRY == 'refund' then
function REFUND.fixed_window(key, _, window, _, cost, start)
  local l, c = fw_read(key)
  if l and l - fmod(l, window) == start then
    redis.call('SET', key, struct.pack(FW_LAYOUT, l, sat_sub(c, cost)), 'KEEPTTL')
  end
end
end -- if ENTRY == 'refund'
end -- if ALG.fixed_window
