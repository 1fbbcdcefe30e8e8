-- ratewatch: GCRA (src/algorithm/gcra.rs, same operations in the same
-- order). The leaky bucket (lua/leaky_bucket.lua) is this meter with a
-- maximum delay.
--
-- KEYS[i]   a string of 12 bytes, struct '>I7I5': the theoretical arrival
--           time (µs since epoch) and the interval it was reached with
--           (under another, the units queued ahead are kept, re-timed);
--           a decimal integer TAT (the layout before) reads as reached
--           with the current interval (see common.lua)
-- ARGV      p1 = emission interval (µs per unit, integer, rounded up by
--                `interval_us` in src/algorithm/mod.rs)
--           p2 = burst (units at once, integer)
--           p3 = maximum delay (µs; 0 for GCRA, which never delays)
-- now       µs since epoch; cost = units requested (0 peeks); decide gets
--           p1..p3 as ARGV strings, refund as numbers
-- decide    returns (common.lua): allowed, remaining (units), reset_us,
--           retry_us, delay_us, ttl_us = TAT - now
-- refund    moves the TAT back by cost × interval; keeps the expiry

if ALG.gcra or ALG.leaky_bucket then -- leaky_bucket reuses it; see common.lua
-- Integer division of non-negative integers below 2^53.
local function idiv(a, b)
  return floor(a / b)
end

local GC_LAYOUT, GC_BYTES = '>I7I5', 12

-- The stored TAT and the interval it was reached with, or nil.
local function gcra_read(key, interval)
  local stored = redis.pcall('GET', key)
  if type(stored) == 'string' and #stored == GC_BYTES then
    return struct.unpack(GC_LAYOUT, stored)
  end
  -- A value that is not a number is another layout's: absent.
  local tat = tonumber(stored)
  if tat then return tat, interval end
end

local function gcra_decide(key, interval, burst, max_delay, now, cost)
  interval, burst, max_delay = tonumber(interval), tonumber(burst), tonumber(max_delay)
  local tat, was = gcra_read(key, interval)
  if tat then
    -- Reached at another interval (a reload): the same units queued
    -- ahead, re-timed, rounded up (retimed in src/algorithm/gcra.rs).
    if was ~= interval and tat > now then
      tat = now + math.ceil((tat - now) * interval / was)
    end
    tat = math.max(tat, now)
  else
    tat = now
  end
  local window = burst * interval
  local queued = tat - now
  local new_tat = tat + cost * interval
  local used = new_tat - now
  local shaping_too_long = max_delay > 0 and queued > max_delay
  if used <= window and not shaping_too_long then
    local remaining, value = idiv(window - used, interval), struct.pack(GC_LAYOUT, new_tat, interval)
    -- A shaped request waits for the queue ahead of it.
    if max_delay > 0 and queued > 0 then
      return true, remaining, used, 0, used, value, 1, queued
    end
    return true, remaining, used, 0, used, value
  end
  -- Both must hold at the retry time: room in the window and, when
  -- shaping, a queue ahead no longer than the maximum delay.
  local retry = sat_sub(used, window)
  if max_delay > 0 then
    retry = math.max(retry, sat_sub(queued, max_delay))
  end
  return false, idiv(sat_sub(window, queued), interval), queued, math.max(retry, 1), queued
end

ALG.gcra = gcra_decide

if ENTRY == 'refund' then
function REFUND.gcra(key, interval, _, _, cost, _)
  local tat, was = gcra_read(key, interval)
  if tat then
    redis.call('SET', key, struct.pack(GC_LAYOUT, sat_sub(tat, cost * was), was), 'KEEPTTL')
  end
end
end -- if ENTRY == 'refund'
end -- if ALG.gcra or ALG.leaky_bucket
