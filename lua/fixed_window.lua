-- ratewatch: fixed window (src/algorithm/fixed_window.rs, same operations
-- in the same order).
--
-- KEYS[i]   a string of 19 bytes, struct '>I7I5I7': window start (µs),
--           units admitted in it, when the latest was admitted (µs); see
--           common.lua
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
local FW_LAYOUT, FW_BYTES = '>I7I5I7', 19

-- The stored window start, count and latest admission, or nil; the layout
-- before `last` reads as last = start.
local function fw_read(key)
  local stored = redis.pcall('GET', key)
  if stored then
    local n = #stored
    if n == FW_BYTES then
      return struct.unpack(FW_LAYOUT, stored)
    end
    if n == 12 then
      local s, c = struct.unpack('>I7I5', stored)
      return s, c, s
    end
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
  local _, c, l = fw_read(key)
  if l then
    local held = l - fmod(l, window)
    if held >= start then
      start, count, last = held, c, math.max(l, now)
    end
  end
  local reset = start + window - now
  if count + cost <= limit then
    return true, limit - count - cost, reset, 0, reset,
           struct.pack(FW_LAYOUT, start, count + cost, last), 2, start
  end
  return false, sat_sub(limit, count), reset, reset, reset
end

ALG.fixed_window = fw_decide

if ENTRY == 'refund' then
function REFUND.fixed_window(key, _, _, _, cost, start)
  local s, c, l = fw_read(key)
  if s and s == start then
    redis.call('SET', key, struct.pack(FW_LAYOUT, s, sat_sub(c, cost), l), 'KEEPTTL')
  end
end
end -- if ENTRY == 'refund'
end -- if ALG.fixed_window
