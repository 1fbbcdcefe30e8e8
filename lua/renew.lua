-- ratewatch: push one request's in-flight deadlines on (a renewal).
--
-- KEYS[i]       the in-flight sets the request holds a slot in (one tag)
-- ARGV[1]       the holder id
-- ARGV[2]       now in µs since epoch, or '' to use the server's TIME
-- ARGV[2 + i]   the hold timeout of KEYS[i] (µs)
--
-- A holder still live gets deadline now + hold (ZADD XX: never re-added)
-- and the key lives at least a hold timeout past it (see concurrency.lua). A holder already past its
-- deadline, or gone, is not taken again: its slot may have been given to
-- another request. Returns how many were gone (renewals failed).
local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local gone = 0
for i = 1, #KEYS do
  local score = redis.pcall('ZSCORE', KEYS[i], ARGV[1])
  if type(score) == 'string' and tonumber(score) > now then
    local hold = tonumber(ARGV[2 + i])
    redis.call('ZADD', KEYS[i], 'XX', string.format('%d', now + hold), ARGV[1])
    local ms = math.ceil(2 * hold / 1000)
    redis.call('PEXPIRE', KEYS[i], string.format('%d', ms), 'GT')
  else
    gone = gone + 1
  end
end
return gone
