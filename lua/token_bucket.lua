-- ratewatch: token bucket (src/algorithm/token_bucket.rs, same operations
-- in the same order).
--
-- KEYS[i]   a string of 20 bytes, struct '>dI7I5': tokens (the double's
--           exact bits), last refill (µs since epoch), the capacity it was
--           written with (under another, what it was short of full is
--           kept); see common.lua
-- ARGV      p1 = capacity (tokens, integer)
--           p2 = refill_per_second (tokens per second, float)
--           p3 = unused
-- now       µs since epoch; cost = units requested (0 peeks); decide gets
--           p1..p3 as ARGV strings, refund as numbers
-- decide    returns (common.lua): allowed, remaining (tokens), reset_us,
--           retry_us, ttl_us = time to refill to full
-- refund    adds `cost` tokens back, capped at capacity; keeps the expiry

if ALG.token_bucket then -- defined only for calls that name it (common.lua)
local TB_LAYOUT, TB_BYTES = '>dI7I5', 20

-- The stored tokens, last refill and capacity written with, or nil; the
-- layout before the capacity reads as written under `capacity`.
local function tb_read(key, capacity)
  local stored = redis.pcall('GET', key)
  if stored then
    local n = #stored
    if n == TB_BYTES then return struct.unpack(TB_LAYOUT, stored) end
    if n == 15 then
      local tokens, last = struct.unpack('>dI7', stored)
      return tokens, last, capacity
    end
  end
end

-- `ceil_us` of src/algorithm/mod.rs: non-positive becomes 0, else ceil.
local function ceil_us(x)
  if x <= 0 then return 0 end
  return math.ceil(x)
end

-- Tokens held at `now` by a bucket that held `tokens` at `last`. A clock
-- that steps back refills nothing; it never drains either. Once the time to
-- refill to full has passed the bucket is exactly full, as a fresh key is.
local function tb_refill(cap, per_us, tokens, last, now)
  if now <= last then
    return tokens
  end
  local elapsed = now - last
  if elapsed >= ceil_us((cap - tokens) / per_us) then
    return cap
  end
  return math.min(cap, tokens + elapsed * per_us)
end

local function tb_decide(key, capacity, refill_per_second, _, now, cost)
  capacity, refill_per_second = tonumber(capacity), tonumber(refill_per_second)
  local cap = capacity
  local per_us = refill_per_second / 1000000
  local stored_tokens, stored_last = cap, now
  local t, l, was = tb_read(key, capacity)
  if t then
    stored_tokens, stored_last = t, l
    -- Under another capacity the bucket keeps what it was short of full.
    if was ~= capacity then
      stored_tokens = math.max(t + (cap - was), 0)
    end
  end
  local tokens = tb_refill(cap, per_us, stored_tokens, stored_last, now)
  local last = math.max(stored_last, now)
  -- Behind a refill time later than `now` (the clock stepped back) the
  -- bucket refills only from then on: the time to full and the TTL count
  -- from there.
  local lag = last - now
  local need = cost
  if tokens >= need then
    local left = tokens - need
    local reset = lag + ceil_us((cap - left) / per_us)
    return true, left, reset, 0, reset, struct.pack(TB_LAYOUT, left, last, capacity)
  end
  local reset = lag + ceil_us((cap - tokens) / per_us)
  -- The closed form, corrected by at most a few microseconds so the request
  -- passes at exactly now + retry and not a microsecond earlier.
  local function passes(wait)
    return tb_refill(cap, per_us, stored_tokens, stored_last, now + wait) >= need
  end
  local retry = lag + math.max(ceil_us((need - tokens) / per_us), 1)
  for _ = 1, 4 do
    if not passes(retry) then
      retry = retry + 1
    elseif retry > 1 and passes(retry - 1) then
      retry = retry - 1
    else
      break
    end
  end
  return false, tokens, reset, retry, reset
end

ALG.token_bucket = tb_decide

if ENTRY == 'refund' then
function REFUND.token_bucket(key, capacity, _, _, cost, _)
  local tokens, last, was = tb_read(key, capacity)
  if tokens then
    redis.call('SET', key, struct.pack(TB_LAYOUT, math.min(was, tokens + cost), last, was),
               'KEEPTTL')
  end
end
end -- if ENTRY == 'refund'
end -- if ALG.token_bucket
