-- ratewatch: sliding window counter (src/algorithm/sliding_window.rs, same
-- operations in the same order).
--
-- KEYS[i]   a hash {start = current window start (µs), count = units in it,
--           prev = units in the previous window}
-- ARGV      p1 = limit (units per window, integer)
--           p2 = window length (µs, integer)
--           p3 = unused
-- now       µs since epoch; cost = units requested (0 peeks)
-- decide    returns a step: allowed, remaining (units, float), reset_us,
--           retry_us, delay_us (always 0), ttl_us = until the next window ends
-- refund    decrements count by `cost` if the window is still the same

ALG.sliding_window = { type = 'hash' }

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

function ALG.sliding_window.decide(key, limit, window, _, now, cost)
  local start = now - imod(now, window)
  local curr, prev = 0, 0
  local stored = redis.call('HMGET', key, 'start', 'count', 'prev')
  if stored[1] and stored[2] and stored[3] then
    local s = tonumber(stored[1])
    -- A stored window later than `now` (the clock stepped back) stays
    -- current: time never runs a window backwards.
    if s >= start then
      start = s
      curr, prev = tonumber(stored[2]), tonumber(stored[3])
    elseif s + window == start then
      curr, prev = 0, tonumber(stored[2])
    end
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
    return { allowed = true, remaining = limit_f - (est + cost), reset = reset,
             retry = 0, delay = 0, ttl = start + 2 * window - now,
             start = start, count = curr, prev = prev }
  end
  local reset
  if curr > 0 then
    reset = start + 2 * window - now
  else
    reset = start + window - now
  end
  return { allowed = false, remaining = math.max(limit_f - est, 0), reset = reset,
           retry = sw_retry_after(limit, window, start, prev, curr, now, cost),
           delay = 0, ttl = start + 2 * window - now }
end

function ALG.sliding_window.write(key, step)
  redis.call('HSET', key, 'start', fmt(step.start), 'count', fmt(step.count),
             'prev', fmt(step.prev))
  expire_us(key, step.ttl)
  return {}
end

function ALG.sliding_window.refund(key, _, _, _, cost, start)
  local stored = redis.call('HMGET', key, 'start', 'count')
  if stored[1] and stored[2] and tonumber(stored[1]) == start then
    redis.call('HSET', key, 'count', fmt(sat_sub(tonumber(stored[2]), cost)))
  end
end
