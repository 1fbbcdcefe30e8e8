-- ratewatch: decide every limit of one request, atomically, all or nothing.
-- Loaded after common.lua and the six algorithm files (one script).
--
-- KEYS[i]        the key of limit i (all share one hash tag on a cluster)
-- ARGV[1]        now in µs since epoch, or '' to use the server's TIME
-- ARGV[2]        cost: units each limit is asked for (integer)
-- ARGV[3]        '1' to peek (decide, write nothing), else '0'
-- ARGV[4+5(i-1)] limit i: algorithm name (token_bucket, sliding_window,
--                sliding_log, fixed_window, gcra, leaky_bucket)
-- ARGV[5+5(i-1)] '1' if limit i is shadow (reported, never blocks)
-- ARGV[6..8+5(i-1)] p1, p2, p3: the algorithm's parameters (see its file)
--
-- Only if every non-shadow limit admits (and not peeking) is each admitting
-- limit's new state written, with an expiry of its step's TTL. A key holding
-- another algorithm's or an older layout's state decides as fresh and is
-- replaced by the write (see common.lua), instead of failing with WRONGTYPE
-- until it expires.
--
-- Returns { allowed (1/0), now (µs),
--           per limit i: { allowed (1/0), remaining (an integer, or the
--                          8 bytes of a double, big endian: see `exact`),
--                          reset_after_us, retry_after_us, delay_us,
--                          written (1/0), window start written (µs, or 0),
--                          { members added (sliding log) } } }

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local peek = ARGV[3] == '1'

local steps = {}
local allowed = true
for i = 1, #KEYS do
  local base = 4 + 5 * (i - 1)
  local alg = ALG[ARGV[base]]
  if not alg then
    return redis.error_reply('ratewatch: unknown algorithm ' .. tostring(ARGV[base]))
  end
  local step = alg.decide(KEYS[i], tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]),
                          tonumber(ARGV[base + 4]), now, cost)
  steps[i] = step
  if not step.allowed and ARGV[base + 1] ~= '1' then
    allowed = false
  end
end

local reply = { allowed and 1 or 0, now }
for i = 1, #KEYS do
  local step = steps[i]
  local written, added = 0, {}
  if allowed and not peek and step.allowed then
    added = ALG[ARGV[4 + 5 * (i - 1)]].write(KEYS[i], step)
    written = 1
  end
  reply[#reply + 1] = { step.allowed and 1 or 0, exact(step.remaining), step.reset,
                        step.retry, step.delay, written, step.start or 0, added }
end
return reply
