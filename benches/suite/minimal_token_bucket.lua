-- The smallest useful token bucket: the ceiling ratewatch's own decide
-- script is compared with (benchmark only).
--
-- KEYS[1]  a hash {t = tokens, l = last refill, µs}
-- ARGV[1]  capacity (tokens)
-- ARGV[2]  refill per second (tokens)
-- ARGV[3]  cost (tokens)
-- Returns  { allowed (1/0), floor(tokens left) }
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cap = tonumber(ARGV[1])
local per_us = tonumber(ARGV[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 't', 'l')
local tokens = tonumber(b[1]) or cap
local last = tonumber(b[2]) or now
if now > last then
  tokens = math.min(cap, tokens + (now - last) * per_us)
end
local cost = tonumber(ARGV[3])
local allowed = tokens >= cost
if allowed then
  tokens = tokens - cost
  redis.call('HSET', KEYS[1], 't', tokens, 'l', now)
  redis.call('PEXPIRE', KEYS[1], math.ceil((cap - tokens) / per_us / 1000) + 1)
end
return { allowed and 1 or 0, math.floor(tokens) }
