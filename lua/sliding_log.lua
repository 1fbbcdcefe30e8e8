-- ratewatch: sliding window log (src/algorithm/sliding_log.rs, same
-- operations in the same order).
--
-- KEYS[i]   a sorted set, one member per admitted unit: score = admission
--           time (µs since epoch), member = '<time>:<n>' with n the set's
--           size before the unit was added (skipping a member still taken),
--           so two units admitted in one microsecond are two members
-- ARGV      p1 = limit (units per window, integer)
--           p2 = window length (µs, integer)
--           p3 = unused
-- now       µs since epoch; cost = units requested (0 peeks); decide gets
--           p1..p3 as ARGV strings, refund as numbers
-- decide    reads only (ZCOUNT, ZRANGEBYSCORE); returns (common.lua): allowed,
--           remaining (units), reset_us, retry_us,
--           ttl_us = one window past the newest entry (or `now`)
-- write     drops entries that left the window, adds `cost` members and
--           returns them, so a refund can remove exactly those
-- refund    ZREM of the members the decision added

if ALG.sliding_log then -- defined only for calls that name it (common.lua)
-- An integer as the decimal string that parses back to it.
local function fmt(x)
  return format('%d', x)
end

-- The score of the `index`-th (0-based) entry still in the window.
local function sl_score_at(key, horizon, index, reverse)
  local r
  if reverse then
    r = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(' .. fmt(horizon),
                   'WITHSCORES', 'LIMIT', index, 1)
  else
    r = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(horizon), '+inf',
                   'WITHSCORES', 'LIMIT', index, 1)
  end
  return tonumber(r[2])
end

local sl_write

function ALG.sliding_log(key, limit, window, _, now, cost)
  limit, window = tonumber(limit), tonumber(window)
  local horizon = sat_sub(now, window)
  local count = redis.pcall('ZCOUNT', key, '(' .. fmt(horizon), '+inf')
  -- A key of another type (another algorithm's string) reads as an empty
  -- log; writing replaces it.
  local foreign = type(count) ~= 'number'
  if foreign then count = 0 end
  -- Entries later than `now` (the clock stepped back) still count, and the
  -- key lives until the newest of them leaves the window.
  local newest = now
  if count > 0 then newest = math.max(now, sl_score_at(key, horizon, 0, true)) end
  local ttl = newest + window - now
  if count + cost <= limit then
    local reset = 0
    if count + cost > 0 then
      local oldest = now
      if count > 0 then
        oldest = sl_score_at(key, horizon, 0, false)
        -- After a step back the new entries may be the oldest.
        if cost > 0 then oldest = math.min(oldest, now) end
      end
      reset = oldest + window - now
    end
    return true, limit - count - cost, reset, 0, ttl, sl_write, 3,
           { horizon = horizon, cost = cost, now = now, foreign = foreign }
  end
  -- The request passes once `count + cost - limit` of the oldest entries
  -- have left the window.
  local must_expire = count + cost - limit
  local at = not foreign and sl_score_at(key, horizon, must_expire - 1, false)
  local retry = window
  if at then retry = at + window - now end
  local reset = 0
  if count > 0 then reset = sl_score_at(key, horizon, 0, true) + window - now end
  return false, sat_sub(limit, count), reset, math.max(retry, 1), ttl
end

function sl_write(key, ttl, state)
  if state.foreign then redis.call('DEL', key) end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(state.horizon))
  local added = {}
  local n = redis.call('ZCARD', key)
  local stamp = fmt(state.now)
  for _ = 1, state.cost do
    local member = stamp .. ':' .. n
    while redis.call('ZSCORE', key, member) do
      n = n + 1
      member = stamp .. ':' .. n
    end
    redis.call('ZADD', key, stamp, member)
    added[#added + 1] = member
    n = n + 1
  end
  local ms = math.ceil(ttl / 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, fmt(ms))
  return added
end

if ENTRY == 'refund' then
function REFUND.sliding_log(key, _, _, _, _, _, members)
  if #members > 0 then
    -- A key of another type holds none of them.
    redis.pcall('ZREM', key, unpack(members))
  end
end
end -- if ENTRY == 'refund'
end -- if ALG.sliding_log
