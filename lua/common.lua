-- ratewatch: helpers shared by every algorithm file (loaded first).
--
-- Every number is a Lua double. Times are integer microseconds since the
-- Unix epoch (below 2^53, so exact).
--
-- State layout: every limit but the sliding log keeps ONE string per key,
-- written with its expiry in the same SET. GCRA and the leaky bucket keep a
-- decimal integer (Redis stores it as an integer, no string at all); the
-- token bucket and the window counters keep fixed-width binary records
-- (`struct.pack`, big endian) whose length tells them apart:
--
--   token bucket     15 bytes  '>dI7'     tokens (the double's exact bits), last (µs)
--   fixed window     12 bytes  '>I7I5'    start (µs), count
--   sliding window   11 bytes  '>I7I2I2'  start (µs), count, prev (both < 65536)
--                    17 bytes  '>I7I5I5'  the same, larger counts
--
-- A value of any other type or length (an older layout, or another
-- algorithm under the same key) reads as absent: the limit decides as a
-- fresh one and its next write replaces the value.

local ALG = {}

-- Redis runs a script's whole body on every call, so every function or
-- table defined here is built again per decision: common.lua defines only
-- what several algorithms share, and each algorithm file defines its
-- functions only when the call names it.
local floor, fmod, format = math.floor, math.fmod, string.format

-- The algorithms this call names. `ENTRY` (the script's first line, set by
-- src/store/script.rs) says where: decide.lua names them at ARGV[4], [9],
-- [14], ...; refund.lua (rare) somewhere among its arguments, so it marks
-- every argument (no parameter or member is an algorithm name).
local NEED = {}
if ENTRY == 'decide' then
  for i = 4, #ARGV, 5 do NEED[ARGV[i]] = true end
else
  for i = 1, #ARGV do NEED[ARGV[i]] = true end
end

-- The string held at `key`, or nil when it is absent or of another type.
local function get_string(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'string' then return v end
  return nil
end

-- Saturating subtraction of unsigned integers.
local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

-- Writes `value` at `key` with an expiry of `ttl_us` in whole milliseconds,
-- rounded up so a key never dies before its state stops mattering, and at
-- least 1 ms (PX 0 is refused), in one command.
local function set_px(key, value, ttl_us)
  local ms = math.ceil(ttl_us / 1000)
  if ms < 1 then ms = 1 end
  redis.call('SET', key, value, 'PX', format('%d', ms))
end
