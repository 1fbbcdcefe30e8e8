-- ratewatch: fixed window (src/algorithm/fixed_window.rs, same operations
-- in the same order).
--
-- KEYS[i]   a hash {start = window start (µs), count = units admitted, prev = 0}
-- ARGV      p1 = limit (units per window, integer)
--           p2 = window length (µs, integer)
--           p3 = unused
-- now       µs since epoch; cost = units requested (0 peeks)
-- decide    returns a step: allowed, remaining (units), reset_us,
--           retry_us, delay_us (always 0), ttl_us = until the window ends
--           (a stored window later than `now` stays current)
-- refund    decrements count by `cost` if the window is still the same

ALG.fixed_window = { type = 'hash' }

-- A stored window that starts after `now` (the clock stepped back) is still
-- the current one, with its count: time never runs a window backwards.
function ALG.fixed_window.decide(key, limit, window, _, now, cost)
  local start = now - imod(now, window)
  local count = 0
  local stored = redis.call('HMGET', key, 'start', 'count')
  if stored[1] and stored[2] and tonumber(stored[1]) >= start then
    start = tonumber(stored[1])
    count = tonumber(stored[2])
  end
  local reset = start + window - now
  if count + cost <= limit then
    return { allowed = true, remaining = limit - count - cost, reset = reset,
             retry = 0, delay = 0, ttl = reset,
             start = start, count = count + cost, prev = 0 }
  end
  return { allowed = false, remaining = sat_sub(limit, count), reset = reset,
           retry = reset, delay = 0, ttl = reset }
end

function ALG.fixed_window.write(key, step)
  redis.call('HSET', key, 'start', fmt(step.start), 'count', fmt(step.count),
             'prev', fmt(step.prev))
  expire_us(key, step.ttl)
  return {}
end

function ALG.fixed_window.refund(key, _, _, _, cost, start)
  local stored = redis.call('HMGET', key, 'start', 'count')
  if stored[1] and stored[2] and tonumber(stored[1]) == start then
    redis.call('HSET', key, 'count', fmt(sat_sub(tonumber(stored[2]), cost)))
  end
end
