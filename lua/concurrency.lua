-- ratewatch: in-flight limit (src/algorithm/concurrency.rs, same
-- operations in the same order).
--
-- KEYS[i]   a sorted set of holders: member = holder id (random per
--           process plus a counter, never derived from a key), score = the
--           holder's deadline (µs since epoch, on this server's clock)
-- ARGV      p1 = limit (requests in flight at once, integer)
--           p2 = hold timeout (µs, integer)
--           p3 = the holder id, or '' to check without taking a slot
-- now       µs since epoch; cost = units requested: any cost above 0
--           takes ONE slot, 0 (a peek) takes none
-- decide    reads only (ZCOUNT, ZREVRANGE); returns (common.lua): allowed,
--           remaining (slots), reset_us, retry_us (1 s when refused: slots
--           come back when requests end), ttl_us = one hold timeout past
--           the latest deadline (or past a hold from now)
-- write     drops the holders past their deadline (the count is returned
--           and reported as expired holders), adds the holder with
--           deadline now + hold, and sets the key's expiry
-- Release and renewal are their own scripts (lua/release.lua,
-- lua/renew.lua).

if ALG.concurrency then -- defined only for calls that name it (common.lua)
local cc_write

function ALG.concurrency(key, limit, hold, holder, now, cost)
  limit, hold = tonumber(limit), tonumber(hold)
  local live = redis.pcall('ZCOUNT', key, '(' .. format('%d', now), '+inf')
  -- A key of another type reads as no holder; writing replaces it.
  local foreign = type(live) ~= 'number'
  if foreign then live = 0 end
  local newest = now + hold
  if live > 0 then
    local top = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
    newest = math.max(newest, tonumber(top[2]))
  end
  -- One hold past the latest deadline: an expired holder is still there
  -- for the next write to drop and count.
  local ttl = newest - now + hold
  local takes = 0
  if cost > 0 then takes = 1 end
  if live + takes <= limit then
    if takes == 1 and holder ~= '' then
      return true, limit - live - takes, 0, 0, ttl, cc_write, 4,
             { holder = holder, deadline = now + hold, now = now, foreign = foreign }
    end
    return true, limit - live - takes, 0, 0, ttl
  end
  return false, sat_sub(limit, live), 1000000, 1000000, ttl
end

function cc_write(key, ttl, st)
  if st.foreign then redis.call('DEL', key) end
  local expired = redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', st.now))
  redis.call('ZADD', key, format('%d', st.deadline), st.holder)
  local ms = math.ceil(ttl / 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, format('%d', ms))
  return expired
end
end -- if ALG.concurrency
