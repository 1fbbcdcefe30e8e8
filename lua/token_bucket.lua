-- ratewatch: token bucket (src/algorithm/token_bucket.rs, same operations
-- in the same order).
--
-- KEYS[i]   a hash {tokens = float ('%.17g'), last = µs since epoch}
-- ARGV      p1 = capacity (tokens, integer)
--           p2 = refill_per_second (tokens per second, float)
--           p3 = unused
-- now       µs since epoch; cost = units requested (0 peeks)
-- decide    returns a step: allowed, remaining (tokens), reset_us,
--           retry_us, delay_us (always 0), ttl_us = time to refill to full
-- refund    adds `cost` tokens back, capped at capacity; keeps the expiry

ALG.token_bucket = {}

function ALG.token_bucket.decide(key, capacity, refill_per_second, _, now, cost)
  local cap = capacity
  local per_us = refill_per_second / 1000000
  local tokens, last = cap, now
  local stored = redis.call('HMGET', key, 'tokens', 'last')
  if stored[1] and stored[2] then
    tokens = tonumber(stored[1])
    last = tonumber(stored[2])
  end
  -- A clock that steps back refills nothing; it never drains either.
  if now > last then
    tokens = math.min(cap, tokens + (now - last) * per_us)
  end
  last = math.max(last, now)
  local need = cost
  if tokens >= need then
    local left = tokens - need
    local reset = ceil_us((cap - left) / per_us)
    return { allowed = true, remaining = left, reset = reset, retry = 0,
             delay = 0, ttl = reset, tokens = left, last = last }
  end
  local reset = ceil_us((cap - tokens) / per_us)
  return { allowed = false, remaining = tokens, reset = reset,
           retry = math.max(ceil_us((need - tokens) / per_us), 1),
           delay = 0, ttl = reset }
end

function ALG.token_bucket.write(key, step)
  redis.call('HSET', key, 'tokens', fmt(step.tokens), 'last', fmt(step.last))
  expire_us(key, step.ttl)
  return {}
end

function ALG.token_bucket.refund(key, capacity, _, _, cost, _)
  local tokens = tonumber(redis.call('HGET', key, 'tokens'))
  if tokens then
    redis.call('HSET', key, 'tokens', fmt(math.min(capacity, tokens + cost)))
  end
end
